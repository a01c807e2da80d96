"""Where every GPU-hour of a window went, with the identity that holds it together:

    observed  = allocated + unallocated
    allocated = busy + idle          (GPU-hours weighted by the holders' share)
    Σ jobs    = allocated

Time comes from each sample's `held_s` (analyzer.grid.holding), so the figures are the
same at any scrape interval and for any window that holds the same samples. A GPU
whose holders' shares add up to more than one (a time-sliced GPU counted by pods
that each report a whole GPU) is split among them, never counted twice.
`coverage` is the share of the GPUs' lifetime in the window that had samples: a
node that stopped reporting for an hour lowers it; one that joined late does not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping

import numpy as np

from ..detectors.idle_gpu import Config as IdleConfig
from ..grid.views import Views

COVERAGE_WARNING = 0.99
ROWS_AT_ONCE = 128


@dataclass(frozen=True)
class Accounting:
    observed_gpu_hours: float
    allocated_gpu_hours: float
    unallocated_gpu_hours: float
    busy_gpu_hours: float
    idle_gpu_hours: float
    util_unknown_gpu_hours: float     # allocated with no utilization sample: counted as busy
    coverage: float | None            # None when no GPU was seen at all
    row_gpu_hours: np.ndarray         # per alloc-grid row: its holder's GPU-hours
    # (gpu, time) seconds that a whole share held in each cell stands for: the cell's observed
    # time, split where shares add up to more than a GPU. Empty for accountings added up.
    cell_seconds: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32), repr=False)
    per_node: dict[str, dict[str, float | str | None]] = field(default_factory=dict)   # prices added by the report
    idle_util_pct: float = IdleConfig().util_max_pct   # idle: allocated at or below this utilization

    def to_dict(self) -> dict[str, object]:
        return {
            "observed_gpu_hours": _r(self.observed_gpu_hours), "allocated_gpu_hours": _r(self.allocated_gpu_hours),
            "unallocated_gpu_hours": _r(self.unallocated_gpu_hours), "busy_gpu_hours": _r(self.busy_gpu_hours),
            "idle_gpu_hours": _r(self.idle_gpu_hours), "util_unknown_gpu_hours": _r(self.util_unknown_gpu_hours),
            "coverage": None if self.coverage is None else round(self.coverage, 4),
            "idle_util_pct": self.idle_util_pct,
            "nodes": {host: {k: _r(v) if isinstance(v, float) and k != "gpu_hour_dollars" else v
                             for k, v in figures.items()}
                      for host, figures in sorted(self.per_node.items())},
        }


def _r(value: float) -> float:
    return round(float(value), 4)


def account(v: Views, idle: IdleConfig = IdleConfig()) -> Accounting:
    """`idle` is the config in effect: the idle GPU-hours count what the idle_gpu finding does."""
    # Held seconds are sums of samples (analyzer.grid.holding): zero, never NaN, where none fell.
    gpu, alloc = v.gpu, v.alloc
    # Seconds may be held in float32 (analyzer.grid.views.build_grid): sums and products in float64.
    observed = gpu.values["held_s"].astype(np.float64) if "held_s" in gpu.values else np.zeros((gpu.size, v.n))
    rows = alloc.keys["gpu_row"].to_numpy() if alloc.size else np.zeros(0, np.int64)
    row_held = alloc.values["held_s"] if alloc.size else np.zeros((0, v.n))
    def share(holders: np.ndarray) -> np.ndarray:
        """The holders' shares where they hold time: taken for a few rows at a time, as the
        alloc grid of a week of a thousand GPUs is 140 MB in float32."""
        if not alloc.size:
            return np.zeros((0, v.n))
        return np.where(row_held[holders] > 0, alloc.values["share"][holders], 0.0)

    known = rows >= 0
    total = np.zeros((gpu.size, v.n))
    by_gpu, gpus, starts = v.holders_by_gpu
    row_seconds = np.zeros(len(rows))
    # A block of GPUs at a time, as below: each (gpu, time) temporary of a week of a
    # thousand GPUs is 90 MB.
    for first, holders, begins in _gpu_blocks(by_gpu, starts):
        block = gpus[first:first + len(begins)]
        shares = share(holders)
        total[block] = np.add.reduceat(shares, begins, axis=0)
        # A GPU is observed while any of its series has a sample: its holders' too.
        observed[block] = np.maximum(observed[block], np.maximum.reduceat(row_held[holders], begins, axis=0))
        # Shares adding up to more than a GPU split it: each holder's part of the observed time.
        part = observed[block] / np.maximum(total[block], 1.0)
        group = np.repeat(np.arange(len(begins)), np.diff(begins, append=len(holders)))
        row_seconds[holders] = np.einsum("rt,rt->r", shares, part[group])
    cell_seconds = np.empty(observed.shape, np.float32)
    for at in range(0, len(observed), ROWS_AT_ONCE):
        some = slice(at, at + ROWS_AT_ONCE)
        cell_seconds[some] = observed[some] / np.maximum(total[some], 1.0)
    # Holders of GPUs that have no device series at all stand for their own time.
    orphans = np.flatnonzero(~known)
    orphan_seconds = np.multiply(np.minimum(share(orphans), 1.0), row_held[orphans], dtype=np.float64).sum(axis=1)
    row_seconds[orphans] = orphan_seconds
    np.minimum(total, 1.0, out=total)
    allocated_s = np.multiply(total, observed, out=total)      # per cell, the share held times the time seen
    util = gpu.values.get("gpu_util")
    if util is None:
        util = np.full(observed.shape, np.nan, np.float32)
    per_gpu = {"observed": observed.sum(axis=1), "allocated": allocated_s.sum(axis=1),
               "idle": _sums_where(util <= idle.util_max_pct, allocated_s),
               "unknown": _sums_where(np.isnan(util), allocated_s),
               "lifetime": _lifetime(observed > 0) * v.step}
    hosts = gpu.keys["Hostname"].to_numpy() if gpu.size else np.zeros(0, object)
    names, host_of = np.unique(hosts.astype(str), return_inverse=True)
    by_host = {k: np.bincount(host_of, weights=x, minlength=len(names)) for k, x in per_gpu.items()}
    per_node = {str(host): node_figures(*(by_host[k][i] for k in ("observed", "allocated", "idle", "lifetime")))
                for i, host in enumerate(names)}
    orphan = float(orphan_seconds.sum())
    observed_s, allocated_total = float(per_gpu["observed"].sum()) + orphan, float(per_gpu["allocated"].sum()) + orphan
    idle_total, life = float(per_gpu["idle"].sum()), float(per_gpu["lifetime"].sum()) + orphan
    return Accounting(
        observed_gpu_hours=observed_s / 3600, allocated_gpu_hours=allocated_total / 3600,
        unallocated_gpu_hours=(observed_s - allocated_total) / 3600,
        busy_gpu_hours=(allocated_total - idle_total) / 3600, idle_gpu_hours=idle_total / 3600,
        util_unknown_gpu_hours=(float(per_gpu["unknown"].sum()) + orphan) / 3600,
        coverage=covered(observed_s, life),
        row_gpu_hours=row_seconds / 3600, per_node=per_node,
        cell_seconds=cell_seconds, idle_util_pct=idle.util_max_pct)


def _gpu_blocks(by_gpu: np.ndarray, starts: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """The holders grouped by GPU (Views.holders_by_gpu) a block of GPUs at a time: the
    block's first group, its holder rows and where each group starts among them."""
    for first in range(0, len(starts), ROWS_AT_ONCE):
        begins = starts[first:first + ROWS_AT_ONCE]
        end = starts[first + ROWS_AT_ONCE] if first + ROWS_AT_ONCE < len(starts) else len(by_gpu)
        yield first, by_gpu[begins[0]:end], begins - begins[0]


