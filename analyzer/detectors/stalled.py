"""`stalled`: a job that stopped making steps while it still holds its GPUs.

A hung collective (one rank dead or deadlocked, the others spinning in NCCL at
100%) or a wedged data pipeline (GPUs at 0%) look different on the GPU but the
same in the step counter, which is what this reads. A save or an evaluation, however
long, is not a stall: the stall counts from its end; nor is a new process's start-up after
the last step. A stall is a living process's: where
the ledger knows when a job's last process ended (`process_ends`), its stall ends there,
and the GPUs held after are `held_after_exit` (analyzer.costing.ledger_findings).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .findings import Finding, iso
from ..grid.apart import FIELDS, stretches
from ..grid.frames import Frames
from ..grid.views import Grid, Views, fmean, runs

KIND = "stalled"


@dataclass(frozen=True)
class Config:
    interval_factor: float = 5.0
    """No step for this many usual step intervals is a stall, not jitter."""
    floor_minutes: float = 10.0
    """...and never less than this: PyTorch's default NCCL collective timeout is
    10 minutes, so a shorter pause can still be a slow collective (or a save or an
    evaluation from a loop that does not report their seconds)."""


def _ffill_index(mask: np.ndarray) -> np.ndarray:
    idx = np.where(mask, np.arange(mask.size), -1)
    return np.maximum.accumulate(idx)


def _confirmed(known: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Bins where a sample, then or later, shows no step made since `last`: an unknown bin
    inside a stall is part of it, one at the end of the data is not yet a stall."""
    n = known.size
    later = np.minimum.accumulate(np.where(known, np.arange(n), n)[::-1])[::-1]
    return (later < n) & (last[np.minimum(later, n - 1)] == last)


def _going_on(known: np.ndarray, over: np.ndarray) -> np.ndarray:
    """The bins after the last known one (the time the ranks' last report holds for) where that
    one was already past the limit: a stall the data has shown goes on while the GPUs are held,
    whatever the step, as it does where the last report's bin holds that time itself."""
    out = np.zeros(known.size, dtype=bool)
    seen = np.flatnonzero(known)
    if len(seen) and over[seen[-1]]:
        out[seen[-1] + 1:] = True
    return out


def _usual_step_s(rank: Grid, rows: np.ndarray, steps: np.ndarray, progress: np.ndarray) -> float:
    """A job's usual seconds per step: the median over the window's steps, or, where it made
    none, its processes' mean over every step they had made (their counters' totals)."""
    made = np.nansum(steps, axis=0)
    if made.sum() > 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            per_step = np.nansum(rank.values["step_s"][rows], axis=0) / made
        return float(np.median(per_step[progress & np.isfinite(per_step)])) if progress.any() else 0.0
    if "steps" not in rank.totals or "step_s" not in rank.totals:
        return 0.0
    total_steps = np.nansum(rank.totals["steps"][rows])
    return float(np.nansum(rank.totals["step_s"][rows]) / total_steps) if total_steps > 0 else 0.0


def _saving_or_evaluating(v: Views, rank: Grid, rows: np.ndarray) -> np.ndarray:
    """The bins a save or an evaluation took: no step completes in them, and they are not a
    stall. Each is reported as it ends (or, from a monitor that tells of one under way, as it
    goes), and blocks the job for as long as its slowest rank reported (grid.apart): that many
    seconds back from its last report."""
    out = np.zeros(v.n, dtype=bool)
    times = v.time(np.arange(v.n))
    for name in FIELDS.values():
        if name in rank.values:
            for s in stretches(rank.values[name][rows], rank.present[rows]):
                end = times[s.last]
                out[(times >= end - s.seconds) & (times <= end)] = True
    return out


def _starting_after(rank: Grid, rows: np.ndarray, quiet: np.ndarray) -> np.ndarray:
    """The bins where the job's newest process started after its last step (and after any save
    or evaluation since): a restart starting up, which `slow_startup` judges, not a stall. Its
    monitor says so from its creation on (docs/telemetry.md), before its first step."""
    start = rank.values.get("start_time")
    if start is None:
        return np.zeros(quiet.size, dtype=bool)
    newest = np.nanmax(np.where(rank.present[rows], start[rows], np.nan), axis=0, initial=-np.inf)
    newest = np.maximum.accumulate(np.where(np.isnan(newest), -np.inf, newest))
    return newest > quiet


def _process_start(rank: Grid, rows: np.ndarray) -> float:
    """When the job's newest process started (its ranks' `start_time`), -inf where unknown."""
    start = rank.values.get("start_time")
    if start is None or not np.isfinite(start[rows]).any():
        return -np.inf
    return float(np.nanmax(start[rows]))


