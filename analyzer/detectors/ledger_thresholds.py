"""The thresholds of the findings read from the ledger (analyzer/costing/ledger_findings.py),
and the checkpoint interval they measure against: the ledger is made by the accounting, after
detection, but its thresholds are the detectors' like every other (`DetectorConfig.ledger`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

LOST_PROGRESS, CHECKPOINT_OVERHEAD, SLOW_STARTUP = "lost_progress", "checkpoint_overhead", "slow_startup"
HELD_AFTER_EXIT = "held_after_exit"
KINDS = (LOST_PROGRESS, CHECKPOINT_OVERHEAD, SLOW_STARTUP, HELD_AFTER_EXIT)


@dataclass(frozen=True)
class Config:
    lost_factor: float = 1.5
    """Lost progress per restart above this many times the expected loss at the advised interval
    (half an interval) is a finding: restarts land anywhere in an interval, so up to a whole one
    is lost by chance; 1.5 halves leaves room for that without hiding a cadence far too long."""
    overhead_factor: float = 2.0
    """Blocking saves above twice the optimal share of the loop (C/τ) are worth changing: at the
    optimum, saving and recomputing cost the same, and the total is flat near it."""
    overhead_min_share: float = 0.02
    """...and above 2% of the loop's time: below that, no change of cadence pays for a look."""
    startup_minutes: float = 10.0
    """A run that takes longer than this to its first step: a large image pulled each time, a
    model or data set loaded over the network, a slow checkpoint restore."""
    held_after_exit_minutes: float = 10.0
    """GPUs a job holds longer than this after its last process ended, with no run after it:
    pods left running (a sidecar, a shell, a job that failed and was never cleaned up). A pod
    that ends with its process gives its GPUs back within seconds."""


def advised_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's first-order optimum checkpoint interval (work between saves), τ = √(2CM) − C;
    Young's √(2CM) where C is not small against M."""
    young = math.sqrt(2.0 * save_seconds * mtbf_seconds)
    return young - save_seconds if save_seconds < 2.0 * mtbf_seconds else young
