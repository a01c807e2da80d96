"""`underused_gpu`: a server or a notebook that holds whole GPUs and uses little of them.

Not idle for long (that is `idle_gpu`, which explains this finding where both
hold: the waste is counted once), but a model server whose traffic fills a fifth of a
GPU, or a notebook that runs a cell now and then, pays for the whole GPU. A smaller
share (a MIG slice, a time-sliced replica) or fewer replicas would serve the same.
Training jobs are left to `low_mfu`, which measures what their GPUs achieve.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Finding
from ..grid.frames import Frames
from ..grid.workloads import INTERACTIVE, SERVING
from ..grid.views import Views, fmean

KIND = "underused_gpu"


@dataclass(frozen=True)
class Config:
    util_max_pct: float = 30.0
    """Mean utilization over the held time below this fires: the GPU does less than a
    third of what it could, so a half or a third of it would do (MIG's 3g and 2g
    profiles, or two to three time-sliced replicas)."""
    target_util_pct: float = 60.0
    """The utilization a right-sized share would run at: serving needs headroom for
    traffic peaks, so the wasted share is what lies beyond this, not beyond 100%."""
    min_hours: float = 2.0
    """Held at least this long in the window: a mean over minutes says little about
    a server's daily traffic."""


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    alloc, gpu = v.alloc, v.gpu
    if not alloc.size or "gpu_util" not in gpu.values:
        return []
    out = []
    for job, rows in v.job_rows(alloc).items():
        kind = v.classes.get(job)
        if kind is None or kind.name not in (SERVING, INTERACTIVE):
            continue
        rows = rows[alloc.keys["gpu_row"].to_numpy()[rows] >= 0]
        share = np.nan_to_num(alloc.values["share"][rows])
        util = gpu.values["gpu_util"][alloc.keys["gpu_row"].to_numpy()[rows]]
        held = (share > 0) & np.isfinite(util)
        columns = np.flatnonzero(held.any(axis=0))
        mean = fmean(util[held])
        if mean is None or len(columns) * v.step / 3600 < config.min_hours or mean >= config.util_max_pct:
            continue
        gpu_hours = float((share * held).sum() * v.step / 3600)
        keys = alloc.keys.iloc[rows]
        hosts = sorted(set(keys["Hostname"]))
        out.append(Finding(
            kind=KIND, severity="warning", start=float(v.begins(columns[0])), end=float(v.begins(columns[-1] + 1)),
            namespace=job[0], training_job=job[1], hostname=hosts[0] if len(hosts) == 1 else None,
            gpu=",".join(sorted(set(keys["gpu"]), key=int)) if len(hosts) == 1 else None,
            pod=keys["pod"].iloc[0] if keys["pod"].nunique() == 1 else None,
            wasted_gpu_hours=gpu_hours * (1 - mean / config.target_util_pct),
            evidence={"mean_util_pct": mean, "held_gpu_hours": gpu_hours, "class": kind.name,
                      "target_util_pct": config.target_util_pct},
            recommendation=ADVICE[kind.name],
        ))
    return out


ADVICE = {
    SERVING: "Right-size the server: serve from a MIG slice or a time-sliced share, or run fewer replicas "
             "(autoscale on GPU utilization or request rate) so each GPU carries more of the traffic.",
    INTERACTIVE: "Give the notebook a MIG slice or a time-sliced share instead of whole GPUs; "
                 "run long jobs as batch jobs that release their GPUs when done.",
}
