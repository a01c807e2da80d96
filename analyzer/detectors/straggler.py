"""`straggler`: one rank that holds the whole job back.

Under all-reduce every rank's wall step time is the same (the fast ones wait in the
collective), so wall time cannot point at the culprit. What differs is each rank's
own compute time, which the trainer reports separately. Without telemetry, the
straggler's GPU is the one that is persistently busier (its peers idle in the
collective) or clocked lower than its peers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Finding
from ..grid.apart import FIELDS, reach, stretches
from ..grid.frames import Frames
from ..grid.views import Views, block_sum, fmean, median_over_rows, runs

KIND = "straggler"
ADVICE = ("Cordon and drain the straggler's node (or replace the GPU) and restart from the last checkpoint; "
          "check its clocks, PCIe/NVLink link width and host CPU contention first.")


@dataclass(frozen=True)
class Config:
    slowdown: float = 1.15
    """Compute per step at least this many times the job's median marks a straggler.
    Healthy data-parallel ranks run within a few percent of each other; 15% is
    well outside that noise and costs every other rank the same 15%."""
    block_minutes: float = 5.0
    """Compute times are compared over blocks this long, on the clock's multiples of it: any
    window cuts the same data into the same blocks."""
    min_minutes: float = 20.0
    """Persistently: slower for at least this long (gaps of one block allowed)."""
    critical_slowdown: float = 1.5
    util_excess_pct: float = 15.0
    """Without telemetry: a GPU this many points busier than its peers' median..."""
    clock_ratio: float = 0.9
    """...or with an SM clock below this share of its peers' median."""


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    return _from_telemetry(v, config) + _from_gpus(v, config)



def _gpu_of(v: Views, pod: str, host: str, rank_no: float) -> str | None:
    """The GPU a rank runs on: the pod's only GPU, else the local-rank-th by index
    (torchrun numbers ranks node_rank × nproc + local_rank, one GPU per local rank)."""
    keys = v.alloc.keys
    mine = keys[(keys["pod"] == pod) & (keys["Hostname"] == host)]
    gpus = sorted(set(mine["gpu"]), key=lambda g: (len(g), g))
    if len(gpus) == 1:
        return gpus[0]
    if gpus and np.isfinite(rank_no):
        return gpus[int(rank_no) % len(gpus)]
    return None


def _span(v: Views, starts: np.ndarray, first: int, end: int) -> tuple[float, float]:
    """Where blocks `first` up to `end` (exclusive) begin and end."""
    return float(v.begins(starts[first])), float(v.begins(starts[end] if end < len(starts) else v.n))


