"""Where frames come from: a Prometheus server or a local recording.

Both sources yield the same `Frames` for a window (analyzer.grid.frames), so every
detector and the cost model work on either.
"""
from __future__ import annotations

from .common import missing_signals
from .prometheus import PrometheusError, PrometheusSource, selector
from .recording import RecordingSource

__all__ = ["PrometheusError", "PrometheusSource", "RecordingSource", "missing_signals", "selector"]
