"""Which way a Prometheus store is read when neither --fleet nor --per-gpu says: fleet mode
where the store holds burnrate's roll-ups over the window's data, every GPU's series
elsewhere (docs/fleet-mode.md). Deciding costs a few small requests: the ruler's count of
reporting GPUs over the window (one series per node), the GPU series at the window's two
edges, and the rules API for the roll-ups' interval."""
from __future__ import annotations

from dataclasses import dataclass

from ..grid.frames import Window
from ..sources.prometheus import PrometheusSource
from ..sources.timeparse import format_time
from .mode import bucket_for
from .rollups import RATE_WINDOW_S, REPORTING, RollUpReader

READ_ROLLUPS = "read the roll-ups (fleet mode)"
READ_EVERY_GPU = "read every GPU's series"


@dataclass(frozen=True)
class Choice:
    fleet: bool
    note: str       # the report's first note: which way, and why


def choose(source: PrometheusSource, window: Window, forced_by: str | None = None,
           interval_s: float | None = None) -> Choice:
    """`forced_by` is the flag that decided (--fleet, or one that reads per GPU), None for the store to."""
    if forced_by == "--fleet":
        return Choice(True, f"{READ_ROLLUPS}, as --fleet asks")
    if forced_by is not None:
        return Choice(False, f"{READ_EVERY_GPU}, as {forced_by} asks")
    reader = RollUpReader(source, interval_s=interval_s)
    reported = reader.reported(window)
    if reported is None:
        return Choice(False, f"{READ_EVERY_GPU}: the store holds no burnrate roll-ups ({REPORTING}) in the "
                             "window; where its ruler keeps them (docs/fleet-mode.md) they are read instead")
    data = source.data_range(window, reported)
    if data is None:    # no GPU sample at all: the per-GPU path says where the store's data is
        return Choice(False, f"{READ_EVERY_GPU}: the window holds roll-ups but no GPU samples")
    # reported() ends a step and the roll-ups' 5-minute window before the last count, and
    # fleet mode leaves a bucket at each edge unread (analyzer.fleet.rollups._coverage).
    slack = bucket_for(source, window, reader.interval[0]) + source.step_for(window) + RATE_WINDOW_S
    if reported.start <= data.start + slack and reported.end >= data.end - slack:
        return Choice(True, f"{READ_ROLLUPS}: the store's ruler kept them over the window; "
                            "--per-gpu reads every GPU's series")
    # Fleet mode would read every node per GPU over the whole window where its roll-ups miss
    # a stretch: the same answer as the per-GPU path, with the roll-ups read besides.
    return Choice(False, f"{READ_EVERY_GPU}: burnrate's roll-ups cover {format_time(reported.start)} to "
                         f"{format_time(reported.end)} of GPU data from {format_time(data.start)} to "
                         f"{format_time(data.end)}, and fleet mode would read every node they miss per GPU over the "
                         "whole window; --fleet reads them all the same")
