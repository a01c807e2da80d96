"""Frames from a local recording (`burnrate agent --record`, `burnrate simulate`)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from burnrate.exporter.recording import TABLES

from ..grid.frames import RANK_COUNTERS, RANK_LATEST, Frames, Window
from .recording_tables import Span, check, damage, empty_table, load_table, placed_rows, read_times, segments
from ..grid.holding import STALENESS_S, hold, series_intervals
from .allocation import SHARE_RATIO
from .common import DEFAULT_STEP_S, Progress, is_simulated, missing_signals, within
from ..grid.resample import grid_points, step_for
from ..grid.views import last_counts

SIMULATED_MARKER = "simulated.json"
STEP_SAMPLE_ROWS = 100_000   # enough rows to see many sample times, cheap to read
LOADERS = min(4, os.cpu_count() or 1)


def sample_interval(root: str, window: Window) -> float:
    """The sample interval within a window: the shortest of its series' own intervals
    (each the median gap between that series' samples) in the gpu (else node) table,
    from the first rows of each segment there. The shortest, as Prometheus' step is the
    shortest scrape interval: a node sampled every second beside a fleet sampled every
    15 s must not have fifteen samples fall into one step, whatever the window."""
    for table in ("gpu", "node"):
        intervals = [interval for segment in segments(root, table)
                     if (interval := _finest_series_interval(segment, window)) is not None]
        if intervals:
            return min(intervals)
    return DEFAULT_STEP_S


def _finest_series_interval(segment: str, window: Window) -> float | None:
    rows = placed_rows(segment)
    if not rows:
        return None
    checked = read_times(segment, rows)
    lo = int(np.searchsorted(checked.t, window.start, "left"))
    hi = min(int(np.searchsorted(checked.t, window.end, "right")), lo + STEP_SAMPLE_ROWS)
    keys = np.fromfile(os.path.join(segment, "key.u4"), dtype="<u4", count=hi - lo, offset=lo * 4)
    times = np.array(checked.t[lo:hi])
    if checked.dropped is not None:
        keys, times = keys[~checked.dropped[lo:hi]], times[~checked.dropped[lo:hi]]
    codes = np.unique(keys, return_inverse=True)[1]
    order = np.lexsort((times, codes))
    # Each series' own interval, as holding measures it (missed samples and outages aside).
    intervals = series_intervals(times[order], codes[order], np.ones(len(order)), STALENESS_S)
    return float(np.nanmin(intervals)) if np.isfinite(intervals).any() else None


def time_range(root: str) -> Window:
    """First and last sample time over every table."""
    ends = []
    for table in TABLES:
        for segment in segments(root, table):
            rows = placed_rows(segment)
            checked = read_times(segment, rows) if rows else None
            if checked is not None and checked.last >= checked.first > 0:
                ends += [checked.first, checked.last]
    return Window(float(min(ends)), float(max(ends))) if ends else Window(0.0, 0.0)


class RecordingSource:
    def __init__(self, root: str) -> None:
        check(root)
        self.root = root

    def frames(self, window: Window | None = None, columns: Mapping[str, Sequence[str]] | None = None,
               progress: Progress | None = None) -> Frames:
        """The tables within `window` (inclusive; the whole recording when None), at
        the window's step (analyzer.grid.resample). `columns` names the value
        columns to read per table; tables it leaves out come back empty.
        `progress(done, total)` is told how many rows are read so far."""
        data = time_range(self.root)
        window = within(window, data, sample_interval(self.root, window or data))
        native = sample_interval(self.root, window)
        step = step_for(window, native)
        reducing = step > native * 1.01
        if reducing:
            first, points = grid_points(window, step)
            span = Span(window.start, first + (points - 1) * step, first, step)
        else:
            step, span = native, Span(window.start, window.end)
        wanted = [name for name in TABLES if columns is None or name in columns]
        sizes = {name: sum(placed_rows(s) for s in segments(self.root, name)) for name in wanted}
        tables = {name: empty_table(name) for name in TABLES}
        done = 0
        # numpy reads and reduces without the GIL: tables load side by side, largest first.
        with ThreadPoolExecutor(max_workers=LOADERS) as pool:
            loading = {pool.submit(load_table, self.root, name, _wanted(name, columns), span,
                                   RANK_LATEST if name == "rank" else ()): name
                       for name in sorted(wanted, key=sizes.get, reverse=True)}
            for future in as_completed(loading):
                name = loading[future]
                tables[name] = future.result()
                done += sizes[name]
                if progress:
                    progress(done, sum(sizes.values()))
        # The agent writes the share ratio, the best allocation signal there is.
        tables["alloc"]["signal"] = pd.Categorical.from_codes(np.zeros(len(tables["alloc"]), np.int8), [SHARE_RATIO])
        gpu, rank, node = tables["gpu"], tables["rank"], tables["node"]
        simulated = os.path.exists(os.path.join(self.root, SIMULATED_MARKER)) or is_simulated(gpu)
        missing = missing_signals(gpu, rank, node) + tuple(damage(self.root, window.start, window.end))
        counted = [c for c in RANK_COUNTERS if c in rank.columns]
        # The last counts before the window's first point: a sample before its step, or before the window.
        before = span.first - step if reducing else np.nextafter(window.start, -np.inf)
        return hold(Frames(window=window, step_s=step, missing=missing,
                           simulated=simulated, rows_end_steps=reducing, **tables,
                           rank_before=last_counts(load_table(self.root, "rank", counted,
                                                              Span(before - STALENESS_S, before))) if counted else None))


def _wanted(table: str, columns: Mapping[str, Sequence[str]] | None) -> list[str]:
    every = list(TABLES[table][1])
    if columns is None:
        return every
    return [c for c in every if c in columns.get(table, ())]
