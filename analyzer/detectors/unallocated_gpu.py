"""`unallocated_gpu`: capacity that is paid for and that no pod holds."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Finding
from ..grid.frames import Frames
from ..grid.views import Views, fmean, runs

KIND = "unallocated_gpu"


@dataclass(frozen=True)
class Config:
    min_minutes: float = 60.0
    """Free this long. Gaps of minutes between jobs are normal scheduling churn;
    an hour is longer than the cluster-autoscaler's default 10-minute scale-down
    delay plus a node drain, so the capacity could have been released."""
    gap_minutes: float = 2.0
    """A pod holding the GPU for less than this does not end the free stretch."""
    critical_hours: float = 24.0


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    gpu = v.gpu
    if not gpu.size:
        return []
    # dcgm-exporter nodes have no `up`: a GPU that reports is up there.
    up = np.where(np.isnan(gpu.values["up"]), gpu.present, gpu.values["up"] > 0.5) if "up" in gpu.values \
        else gpu.present
    free = gpu.present & up & (v.held <= 0)
    found = runs(free, min_len=v.span(config.min_minutes),
                 max_gap=v.gap(config.gap_minutes))
    out = []
    util = gpu.values.get("gpu_util")
    for r in found:
        k = gpu.keys.iloc[r.row]
        hours = (r.end - r.start) * v.step / 3600
        evidence = {"unallocated_hours": hours}
        if util is not None:
            evidence["mean_util_pct"] = fmean(util[r.row, r.start:r.end])
        out.append(Finding(
            kind=KIND, severity="critical" if hours >= config.critical_hours else "warning",
            start=float(v.begins(r.start)), end=float(v.begins(r.end)), hostname=k["Hostname"], gpu=k["gpu"],
            wasted_gpu_hours=hours, evidence=evidence,
            recommendation="Scale the GPU node pool down or schedule queued work onto this node.",
        ))
    return out
