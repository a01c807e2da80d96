"""`diverging`: training that has blown up; every step after it is wasted.

Signals, strongest first: a non-finite loss or gradient norm; the loss at twice its
recent mean for several reports in a row; gradient-norm spikes far above their
recent level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Finding, iso
from ..grid.frames import Frames
from ..grid.views import Views, median_over_rows, trailing_mean

KIND = "diverging"


@dataclass(frozen=True)
class Config:
    loss_ratio: float = 2.0
    """Loss at or above this multiple of its recent mean is a spike. Healthy loss
    curves fall or wobble by percents between reports; doubling is not noise."""
    loss_reports: int = 3
    """...for this many consecutive reports, so that one bad batch does not count."""
    history_minutes: float = 30.0
    """The recent mean and median look back this far."""
    grad_ratio: float = 10.0
    """A gradient norm at this multiple of its recent mean is a spike (clipped
    training runs near the clip value; an order of magnitude above is instability)."""
    grad_reports: int = 3
    """Spikes in this many consecutive reports fire."""


def _first_finite_seen(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """True from the first finite report on: a gauge that was never set reads as NaN
    in a recording, and only a NaN after real values is a diverged loss."""
    return np.maximum.accumulate(present & np.isfinite(values), axis=1)


def non_finite(v: Views, rows: np.ndarray) -> np.ndarray:
    """(rank, bin) True where a rank reported a loss or a gradient norm that is infinite, or NaN
    after finite ones (NaN alone may be a gauge never set): the model it trains has blown up,
    or its optimizer skipped the step. The finding starts no later than the first; the
    ledger's `diverged` is the step time of the steps they report (docs/ledger.md)."""
    present = v.rank.present[rows]
    bad = np.zeros(present.shape, dtype=bool)
    for name in ("loss", "grad_norm"):
        if name in v.rank.values:
            values = v.rank.values[name][rows]
            bad |= present & (np.isinf(values) | _first_finite_seen(values, present) & np.isnan(values))
    return bad


def _sustained_spike(values: np.ndarray, mean: np.ndarray, fresh: np.ndarray, ratio: float, count: int) -> int:
    """The first bin from which `count` reports in a row stay at or above `ratio` times
    the mean before that bin, or -1. The level is held from the spike's start: a
    trailing mean that took in the spike would soon call a blown-up loss normal.
    Only `fresh` bins are reports: a step finer than the reports repeats each one into
    several bins (analyzer.grid.holding), and one bad batch must not count three times."""
    report = np.flatnonzero(fresh)
    values, level = values[report], mean[report]
    with np.errstate(invalid="ignore"):
        spiked = np.isfinite(values) & (values >= ratio * level)
    for start in np.flatnonzero(spiked):
        reports = values[start:start + count]
        if len(reports) == count and np.all(np.isfinite(reports) & (reports >= ratio * level[start])):
            return int(report[start])
    return -1


def _fresh(v: Views, rows: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The bins where a new report arrived: a new sample in which some rank's step
    counter moved, or its series began. A sample held over into later bins is no
    new report, though the steps it stands for are spread over them (analyzer.grid.views).
    Without step counters every bin with a new sample counts."""
    sampled = present if v.rank.sampled is None else v.rank.sampled[rows]
    seen = present.any(axis=0)
    if "steps" not in v.rank.values:
        return sampled.any(axis=0)
    moved = ((np.nan_to_num(v.rank.values["steps"][rows]) != 0) & sampled).any(axis=0)
    began = seen & ~np.r_[False, seen[:-1]]
    return moved | began


def detect(data: Frames | Views, config: Config = Config()) -> list[Finding]:
    v = Views.of(data)
    rank = v.rank
    if not rank.size or "loss" not in rank.values:
        return []
    history = v.span(config.history_minutes)
    alloc_rows = v.job_rows(v.alloc)
    out = []
    for job, rows in v.job_rows(rank).items():
        present = rank.present[rows]
        loss = rank.values["loss"][rows].astype(np.float64)
        grad = rank.values["grad_norm"][rows].astype(np.float64) if "grad_norm" in rank.values else None
        onsets: dict[str, int] = {}
        nonfinite = non_finite(v, rows).any(axis=0)
        if nonfinite.any():
            onsets["non_finite"] = int(np.argmax(nonfinite))
        # One loss per job: ranks report the same all-reduced loss, or their own; the median is robust.
        job_loss = _job_median(loss, present)
        mean = trailing_mean(job_loss[None], history)[0]
        fresh = _fresh(v, rows, present)
        at = _sustained_spike(job_loss, mean, fresh, config.loss_ratio, config.loss_reports)
        if at >= 0:
            onsets["loss_spike"] = at
        if grad is not None:
            job_grad = _job_median(grad, present)
            gmean = trailing_mean(job_grad[None], history)[0]
            at = _sustained_spike(job_grad, gmean, fresh, config.grad_ratio, config.grad_reports)
            if at >= 0:
                onsets["grad_norm_spike"] = at
        if not onsets:
            continue
        start = min(onsets.values())
        end = int(np.nonzero(present.any(axis=0))[0].max()) + 1
        if alloc_rows.get(job) is not None:
            held = np.nan_to_num(v.alloc.values["share"][alloc_rows[job]]).sum(axis=0)
            end = max(end, int(np.nonzero(held > 0)[0].max()) + 1) if (held > 0).any() else end
            gpu_hours = float(held[start:end].sum() * v.step / 3600)
        else:
            gpu_hours = float(present[:, start:end].sum() * v.step / 3600)
        evidence = {"signals": sorted(onsets, key=onsets.get),
                    **{f"{name}_at": _iso(v, col) for name, col in onsets.items()},
                    "loss_before": _last_finite(job_loss[:start]), "loss_after": _last(job_loss[start:end])}
        if np.isfinite(mean[start]):
            evidence["loss_recent_mean"] = float(mean[start])
        if grad is not None:
            finite = grad[:, start:end][np.isfinite(grad[:, start:end])]
            if finite.size:
                evidence["grad_norm_max"] = float(finite.max())
        out.append(Finding(
            kind=KIND, severity="critical" if "non_finite" in onsets else "warning",
            start=float(v.begins(start)), end=float(v.begins(end)), namespace=job[0], training_job=job[1],
            wasted_gpu_hours=gpu_hours, evidence=evidence,
            recommendation="Stop the run and resume from the last checkpoint before the divergence with a lower "
                           "learning rate (or longer warm-up) and gradient clipping; check the data around that step.",
        ))
    return out


def _job_median(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    return median_over_rows(np.where(present, values, np.nan))


def _iso(v: Views, col: int) -> str:
    return iso(float(v.begins(col)))


def _last_finite(values: np.ndarray) -> float | None:
    ok = np.isfinite(values)
    return float(values[ok][-1]) if ok.any() else None


def _last(values: np.ndarray) -> float | None:
    """The last value; a non-finite one is kept (as its name in JSON): it is the evidence."""
    values = np.asarray(values, np.float64)
    return float(values[-1]) if len(values) else None
