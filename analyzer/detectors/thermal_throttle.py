"""`thermal_throttle`: a GPU slowing its clocks because it runs too hot.

NVML's clocks-event reasons name thermal slowdown explicitly (software 0x20,
hardware 0x40); a low SM clock at the same time confirms it costs speed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from burnrate.exporter import throttle

from .findings import Finding
from ..grid.frames import Frames
from ..grid.views import Views, fmean, holder_of, runs

KIND = "thermal_throttle"


@dataclass(frozen=True)
class Config:
    clock_ratio: float = 0.85
    """SM clock below this share of the model's usual peak clock (the fleet median of
    each GPU's highest clock in the window). Boost clocks vary a few percent with
    power and load; 15% below is a real slowdown."""
    min_minutes: float = 10.0
    """Sustained this long: brief thermal events at load changes are normal."""
    gap_minutes: float = 2.0
    critical_ratio: float = 0.6


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    gpu = v.gpu
    if not gpu.size or "throttle_reasons" not in gpu.values or "sm_clock_mhz" not in gpu.values:
        return []
    clock = gpu.values["sm_clock_mhz"]
    bits = np.nan_to_num(gpu.values["throttle_reasons"]).astype(np.int64)
    peak = np.full(gpu.size, np.nan)
    has = np.isfinite(clock).any(axis=1)
    peak[has] = np.nanmax(clock[has], axis=1)
    model = gpu.keys["modelName"].astype(str).to_numpy()
    # Fleet mode's parts are given the peaks of all its GPUs (analyzer.fleet.partition).
    usual = v.frames.usual_peak_sm_clock_mhz or _median_by_model(peak, model)
    ref = np.array([usual.get(name, np.nan) for name in model], np.float64)
    with np.errstate(invalid="ignore"):
        slow = (bits & throttle.THERMAL).astype(bool) & (clock < config.clock_ratio * ref[:, None])
    found = runs(slow, v.span(config.min_minutes), v.gap(config.gap_minutes))
    out = []
    for r in found:
        k = gpu.keys.iloc[r.row]
        span = slice(r.start, r.end)
        ratio = np.clip(clock[r.row, span] / ref[r.row], 0, 1)
        mean_ratio = fmean(ratio) or 0.0
        holder = holder_of(v, r.row, r.start, r.end)
        codes = np.unique(bits[r.row, span][(bits[r.row, span] & throttle.THERMAL) != 0])
        out.append(Finding(
            kind=KIND, severity="critical" if mean_ratio < config.critical_ratio else "warning",
            start=float(v.begins(r.start)), end=float(v.begins(r.end)), hostname=k["Hostname"], gpu=k["gpu"],
            wasted_gpu_hours=float(np.nansum(1 - ratio) * v.step / 3600),
            evidence={"sm_clock_mhz": fmean(clock[r.row, span]), "usual_peak_sm_clock_mhz": float(ref[r.row]),
                      "clock_ratio": mean_ratio, "throttle_reasons": [hex(int(c)) for c in codes],
                      "minutes": (r.end - r.start) * v.step / 60},
            recommendation="Check the node's cooling (fans, airflow, inlet temperature, blocked heatsinks) and "
                           "drain it for service if the GPU keeps throttling.",
            **holder,
        ))
    return out


def usual_peaks(gpu: pd.DataFrame) -> dict[str, float]:
    """Each model's usual peak SM clock over a gpu frame: the median over the GPUs (by UUID)
    of each one's highest clock."""
    if not len(gpu) or "sm_clock_mhz" not in gpu.columns:
        return {}
    peaks = gpu.groupby("UUID", observed=True).agg(peak=("sm_clock_mhz", "max"), model=("modelName", "first"))
    return _median_by_model(peaks["peak"].to_numpy(np.float64), peaks["model"].astype(str).to_numpy())


def _median_by_model(peak: np.ndarray, model: np.ndarray) -> dict[str, float]:
    """The median of the GPUs' peak clocks per model, over the GPUs that have one."""
    has = np.isfinite(peak)
    return {str(name): float(np.median(peak[has & (model == name)])) for name in np.unique(model[has])}
