"""`idle_gpu`: a GPU held by a pod whose utilization stays near zero.

The most common waste in shared clusters: notebooks and crashed-but-not-deleted
jobs keep their GPUs while doing nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from burnrate.exporter.catalog import IDLE_UTIL_PCT

from .findings import Finding
from ..grid.frames import Frames
from ..grid.workloads import INTERACTIVE, SERVING
from ..grid.views import Views, fmean, runs

KIND = "idle_gpu"


@dataclass(frozen=True)
class Config:
    util_max_pct: float = IDLE_UTIL_PCT
    """Utilization at or below this is idle (the agent's idle GPU-seconds count the same)."""
    min_minutes: float = 30.0
    """Sustained this long. Shorter idle spells are start-up, checkpoint upload or
    evaluation pauses; 30 min matches common idle-reaper defaults (e.g. Kubeflow
    notebook culling checks in that range)."""
    gap_minutes: float = 2.0
    """A busy blip this short does not end an idle stretch."""
    critical_hours: float = 4.0
    """Idle this long is critical: a forgotten allocation, not a pause."""


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    alloc, gpu = v.alloc, v.gpu
    if not alloc.size or "gpu_util" not in gpu.values:
        return []
    rows = alloc.keys["gpu_row"].to_numpy()
    ok = rows >= 0
    util = np.full((alloc.size, v.n), np.nan, np.float32)
    util[ok] = gpu.values["gpu_util"][rows[ok]]
    share = alloc.values["share"]
    idle = (share > 0) & (util <= config.util_max_pct)
    found = runs(idle, min_len=v.span(config.min_minutes),
                 max_gap=v.gap(config.gap_minutes))
    out = []
    for r in found:
        k = alloc.keys.iloc[r.row]
        span = slice(r.start, r.end)
        held = np.nan_to_num(share[r.row, span])
        hours = (r.end - r.start) * v.step / 3600
        out.append(Finding(
            kind=KIND, severity="critical" if hours >= config.critical_hours else "warning",
            start=float(v.begins(r.start)), end=float(v.begins(r.end)),
            namespace=k["namespace"], training_job=k["job"], hostname=k["Hostname"], gpu=k["gpu"],
            pod=k["pod"], wasted_gpu_hours=float(held.sum() * v.step / 3600),
            evidence={"idle_hours": hours, "mean_util_pct": fmean(util[r.row, span]),
                      "share": float(np.nanmax(share[r.row, span])),
                      "util_threshold_pct": config.util_max_pct},
            recommendation=ADVICE.get(getattr(v.classes.get((k["namespace"], k["job"])), "name", None), ADVICE[None]),
        ))
    return out


# What releases an idle GPU depends on what holds it.
ADVICE = {
    INTERACTIVE: "Cull the idle notebook (Kubeflow notebook culling, JupyterHub's idle culler) so its GPU "
                 "returns to the pool; a MIG slice or a time-sliced share suits exploratory work.",
    SERVING: "Scale the idle server in (to zero with KEDA or Knative where traffic allows), or serve from a "
             "MIG slice or a time-sliced share instead of a whole GPU.",
    None: "Release the GPU: delete the idle pod or give it an idle timeout "
          "(activeDeadlineSeconds or a TTL for jobs, culling for notebooks).",
}
