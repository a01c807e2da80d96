"""`dataloader_starvation`: GPUs waiting for the next batch.

From trainer telemetry, the share of step time spent blocked on the loader. Jobs
without telemetry show it on the GPU as a sawtooth: bursts at full utilization
between stretches near zero while the next batch is produced.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Finding
from ..grid.frames import Frames
from ..grid.views import Views, fmean, runs, window_sum

KIND = "dataloader_starvation"
ADVICE = ("Feed the GPUs faster: more DataLoader workers with pin_memory=True and prefetching, "
          "pre-tokenized data, or faster storage (local NVMe cache instead of network reads).")


@dataclass(frozen=True)
class Config:
    warning_share: float = 0.05
    """Data-wait share of step time that is worth fixing. Practitioners' rule of thumb
    (PyTorch performance tuning guides and profiler recipes): a well-fed loop waits
    under ~5%; above that, loader workers or storage are the cheapest speed-up."""
    critical_share: float = 0.50
    """Above half the step time the GPUs mostly wait: severe."""
    window_minutes: float = 10.0
    """Shares are taken over a centered window this long, so single slow batches
    (a shard boundary, a cache miss) do not count."""
    min_minutes: float = 20.0
    """The share must stay above the warning level this long."""
    gap_minutes: float = 2.0
    saw_high_pct: float = 80.0
    """Without telemetry: p95 of utilization at or above this..."""
    saw_low_pct: float = 20.0
    """...and p5 at or below this, over the same window, is the sawtooth."""
    saw_tail: float = 0.05
    """The tail that p95/p5 name: at least this share of samples at each extreme."""
    saw_gpu_share: float = 0.5
    """A job starves when at least this share of its GPUs show the sawtooth."""


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    return _from_telemetry(v, config) + _from_sawtooth(v, config)



def _from_telemetry(v: Views, config: Config) -> list[Finding]:
    rank = v.rank
    if not rank.size or "data_wait_s" not in rank.values or "step_s" not in rank.values:
        return []
    half = v.span(config.window_minutes) // 2
    out = []
    for job, rows in v.job_rows(rank).items():
        wait = np.nansum(rank.values["data_wait_s"][rows], axis=0, dtype=np.float64)
        step = np.nansum(rank.values["step_s"][rows], axis=0, dtype=np.float64)
        if step.sum() <= 0:
            continue
        w_wait, w_step = window_sum(wait[None], half)[0], window_sum(step[None], half)[0]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(w_step > 0, w_wait / w_step, np.nan)
        mask = share >= config.warning_share
        for r in runs(mask[None], v.span(config.min_minutes), v.gap(config.gap_minutes)):
            span = slice(r.start, r.end)
            total = step[span].sum()
            ratio = float(wait[span].sum() / total) if total > 0 else 0.0
            if ratio < config.warning_share:
                continue
            out.append(Finding(
                kind=KIND, severity="critical" if ratio >= config.critical_share else "warning",
                start=float(v.begins(r.start)), end=float(v.begins(r.end)), namespace=job[0], training_job=job[1],
                wasted_gpu_hours=float(wait[span].sum() / 3600),
                evidence={"data_wait_share": ratio, "data_wait_seconds": float(wait[span].sum()),
                          "step_seconds": float(total), "ranks": int(len(rows)), "signal": "trainer telemetry"},
                recommendation=ADVICE,
            ))
    return out


def _from_sawtooth(v: Views, config: Config) -> list[Finding]:
    alloc = v.alloc
    util_all = v.gpu.values.get("gpu_util")
    if not alloc.size or util_all is None:
        return []
    half = v.span(config.window_minutes) // 2
    out = []
    for job, rows in v.job_rows(alloc).items():
        if job in v.telemetry_jobs:
            continue
        gpu_rows = alloc.keys["gpu_row"].to_numpy()[rows]
        rows, gpu_rows = rows[gpu_rows >= 0], gpu_rows[gpu_rows >= 0]
        if not len(rows):
            continue
        util = util_all[gpu_rows]
        held = np.nan_to_num(alloc.values["share"][rows]) > 0
        valid = held & np.isfinite(util)
        n = window_sum(valid, half)
        with np.errstate(invalid="ignore", divide="ignore"):
            high = window_sum(valid & (util >= config.saw_high_pct), half) / n
            low = window_sum(valid & (util <= config.saw_low_pct), half) / n
        saw = (high >= config.saw_tail) & (low >= config.saw_tail) & held
        job_saw = saw.sum(axis=0) >= config.saw_gpu_share * np.maximum(held.sum(axis=0), 1)
        job_saw &= held.any(axis=0)
        for r in runs(job_saw[None], v.span(config.min_minutes), v.gap(config.gap_minutes)):
            span = slice(r.start, r.end)
            share = np.nan_to_num(alloc.values["share"][rows, span])
            waiting = np.nan_to_num(low[:, span])
            ratio = fmean(low[:, span][held[:, span]]) or 0.0
            out.append(Finding(
                kind=KIND, severity="critical" if ratio >= config.critical_share else "warning",
                start=float(v.begins(r.start)), end=float(v.begins(r.end)), namespace=job[0], training_job=job[1],
                wasted_gpu_hours=float((share * waiting).sum() * v.step / 3600),
                evidence={"low_util_share": ratio, "high_util_share": fmean(high[:, span][held[:, span]]),
                          "mean_util_pct": fmean(util[:, span][held[:, span]]),
                          "gpus_sawtooth": int(saw[:, span].any(axis=1).sum()), "job_gpus": int(len(rows)),
                          "signal": "GPU utilization sawtooth (no trainer telemetry)"},
                recommendation=ADVICE,
            ))
    return out
