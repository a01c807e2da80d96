"""One resolution for a window, whichever source reads it.

Prometheus answers a query_range with at most 11,000 points per series, so a week
comes at 55 s steps. A recording read for the same window is reduced to the same
steps in the same way: the point at time g holds the samples in (g - step, g],
reduced with the function of that column's PromQL query (`avg`, `last`, `max`,
`min` over time). Both sources then give equal frames, and a week of a thousand
GPUs sampled every 15 s fits in memory.
"""
from __future__ import annotations

import math

import numpy as np

from burnrate.exporter import catalog as C

from .frames import Window

MAX_POINTS = 11_000       # Prometheus refuses a query_range of more points per series

_GAUGE_FIELDS = frozenset(s.field for s in C.CATALOG if s.source == C.GPU_FIELD and s.type == C.GAUGE)
_GPU_REDUCTIONS = {"up": "min", "throttle_reasons": "max"}   # a lost GPU or a throttle is never averaged away


def step_for(window: Window, min_step_s: float) -> float:
    """The step of a window: the sample interval, or coarser where the window would
    need more than MAX_POINTS points."""
    return float(max(min_step_s, math.ceil((window.end - window.start) / MAX_POINTS)))


def grid_points(window: Window, step: float) -> tuple[float, int]:
    """The first point (a multiple of step inside the window) and how many there are."""
    first, last = math.ceil(window.start / step) * step, math.floor(window.end / step) * step
    return first, max(int(round((last - first) / step)) + 1, 0) if last >= first else 0


def reduction(table: str, column: str) -> str:
    """The `*_over_time` function that reduces a column's samples within a step.

    Device gauges are averaged, counters and the trainers' reports keep their last
    value (a gauge a trainer reports is the state at its last step, not a level)."""
    if table == "gpu":
        # The columns beyond the catalog's gauges are counters and the last XID seen.
        return _GPU_REDUCTIONS.get(column, "avg" if column in _GAUGE_FIELDS else "last")
    if table == "node":
        return "avg"
    return "last"


def reduce_rows(t: np.ndarray, series: np.ndarray, n_series: int, values: dict[str, np.ndarray], table: str,
                first: float, step: float) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Time-sorted rows of series 0..n_series-1 reduced to one row per (series,
    point), in time order, with the count of samples behind each in `sample_count`.
    Rows must lie after `first - step`."""
    if not len(t):
        return t, series, values
    p0 = int(np.ceil((t[0] - first) / step))
    p1 = int(np.ceil((t[-1] - first) / step))
    # Rows are sorted, so each point's rows are one stretch: found by binary search.
    bounds = np.searchsorted(t, first + np.arange(p0, p1 + 1) * step, "right")
    per_point = np.diff(bounds, prepend=0)
    group = np.repeat(np.arange(p1 - p0 + 1, dtype=np.int64) * n_series, per_point) + series
    size = (p1 - p0 + 1) * n_series                   # time-major, so the output is time-sorted
    count = np.bincount(group, minlength=size)
    held = np.flatnonzero(count)
    last = np.full(size, -1, np.int64)
    np.maximum.at(last, group, np.arange(len(group)))
    out = {}
    for name, v in values.items():
        how = reduction(table, name)
        if how == "last":
            out[name] = v[last[held]]
        elif how == "avg":
            total = np.bincount(group, weights=v, minlength=size)
            out[name] = (total[held] / count[held]).astype(v.dtype)
        else:
            # fmax and fmin pass over a NaN sample (a reading the agent had none of) as PromQL's
            # max_over_time and min_over_time do: a step is NaN only where all its samples are.
            extreme = np.full(size, np.nan, v.dtype)
            (np.fmax if how == "max" else np.fmin).at(extreme, group, v)
            out[name] = extreme[held]
    # How many samples each point holds: how much of its step a series covered (analyzer.grid.holding).
    out["sample_count"] = count[held].astype(np.float32)
    rows_point, rows_series = np.divmod(held, n_series)
    return first + (rows_point + p0) * step, rows_series, out
