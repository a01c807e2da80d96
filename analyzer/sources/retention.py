"""Where a store's GPU data begins: a window that reaches past the store's retention
says so (docs/retention.md), rather than reading as a fleet that had no GPUs then."""
from __future__ import annotations

import time

from ..grid.frames import Window
from .promhttp import PrometheusError
from .prometheus import PrometheusSource
from .timeparse import format_time

GUIDE = "docs/retention.md"


def store_retention(source: PrometheusSource) -> str | None:
    """The retention Prometheus states ("15d", "15d or 1GiB"); None where the store has no
    runtimeinfo (VictoriaMetrics, Thanos, Mimir)."""
    try:
        return source.runtime_info().get("storageRetention") or None
    except PrometheusError:
        return None


def data_begins(source: PrometheusSource, window: Window) -> float | None:
    """Where the store's GPU data begins, where that is after the window's start: the
    window's first GPU sample, when the store holds none in the window's length before it
    (a gap of the fleet's own is not the store's beginning). None where the start is held.
    The store's range of the window is the one the read found (PrometheusSource keeps it)."""
    held = source.data_range(window)
    if held is None or held.start <= window.start + source.step_for(window):
        return None
    length = f"{max(int(window.end - window.start), 1)}s"
    earlier = source.query(f"count({source.gpu_present(length)})", window.start)
    return None if earlier else held.start


def first_data_after(source: PrometheusSource, window: Window, now: float | None = None) -> float | None:
    """The first GPU sample after a window that holds none, up to now."""
    now = time.time() if now is None else now
    if now <= window.end:
        return None
    held = source.data_range(Window(window.end, now))
    return None if held is None else held.start


def retention_note(source: PrometheusSource, window: Window) -> str | None:
    """One line where the window starts before the store's data, else None."""
    begins = data_begins(source, window)
    if begins is None:
        return None
    retention = store_retention(source)
    return (f"the store holds data from {format_time(begins)}"
            + (f" (retention {retention})" if retention else "")
            + f": the window's first {duration_words(begins - window.start)} are not in it; see {GUIDE}")


def duration_words(seconds: float) -> str:
    """A span as people say it: days from two days on, else hours, else minutes."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} hours"
    return f"{max(seconds / 60, 1):.0f} minutes"