def detect(data: Frames | Views, config: Config = Config(),
           process_ends: Mapping[tuple[str, str], float] | None = None) -> list[Finding]:
    """`process_ends`: when a job's last process ended, where its GPUs were held after; given,
    the jobs it names alone are looked at (detectors.ended_with_their_processes)."""
    v = Views.of(data)
    rank, alloc = v.rank, v.alloc
    if not rank.size or "steps" not in rank.values:
        return []
    alloc_rows = v.job_rows(alloc)
    util = v.gpu.values.get("gpu_util")
    times = v.time(np.arange(v.n))
    out = []
    for job, rows in v.job_rows(rank).items():
        if process_ends is not None and job not in process_ends:
            continue
        steps = rank.values["steps"][rows]
        held_rows = alloc_rows.get(job)
        if held_rows is not None:
            share = np.nan_to_num(alloc.values["share"][held_rows])
            held = share.sum(axis=0)
        else:
            # No allocation data (a source without it): the ranks reporting are the holders.
            held = rank.present[rows].sum(axis=0).astype(np.float64)
        if not (held > 0).any():
            continue
        # Steps are spread over the time each sample stands for (analyzer.grid.views), so a job
        # sampled every 15 s on a 1 s grid makes steps in every second, not in one of 15.
        progress = (np.nan_to_num(steps) > 0).any(axis=0)
        # Where a rank reports but no sample says whether it stepped (its first in the
        # window, the interval after its last), nothing is known; where none reports while
        # the job holds GPUs, it makes no steps.
        known = np.isfinite(steps).any(axis=0) | ((held > 0) & ~rank.present[rows].any(axis=0))
        usual = _usual_step_s(rank, rows, steps, progress)
        if not usual:
            continue        # no step made, in the window or before it: a start-up, not a stall
        limit = max(config.interval_factor * usual, config.floor_minutes * 60)

        seen = _ffill_index(progress)
        first_held = int(np.argmax(held > 0))
        last = np.where(seen >= 0, times[np.maximum(seen, 0)], times[first_held])
        if "last_step_time" in rank.values:
            reported = np.nanmax(np.where(rank.present[rows], rank.values["last_step_time"][rows], np.nan),
                                 axis=0, initial=-np.inf)
            reported = np.maximum.accumulate(np.where(np.isnan(reported), -np.inf, reported))
            # Before the window's first step, the step time its ranks report is when the job last
            # stepped, if their process made that step (a window that opens amid a stall).
            own = np.isfinite(reported) & (reported >= _process_start(rank, rows))
            last = np.where((seen < 0) & own, reported, np.maximum(last, reported))
        # The stall counts from the last step, or from the end of a save or an evaluation after
        # it, however long that took.
        apart = _ffill_index(_saving_or_evaluating(v, rank, rows))
        quiet = np.maximum(last, np.where(apart >= 0, times[np.maximum(apart, 0)], -np.inf))
        over = (times - quiet > limit) & ~_starting_after(rank, rows, quiet)
        stalled = (held > 0) & over & (_confirmed(known, quiet) | _going_on(known, over))
        ended = (process_ends or {}).get(job)
        if ended is not None:
            stalled &= v.begins(np.arange(v.n)) < ended
        for r in runs(stalled[None, :]):
            since = float(quiet[r.start])
            begin = max(v.bin_of(since), 0)
            span = slice(begin, r.end)
            end = float(v.begins(r.end)) if ended is None else min(float(v.begins(r.end)), ended)
            evidence = {"last_step": iso(float(last[r.start])), "stalled_minutes": (end - since) / 60,
                        "usual_step_seconds": usual, "threshold_minutes": limit / 60,
                        "gpus_held": float(held[r.start:r.end].max())}
            if since > last[r.start]:
                evidence["save_or_evaluation_ended"] = iso(since)
            if util is not None and held_rows is not None:
                gpu_rows = alloc.keys["gpu_row"].to_numpy()[held_rows]
                gpu_rows = gpu_rows[gpu_rows >= 0]
                if len(gpu_rows):
                    evidence["mean_util_pct"] = fmean(util[gpu_rows, r.start:r.end])
            out.append(Finding(
                kind=KIND, severity="critical", start=max(since, float(v.begins(0))), end=end,
                namespace=job[0], training_job=job[1],
                wasted_gpu_hours=float(held[span].sum() * v.step / 3600), evidence=evidence,
                recommendation="Restart the job from its last checkpoint and set a collective timeout "
                               "(init_process_group timeout, TORCH_NCCL_ASYNC_ERROR_HANDLING=1) so a hang "
                               "fails fast instead of holding the GPUs.",
            ))
    return out