def _sums_where(where: np.ndarray, values: np.ndarray) -> np.ndarray:
    """np.where(where, values, 0).sum(axis=1), a block of rows at a time: the same sums
    without a whole-grid temporary."""
    out = np.zeros(len(values))
    for at in range(0, len(values), ROWS_AT_ONCE):
        rows = slice(at, at + ROWS_AT_ONCE)
        out[rows] = np.where(where[rows], values[rows], 0.0).sum(axis=1)
    return out


def holder_seconds(v: Views, accounting: Accounting, rows: np.ndarray) -> np.ndarray:
    """(time,) seconds the alloc-grid `rows` held together in each bin, share-weighted: the
    bins of their `row_gpu_hours`."""
    alloc = v.alloc
    held = np.zeros(v.n)
    if not len(rows):
        return held
    gpu_rows = alloc.keys["gpu_row"].to_numpy()[rows]
    row_held = alloc.values["held_s"][rows]
    share = np.where(row_held > 0, alloc.values["share"][rows], 0.0)
    known = gpu_rows >= 0
    held += (share[known] * accounting.cell_seconds[gpu_rows[known]]).sum(axis=0)
    held += np.multiply(np.minimum(share[~known], 1.0), row_held[~known], dtype=np.float64).sum(axis=0)
    return held


