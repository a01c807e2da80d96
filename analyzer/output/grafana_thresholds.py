"""The figures the Grafana dashboards (manifests/grafana/*.json) share with the detectors and
the rules, set from a DetectorConfig: the idle threshold of the fleet dashboard's GPU panel,
the goodput alert's threshold on the training-job dashboard's Goodput panel. Everything else
in a dashboard is written by hand; `burnrate rules` rewrites these
(docs/thresholds.md), and tests/test_rule_thresholds.py fails while a shipped dashboard holds
other figures than the defaults give.
"""
from __future__ import annotations

import json
from typing import Callable

from burnrate.exporter import rules_yaml as Y
from burnrate.exporter.ledger_rules import GOODPUT_LOW, GOODPUT_LOW_FOR

from ..detectors import DetectorConfig

IDLE_PANEL = "GPUs: allocated, idle, unallocated"
GOODPUT_PANEL = "Goodput"
ALLOCATED = "max by (UUID) (burnrate_gpu_allocated == 1)"


def _panel(dashboard: dict, title: str) -> dict:
    [panel] = [p for p in dashboard["panels"] if p.get("title") == title and p.get("type") != "row"]
    return panel


def _target(panel: dict, ref: str) -> dict:
    [target] = [t for t in panel["targets"] if t["refId"] == ref]
    return target


def _fleet_cost(dashboard: dict, config: DetectorConfig) -> None:
    pct = f"{config.idle_gpu.util_max_pct:g}"
    panel = _panel(dashboard, IDLE_PANEL)
    panel["description"] = (f"Idle: allocated, at most {pct}% utilization on average over the rate interval "
                            "(the idle_gpu finding's threshold).")
    idle = _target(panel, "B")
    idle["expr"] = (f"count(max by (UUID) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[$__rate_interval])) <= {pct} "
                    f"and on(UUID) {ALLOCATED}) or vector(0)")
    idle["legendFormat"] = f"idle (allocated, at most {pct}% utilization)"


def _training_job(dashboard: dict, config: DetectorConfig) -> None:
    panel = _panel(dashboard, GOODPUT_PANEL)
    panel["description"] = ("The share of the GPU-time the job holds that went into its ranks' compute, over "
                            "5-minute windows (cluster_namespace_training_job:burnrate_goodput:ratio, from the "
                            f"burnrate-ledger recording rules). TrainingGoodputLow warns below {GOODPUT_LOW:.0%} "
                            f"for {Y.spelled(GOODPUT_LOW_FOR)}.")
    [_, warn, _] = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    warn["value"] = GOODPUT_LOW


# By the dashboard's uid, which stays whatever the file is called.
SETTERS: dict[str, Callable[[dict, DetectorConfig], None]] = {
    "burnrate-fleet-cost": _fleet_cost,
    "burnrate-training-job": _training_job,
}


class DashboardError(ValueError):
    """A file that is not one of burnrate's dashboards; the message is one line."""


def dashboard_text(text: str, config: DetectorConfig = DetectorConfig()) -> str:
    """A dashboard's JSON with its thresholds set from `config`, written as the shipped files are."""
    try:
        dashboard = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DashboardError(f"not JSON: {exc}") from None
    uid = dashboard.get("uid") if isinstance(dashboard, dict) else None
    if uid not in SETTERS:
        raise DashboardError(f"not a burnrate dashboard (uid {uid!r}; known: {', '.join(SETTERS)})")
    try:
        SETTERS[uid](dashboard, config)
    except (KeyError, ValueError, TypeError):
        raise DashboardError(f"{uid}: the panels whose thresholds are set are not as shipped") from None
    return json.dumps(dashboard, indent=2) + "\n"