def _from_telemetry(v: Views, config: Config) -> list[Finding]:
    rank = v.rank
    if not rank.size or "compute_s" not in rank.values:
        return []
    starts = v.blocks(config.block_minutes)
    min_blocks = max(int(np.ceil(config.min_minutes / config.block_minutes)), 1)
    out = []
    for job, rows in v.job_rows(rank).items():
        if len(rows) < 2:
            continue
        comp = block_sum(rank.values["compute_s"][rows], starts)
        steps = block_sum(rank.values["steps"][rows], starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_step = np.where(steps > 0, comp / steps, np.nan)
        per_step[:, _waiting_blocks(v, rows, starts)] = np.nan
        reporting = np.isfinite(per_step).sum(axis=0)
        usable = reporting >= 2
        if not usable.any():
            continue
        ref = np.full(per_step.shape[1], np.nan)
        cols = np.nonzero(usable)[0]
        sub = per_step[:, cols]
        # With two ranks the median is their mean and hides half the gap: compare with the faster one.
        ref[cols] = np.nanmin(sub, axis=0) if len(rows) == 2 else median_over_rows(sub)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = per_step / ref
        slow = ratio >= config.slowdown
        for r in runs(slow, min_blocks, max_gap=1):
            row = rows[r.row]
            key = rank.keys.iloc[row]
            span = slice(r.start, r.end)
            excess = np.nan_to_num(comp[r.row, span] - ref[span] * steps[r.row, span])
            mean_ratio = float(np.nansum(comp[r.row, span]) / np.nansum(ref[span] * steps[r.row, span]))
            start, end = _span(v, starts, r.start, r.end)
            out.append(Finding(
                kind=KIND, severity="critical" if mean_ratio >= config.critical_slowdown else "warning",
                start=start, end=end, namespace=job[0], training_job=job[1], hostname=key["Hostname"],
                gpu=_gpu_of(v, key["pod"], key["Hostname"], key["rank_no"]), pod=key["pod"],
                rank=int(key["rank_no"]) if np.isfinite(key["rank_no"]) else None,
                wasted_gpu_hours=float(np.clip(excess, 0, None).sum() * len(rows) / 3600),
                evidence={"compute_seconds_per_step": float(np.nansum(comp[r.row, span]) / np.nansum(steps[r.row, span])),
                          "job_median_compute_seconds_per_step": float(np.nanmedian(ref[span])),
                          "slowdown": mean_ratio, "ranks": int(len(rows)), "signal": "trainer telemetry"},
                recommendation=ADVICE,
            ))
    return out


def _waiting_blocks(v: Views, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The blocks where some of the job's ranks waited for a save or an evaluation that others
    made (rank 0 saving alone): they report the wait as their next step's time (grid.apart), and
    such a block says nothing of which rank is slower."""
    rank = v.rank
    waited = [s for name in FIELDS.values() if name in rank.values
              for s in stretches(rank.values[name][rows], rank.present[rows]) if s.waited > 0]
    if not waited:
        return np.zeros(0, np.int64)
    stepped = np.flatnonzero((np.nan_to_num(rank.values["steps"][rows]) > 0).any(axis=0))
    touched = np.zeros(v.n, bool)
    for s in waited:
        touched[reach(s, stepped, v.n)] = True
    return np.unique(np.searchsorted(starts, np.flatnonzero(touched), side="right") - 1)


def _from_gpus(v: Views, config: Config) -> list[Finding]:
    alloc, gpu = v.alloc, v.gpu
    if not alloc.size or "gpu_util" not in gpu.values:
        return []
    starts = v.blocks(config.block_minutes)
    bins = np.diff(np.append(starts, v.n))
    min_blocks = max(int(np.ceil(config.min_minutes / config.block_minutes)), 1)
    out = []
    for job, rows in v.job_rows(alloc).items():
        if job in v.telemetry_jobs:
            continue
        gpu_rows = alloc.keys["gpu_row"].to_numpy()[rows]
        rows, gpu_rows = rows[gpu_rows >= 0], gpu_rows[gpu_rows >= 0]
        if len(rows) < 3:
            continue
        held = np.nan_to_num(alloc.values["share"][rows]) > 0
        n = block_sum(held, starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            util = block_sum(np.where(held, gpu.values["gpu_util"][gpu_rows], np.nan), starts) / n
            clock = (block_sum(np.where(held, gpu.values["sm_clock_mhz"][gpu_rows], np.nan), starts) / n
                     if "sm_clock_mhz" in gpu.values else np.full(util.shape, np.nan))
        util[n == 0] = np.nan
        clock[n == 0] = np.nan
        enough = np.isfinite(util).sum(axis=0) >= 3
        if not enough.any():
            continue
        med_util = np.full(util.shape[1], np.nan)
        med_clock = np.full(util.shape[1], np.nan)
        med_util[enough] = median_over_rows(util[:, enough])
        if np.isfinite(clock[:, enough]).any():
            med_clock[enough] = median_over_rows(clock[:, enough])
        with np.errstate(invalid="ignore"):
            busier = util - med_util >= config.util_excess_pct
            slower = clock <= config.clock_ratio * med_clock
        for r in runs(busier | slower, min_blocks, max_gap=1):
            key = alloc.keys.iloc[rows[r.row]]
            span = slice(r.start, r.end)
            peers_wait = np.nan_to_num(np.clip(util[r.row, span] - med_util[span], 0, None) / 100)
            start, end = _span(v, starts, r.start, r.end)
            out.append(Finding(
                kind=KIND, severity="warning", start=start, end=end, namespace=job[0], training_job=job[1],
                hostname=key["Hostname"], gpu=key["gpu"], pod=key["pod"],
                wasted_gpu_hours=float((peers_wait * bins[span]).sum() * (len(rows) - 1) * v.step / 3600),
                evidence={"util_pct": fmean(util[r.row, span]),
                          "peer_median_util_pct": fmean(med_util[span]),
                          "sm_clock_mhz": fmean(clock[r.row, span]),
                          "peer_median_sm_clock_mhz": fmean(med_clock[span]),
                          "job_gpus": int(len(rows)), "signal": "GPU utilization and clocks (no trainer telemetry)"},
                recommendation=ADVICE,
            ))
    return out