def node_figures(observed: float, allocated: float, idle: float, lifetime: float) -> dict[str, float | None]:
    return {"observed_gpu_hours": observed / 3600, "allocated_gpu_hours": allocated / 3600,
            "unallocated_gpu_hours": (observed - allocated) / 3600, "busy_gpu_hours": (allocated - idle) / 3600,
            "idle_gpu_hours": idle / 3600, "coverage": covered(observed, lifetime)}


def _lifetime(seen: np.ndarray) -> np.ndarray:
    """Steps from each GPU's first sample to its last: the time it should have been seen."""
    if not seen.size:
        return np.zeros(seen.shape[0])
    any_seen = seen.any(axis=1)
    first = np.argmax(seen, axis=1)
    last = seen.shape[1] - 1 - np.argmax(seen[:, ::-1], axis=1)
    return np.where(any_seen, last - first + 1, 0).astype(np.float64)


HOURS = ("observed_gpu_hours", "allocated_gpu_hours", "unallocated_gpu_hours", "busy_gpu_hours", "idle_gpu_hours")


def added(parts: list[Accounting]) -> Accounting:
    """Accountings of disjoint parts of the GPUs' time as one. Coverage is observed over
    lifetime, so lifetimes (observed / coverage) add; a node in several parts has its
    hours added the same way, and keeps its first part's price."""
    per_node: dict[str, dict[str, float | str | None]] = {}
    for part in parts:
        for host, figures in part.per_node.items():
            mine = per_node.get(host)
            per_node[host] = dict(figures) if mine is None else {
                **mine, **{name: float(mine[name]) + float(figures[name]) for name in HOURS},
                "coverage": covered(float(mine[HOURS[0]]) + float(figures[HOURS[0]]),
                                    node_lifetime(mine) + node_lifetime(figures))}
    observed = sum(p.observed_gpu_hours for p in parts)
    return Accounting(
        observed_gpu_hours=observed, allocated_gpu_hours=sum(p.allocated_gpu_hours for p in parts),
        unallocated_gpu_hours=sum(p.unallocated_gpu_hours for p in parts),
        busy_gpu_hours=sum(p.busy_gpu_hours for p in parts), idle_gpu_hours=sum(p.idle_gpu_hours for p in parts),
        util_unknown_gpu_hours=sum(p.util_unknown_gpu_hours for p in parts),
        coverage=covered(observed, sum(lifetime(p.observed_gpu_hours, p.coverage) for p in parts)),
        row_gpu_hours=np.concatenate([p.row_gpu_hours for p in parts]) if parts else np.zeros(0),
        per_node=per_node, **({"idle_util_pct": parts[0].idle_util_pct} if parts else {}))


def lifetime(observed_gpu_hours: float, coverage: float | str | None) -> float:
    """The GPU-hours the GPUs were there: observed over coverage (none where it is unknown)."""
    return observed_gpu_hours / float(coverage) if coverage else 0.0


def node_lifetime(figures: Mapping[str, float | str | None]) -> float:
    """A node's lifetime in GPU-hours, from its figures in `per_node`."""
    return lifetime(float(figures["observed_gpu_hours"]), figures.get("coverage"))


def covered(observed_gpu_hours: float, life: float) -> float | None:
    """Coverage: observed over the lifetime, at most all of it; unknown without a lifetime."""
    return min(observed_gpu_hours / life, 1.0) if life > 0 else None
