"""`low_mfu`: a job that runs, but far below what its GPUs can do.

Model FLOPs utilization comes from the trainer (model FLOPs per second over the
GPU's dense peak), reported per rank while steps complete.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Finding
from ..grid.frames import Frames
from ..grid.views import Views

KIND = "low_mfu"


@dataclass(frozen=True)
class Config:
    floor: float = 0.25
    """MFU below this fires. Well-tuned large-model training reaches 0.35-0.55
    (PaLM reports 46%, Megatron-LM and MegaScale ~50-55% on A100/H100); a job below
    a quarter of peak leaves most of the GPU unused."""
    min_minutes: float = 30.0
    """Only jobs that made steps for at least this long are judged."""
    critical_floor: float = 0.10


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    rank = v.rank
    if not rank.size or "mfu" not in rank.values or "steps" not in rank.values:
        return []
    out = []
    for job, rows in v.job_rows(rank).items():
        mfu = rank.values["mfu"][rows].astype(np.float64)
        working = (np.nan_to_num(rank.values["steps"][rows]) > 0) & np.isfinite(mfu) & rank.present[rows]
        if working.sum() * v.step / len(rows) < config.min_minutes * 60:
            continue
        value = float(mfu[working].mean())
        if value >= config.floor:
            continue
        active = working.any(axis=0)
        cols = np.nonzero(active)[0]
        gpu_hours = float(working.sum() * v.step / 3600)
        out.append(Finding(
            kind=KIND, severity="critical" if value < config.critical_floor else "warning",
            start=float(v.begins(cols[0])), end=float(v.begins(cols[-1] + 1)), namespace=job[0], training_job=job[1],
            wasted_gpu_hours=gpu_hours * (1 - value / config.floor),
            evidence={"mfu": value, "floor": config.floor, "ranks": int(len(rows)), "gpu_hours": gpu_hours},
            recommendation="Profile a few steps (torch.profiler) and raise arithmetic intensity: larger micro-batches, "
                           "bf16 autocast, fused kernels (FlashAttention, torch.compile), fewer host syncs.",
        ))
    return out
