"""`gpu_error`: XID events and GPUs that stopped answering NVML.

XIDs are the driver's error reports. Some point at the application (13, 31, 43),
most at the hardware or its links; a GPU that fell off the bus (79) or whose NVML
calls fail (`burnrate_gpu_up` 0) takes its job down with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Finding
from ..grid.frames import Frames
from ..grid.views import Views, build_grid, counter_delta, holder_of, runs

KIND = "gpu_error"
# NVIDIA's XID catalog: codes that mean the GPU (or its memory or links) needs
# service, as opposed to codes an application bug can cause.
CRITICAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140})


@dataclass(frozen=True)
class Config:
    merge_minutes: float = 60.0
    """Events closer than this are one episode (a failing GPU repeats its XIDs)."""


def _events(v: Views) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gpu row, time bin, xid code) of each XID event in the window."""
    xid = v.frames.xid
    if not len(xid):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    grid = build_grid(xid, ("UUID", "xid"), ("count",), v.start, v.step, v.n)
    count = grid.values["count"].astype(np.float64)
    new = np.nan_to_num(counter_delta(count)) > 0
    # A code's first sample after the window start is its first event (the agent
    # starts a code's series when it first happens).
    first = np.argmax(grid.present, axis=1)
    seen = grid.present.any(axis=1) & (first > 0)
    rows = np.nonzero(seen)[0]
    new[rows, first[rows]] |= np.nan_to_num(count[rows, first[rows]]) > 0
    row_of = {u: i for i, u in enumerate(v.gpu.keys["UUID"])}
    series, cols = np.nonzero(new)
    gpu_rows = np.array([row_of.get(u, -1) for u in grid.keys["UUID"]], np.int64)[series]
    codes = _xid_numbers(grid.keys["xid"].to_numpy())[series]
    ok = gpu_rows >= 0
    return gpu_rows[ok], cols[ok], codes[ok]


def _xid_numbers(values: np.ndarray) -> np.ndarray:
    return np.array([int(x) if str(x).isdigit() else -1 for x in values], np.int64)


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    gpu = v.gpu
    if not gpu.size:
        return []
    down = gpu.present & (gpu.values["up"] < 0.5) if "up" in gpu.values else np.zeros((gpu.size, v.n), bool)
    ev_rows, ev_cols, ev_codes = _events(v)
    mask = down.copy()
    mask[ev_rows, ev_cols] = True
    found = runs(mask, 1, v.gap(config.merge_minutes))
    out = []
    for r in found:
        k = gpu.keys.iloc[r.row]
        inside = (ev_rows == r.row) & (ev_cols >= r.start) & (ev_cols < r.end)
        codes, counts = np.unique(ev_codes[inside], return_counts=True)
        down_bins = down[r.row, r.start:r.end]
        share = v.held[r.row, r.start:r.end]
        serious = bool(down_bins.any()) or bool(set(codes.tolist()) & CRITICAL_XIDS)
        evidence = {"xid_events": {str(c): int(n) for c, n in zip(codes, counts)},
                    "down_minutes": float(down_bins.sum() * v.step / 60)}
        out.append(Finding(
            kind=KIND, severity="critical" if serious else "warning",
            start=float(v.begins(r.start)), end=float(v.begins(r.end)), hostname=k["Hostname"], gpu=k["gpu"],
            wasted_gpu_hours=float((share * down_bins).sum() * v.step / 3600), evidence=evidence,
            recommendation=("Drain the node and have the GPU reset or replaced; resume the job elsewhere from its "
                            "last checkpoint." if serious else
                            "Look up the XID codes in NVIDIA's XID catalog; if they recur, drain the node and run "
                            "the GPU diagnostics (dcgmi diag -r 3)."),
            **holder_of(v, r.row, r.start, r.end),
        ))
    return out
