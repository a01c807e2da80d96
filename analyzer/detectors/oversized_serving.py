"""`oversized_serving`: a serving fleet that runs more replicas than its traffic needs.

Each hour (UTC clock hours) the fleet's traffic is the work its GPUs did: the sum over
its GPUs of utilization/100, in GPU-equivalents. Divided by the target utilization a
right-sized server runs at (`underused_gpu.target_util_pct`: one definition of the
headroom) and rounded up to whole replicas, it is the GPUs that hour needed. An hour in
which the whole fleet's work never exceeds what `idle_gpu` calls idle on one GPU had no
traffic: zero replicas would have served it. Against what the fleet held, three
schedules are priced: a fixed fleet sized for the peak hour, an autoscaler that follows
the hours but keeps one replica, and one that also scales to zero in the quiet hours.

The surplus replicas of a serving fleet are what leaves its GPUs idle or underused, so
this finding explains those two on the same job (analyzer.detectors.EXPLAINED_BY): the
waste is counted once, as what the fleet held beyond what its traffic needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import idle_gpu, underused_gpu
from .findings import Finding, iso
from ..grid.frames import Frames
from ..grid.views import Views
from ..grid.workloads import SERVING

KIND = "oversized_serving"
SCHEDULES = ("fixed_at_peak", "autoscaled", "scale_to_zero")
# A quotient of floats a hair above a whole number is that number, not the next replica.
_ROUNDING = 1e-6
_WHOLE_HOUR_H = 0.5      # an hour held at least this long speaks for the hour


@dataclass(frozen=True)
class Config:
    min_saved_pct: float = 10.0
    """Scaling to the traffic would save at least this share of the fleet's GPU-hours:
    below it, the hourly rounding to whole replicas is most of the difference."""


def detect(data: Frames | Views, config: Config = Config(), underused: underused_gpu.Config = underused_gpu.Config(),
           idle: idle_gpu.Config = idle_gpu.Config()) -> list[Finding]:
    v = Views.of(data)
    alloc, gpu = v.alloc, v.gpu
    if not alloc.size or "gpu_util" not in gpu.values:
        return []
    out = []
    for job, rows in v.job_rows(alloc).items():
        kind = v.classes.get(job)
        if kind is None or kind.name != SERVING:
            continue
        sized = rightsize(v, rows, underused.target_util_pct, idle.util_max_pct)
        # A fleet without any traffic in the window is idle (idle_gpu's), not one to size.
        if sized is None or sized["present_hours"] < underused.min_hours or not sized["peak_gpus"]:
            continue
        saved = sized["saved_gpu_hours"]["scale_to_zero"]
        if saved < config.min_saved_pct / 100 * sized["fleet_gpu_hours"]:
            continue
        start, end = sized.pop("start"), sized.pop("end")
        evidence = {**sized, "class": kind.name, "target_util_pct": underused.target_util_pct,
                    "idle_util_pct": idle.util_max_pct}
        out.append(Finding(kind=KIND, severity="warning", start=start, end=end, namespace=job[0],
                           training_job=job[1], wasted_gpu_hours=saved, evidence=evidence,
                           recommendation=advice(evidence)))
    return out


def rightsize(v: Views, rows: np.ndarray, target_pct: float, idle_pct: float) -> dict[str, Any] | None:
    """The GPUs a serving job's traffic needed each hour, and what each schedule would have saved."""
    gpu_rows = v.alloc.keys["gpu_row"].to_numpy()[rows]
    rows = rows[gpu_rows >= 0]
    if not len(rows) or target_pct <= 0:
        return None
    share = np.nan_to_num(v.alloc.values["share"][rows])
    util = v.gpu.values["gpu_util"][v.alloc.keys["gpu_row"].to_numpy()[rows]]
    held_at = (share > 0) & np.isfinite(util)
    held = (share * held_at).sum(axis=0)
    busy = (share * np.where(held_at, util, 0.0)).sum(axis=0) / 100
    present = np.flatnonzero(held > 0)
    if not len(present):
        return None
    per_replica = replica_gpus(v.alloc.keys["pod"].to_numpy()[rows])
    hours = np.floor(v.time(present) / 3600).astype(np.int64)
    step_h = v.step / 3600
    needed, held_h, present_h = {}, {}, {}
    for hour in np.unique(hours):
        cols = present[hours == hour]
        quiet = busy[cols].max() <= idle_pct / 100
        gpus = 0 if quiet else max(math.ceil(busy[cols].mean() / (target_pct / 100) - _ROUNDING), 1)
        needed[int(hour)] = math.ceil(gpus / per_replica) * per_replica
        held_h[int(hour)] = float(held[cols].sum() * step_h)
        present_h[int(hour)] = len(cols) * step_h
    peak = max(needed.values())
    schedules = {"fixed_at_peak": lambda n: peak, "autoscaled": lambda n: max(n, per_replica),
                 "scale_to_zero": lambda n: n}
    saved = {name: sum(max(held_h[h] - run(n) * present_h[h], 0.0) for h, n in needed.items())
             for name, run in schedules.items()}
    # The floor and the quiet hours are read from hours the job held for at least half their
    # length: a minute at the window's edge is no hour's traffic.
    whole = {h: n for h, n in needed.items() if present_h[h] >= _WHOLE_HOUR_H} or needed
    by_hour_of_day: dict[int, list[int]] = {}
    for hour, n in whole.items():
        by_hour_of_day.setdefault(hour % 24, []).append(n)
    daily = {f"{h:02d}": max(ns) for h, ns in sorted(by_hour_of_day.items())}
    busy_hours = [n for n in whole.values() if n > 0]
    fleet = float(held.max())
    return {
        "start": float(v.begins(present[0])), "end": float(v.begins(present[-1] + 1)),
        "gpus_per_replica": per_replica, "fleet_gpus": fleet,
        "fleet_replicas": math.ceil(fleet / per_replica - _ROUNDING),
        "fleet_gpu_hours": float(sum(held_h.values())), "present_hours": float(sum(present_h.values())),
        "peak_gpus": peak, "peak_replicas": peak // per_replica,
        "autoscale_min_replicas": (min(busy_hours) if busy_hours else per_replica) // per_replica,
        "autoscale_max_replicas": max(peak // per_replica, 1),
        "zero_hours_of_day": [int(h) for h, ns in sorted(by_hour_of_day.items()) if max(ns) == 0],
        "needed_gpus_by_hour": {iso(h * 3600.0): n for h, n in sorted(needed.items())},
        "needed_gpus_by_hour_of_day": daily,
        "saved_gpu_hours": saved,
    }


def replica_gpus(pods: np.ndarray) -> int:
    """GPUs one replica holds: the most common count of GPU rows per pod."""
    _, per_pod = np.unique(pods, return_counts=True)
    counts, n = np.unique(per_pod, return_counts=True)
    return int(counts[np.argmax(n)])


def advice(e: dict[str, Any]) -> str:
    zero = e["zero_hours_of_day"]
    quiet = (f"; scale to zero in the hours without traffic ({hour_ranges(zero)} UTC) with KEDA or Knative"
             if zero else "")
    return (f"Run {e['peak_replicas']} replicas at the peak, not {e['fleet_replicas']}: autoscale between "
            f"{e['autoscale_min_replicas']} and {e['autoscale_max_replicas']} replicas (HPA on GPU utilization "
            f"or request rate, target {e['target_util_pct']:g}% utilization){quiet}.")


def hour_ranges(hours: list[int]) -> str:
    """[0, 1, 2, 5] -> "00-03h, 05-06h"."""
    spans: list[list[int]] = []
    for h in hours:
        if spans and spans[-1][1] == h:
            spans[-1][1] = h + 1
        else:
            spans.append([h, h + 1])
    return ", ".join(f"{a:02d}-{b:02d}h" for a, b in spans)


def serving_blocks(findings: list[Finding], jobs: list) -> list[dict[str, Any]]:
    """The report's `serving` block: per right-sized serving job, its needed-GPU profile, the
    replicas to run and what each schedule saves, in GPU-hours and at the job's own rate."""
    rates = {(j.namespace, j.training_job): j.cost_dollars / j.gpu_hours for j in jobs
             if j.cost_dollars is not None and j.gpu_hours > 0}
    out = []
    for f in findings:
        if f.kind != KIND:
            continue
        e, rate = f.evidence, rates.get(f.job)
        out.append({
            "namespace": f.namespace, "training_job": f.training_job,
            **{k: e[k] for k in ("gpus_per_replica", "fleet_replicas", "peak_gpus", "peak_replicas",
                                 "autoscale_min_replicas", "autoscale_max_replicas", "zero_hours_of_day",
                                 "needed_gpus_by_hour", "needed_gpus_by_hour_of_day", "target_util_pct")},
            "savings": {name: {"gpu_hours": round(e["saved_gpu_hours"][name], 4),
                               "dollars": None if rate is None else round(e["saved_gpu_hours"][name] * rate, 4)}
                        for name in SCHEDULES},
        })
    return out


def serving_lines(findings: list[Finding], jobs: list) -> list[str]:
    """The table's line per right-sized serving job."""
    def saved(s: dict[str, Any]) -> str:
        return f"{s['gpu_hours']:,.1f} GPU-h" + ("" if s["dollars"] is None else f" ${s['dollars']:,.2f}")
    return [f"{b['namespace']}/{b['training_job']}: {b['fleet_replicas']} replicas held, peak needs "
            f"{b['peak_replicas']}, autoscale {b['autoscale_min_replicas']}..{b['autoscale_max_replicas']}"
            + (f", zero {hour_ranges(b['zero_hours_of_day'])} UTC" if b["zero_hours_of_day"] else "")
            + "; saves " + ", ".join(f"{name.replace('_', ' ')} {saved(b['savings'][name])}" for name in SCHEDULES)
            for b in serving_blocks(findings, jobs)]
