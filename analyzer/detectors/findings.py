"""The Finding record: one problem, where it happened, what it cost and what to do.

Detectors fill everything but `wasted_dollars`; the cost model prices the wasted
GPU-hours at the node's real rate (`analyzer.costing.cost.price_findings`), then counts each
GPU-second a job held under one of its findings at most (`analyzer.costing.cost.held_within_jobs`),
so that no job's waste exceeds its cost.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..grid.frames import iso

KINDS = ("dataloader_starvation", "idle_gpu", "unallocated_gpu", "straggler", "stalled",
         "diverging", "thermal_throttle", "gpu_error", "low_mfu", "underused_gpu",
         "lost_progress", "checkpoint_overhead", "slow_startup", "held_after_exit", "oversized_serving")
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: str
    start: float                       # unix seconds
    end: float
    namespace: str | None = None
    training_job: str | None = None
    hostname: str | None = None        # serialized as `Hostname`, the label's name
    gpu: str | None = None
    pod: str | None = None
    rank: int | None = None
    wasted_gpu_hours: float | None = None
    wasted_dollars: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    recommendation: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def job(self) -> tuple[str, str] | None:
        if self.namespace is None or self.training_job is None:
            return None
        return self.namespace, self.training_job

    def to_dict(self) -> dict[str, Any]:
        """The shape docs/report.md gives: ISO-8601 times, `Hostname`, nulls for the unknown."""
        return {
            "kind": self.kind, "severity": self.severity,
            "namespace": self.namespace, "training_job": self.training_job,
            "Hostname": self.hostname, "gpu": self.gpu, "pod": self.pod, "rank": self.rank,
            "start": iso(self.start), "end": iso(self.end),
            "wasted_gpu_hours": _number(self.wasted_gpu_hours),
            "wasted_dollars": _number(self.wasted_dollars),
            "evidence": {k: _plain(v) for k, v in self.evidence.items()},
            "recommendation": self.recommendation,
        }


def _number(value: float | None, digits: int = 4) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits)


def _plain(value: Any) -> Any:
    """Evidence as JSON-safe plain values; a non-finite number is kept as its name
    ("nan", "inf") because a NaN loss is itself the evidence."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):          # numpy scalars
        value = value.item()
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else str(value)
    return value
