"""The alert rules fire where the analyzer's detectors do: every threshold, window and
duration written into manifests/alerts/burnrate-rules.yaml equals its detector's
`Config` default, so that changing one without the other fails here."""
from __future__ import annotations

import re

import pytest

from burnrate.analyzer.detectors import DetectorConfig
from tests.test_alert_rules import load_rules

D = DetectorConfig()
NUMBER_BEFORE_QUANTILE = r"([\d.]+) \* quantile"
WINDOW_MINUTES = r"\[(\d+)m\]"
FOR = "for"

# (alert, labels it carries, a pattern whose group is the figure (or FOR), the detector's value)
CASES = [
    ("DataLoaderStarvation", {"severity": "warning"}, r">= ([\d.]+)\s*$", D.dataloader_starvation.warning_share),
    ("DataLoaderStarvation", {"severity": "critical"}, r">= ([\d.]+)\s*$", D.dataloader_starvation.critical_share),
    ("DataLoaderStarvation", {}, WINDOW_MINUTES, D.dataloader_starvation.window_minutes),
    ("DataLoaderStarvation", {}, FOR, D.dataloader_starvation.min_minutes),
    ("StragglerRank", {"severity": "warning"}, NUMBER_BEFORE_QUANTILE, D.straggler.slowdown),
    ("StragglerRank", {"severity": "critical"}, NUMBER_BEFORE_QUANTILE, D.straggler.critical_slowdown),
    ("StragglerRank", {}, WINDOW_MINUTES, D.straggler.block_minutes),
    ("StragglerRank", {}, FOR, D.straggler.min_minutes),
    ("GPUIdleWhileAllocated", {}, r"<= ([\d.]+)", D.idle_gpu.util_max_pct),
    ("GPUIdleWhileAllocated", {}, WINDOW_MINUTES, D.idle_gpu.gap_minutes),
    ("GPUIdleWhileAllocated", {"severity": "warning"}, FOR, D.idle_gpu.min_minutes),
    ("GPUIdleWhileAllocated", {"severity": "critical"}, FOR, D.idle_gpu.critical_hours * 60),
    ("GPUThermalThrottling", {"severity": "warning"}, NUMBER_BEFORE_QUANTILE, D.thermal_throttle.clock_ratio),
    ("GPUThermalThrottling", {"severity": "critical"}, NUMBER_BEFORE_QUANTILE, D.thermal_throttle.critical_ratio),
    ("GPUThermalThrottling", {}, FOR, D.thermal_throttle.min_minutes),
    ("TrainingDiverging", {"signal": "loss_spike"}, NUMBER_BEFORE_QUANTILE, D.diverging.loss_ratio),
    ("TrainingDiverging", {"signal": "loss_spike"}, WINDOW_MINUTES, D.diverging.history_minutes),
    # Evaluated each minute: `for: Nm` is N + 1 evaluations in a row.
    ("TrainingDiverging", {"signal": "loss_spike"}, FOR, D.diverging.loss_reports - 1),
    ("TrainingDiverging", {"signal": "grad_norm_spike"}, NUMBER_BEFORE_QUANTILE, D.diverging.grad_ratio),
    ("TrainingDiverging", {"signal": "grad_norm_spike"}, FOR, D.diverging.grad_reports - 1),
    ("TrainingStalled", {}, r"(\d+) \* \(", D.stalled.interval_factor),
    ("TrainingStalled", {}, r"\),\s*(\d+)\s*\)", D.stalled.floor_minutes * 60),
]


def rules(alert: str, labels: dict[str, str]) -> list[dict]:
    found = [rule for group in load_rules()["groups"] for rule in group["rules"]
             if rule.get("alert") == alert and labels.items() <= rule.get("labels", {}).items()]
    assert found, f"no {alert} rule with labels {labels}"
    return found


def minutes(duration: str) -> float:
    value, unit = re.fullmatch(r"(\d+)([mh])", duration).groups()
    return float(value) * (60 if unit == "h" else 1)


@pytest.mark.parametrize("alert, labels, pattern, expected", CASES,
                         ids=[f"{a}-{'-'.join(l.values()) or 'all'}-{p if p == FOR else 'expr'}" for a, l, p, _ in CASES])
def test_the_rules_thresholds_are_the_detectors(alert, labels, pattern, expected):
    for rule in rules(alert, labels):
        if pattern == FOR:
            assert minutes(rule["for"]) == pytest.approx(expected), (alert, labels)
        else:
            figures = re.findall(pattern, rule["expr"], flags=re.MULTILINE)
            assert figures, f"{alert} {labels}: {pattern!r} not in its expression"
            assert all(float(f) == pytest.approx(expected) for f in figures), (alert, labels, figures)
