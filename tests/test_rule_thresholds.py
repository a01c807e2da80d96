"""The alert rules fire where the analyzer's detectors do: the groups of
manifests/alerts/burnrate-rules.yaml that mirror the detectors, and the Grafana dashboards'
thresholds, are rendered from the detectors' `Config` (analyzer/output/alert_rules.py,
analyzer/output/grafana_thresholds.py). The shipped files must be what the defaults render now; each
detector field must land in its rule, whatever its value; a team's --detector-config renders
rules promtool accepts."""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml

from burnrate.analyzer.output import alert_rules as A
from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.detectors.config_file import detector_config, dump_detector_config
from burnrate.analyzer.output.grafana_thresholds import dashboard_text
from burnrate.analyzer.output.thresholds import regenerated, rules_text
from burnrate.exporter import rules_yaml as Y
from tests.conftest import PYTHON, ROOT, require
from tests.test_alert_rules import RULES

GRAFANA = os.path.join(ROOT, "manifests", "grafana")
GENERATED = [RULES] + sorted(os.path.join(GRAFANA, name) for name in os.listdir(GRAFANA) if name.endswith(".json"))
REGENERATE = "burnrate rules manifests/alerts/burnrate-rules.yaml manifests/grafana/*.json"
# Every figure the rules take from a detector moved off its default, none onto another's value.
MOVED = detector_config({
    "dataloader_starvation": {"warning_share": 0.08, "critical_share": 0.4, "window_minutes": 15, "min_minutes": 25},
    "straggler": {"slowdown": 1.25, "critical_slowdown": 1.75, "block_minutes": 3, "min_minutes": 45},
    "idle_gpu": {"util_max_pct": 7, "gap_minutes": 4, "min_minutes": 50, "critical_hours": 6},
    "thermal_throttle": {"clock_ratio": 0.8, "critical_ratio": 0.55, "min_minutes": 12},
    "diverging": {"loss_ratio": 3, "history_minutes": 20, "loss_reports": 4, "grad_ratio": 8, "grad_reports": 5},
    "stalled": {"interval_factor": 6, "floor_minutes": 16},
})
NUMBER_BEFORE_QUANTILE = r"([\d.]+) \* quantile"
WINDOW_MINUTES = r"\[(\d+)m\]"
FOR = "for"

# (alert, labels it carries, a pattern whose group is the figure (or FOR), the config's value)
CASES = [
    ("DataLoaderStarvation", {"severity": "warning"}, r">= ([\d.]+)\s*$",
     lambda d: d.dataloader_starvation.warning_share),
    ("DataLoaderStarvation", {"severity": "critical"}, r">= ([\d.]+)\s*$",
     lambda d: d.dataloader_starvation.critical_share),
    ("DataLoaderStarvation", {}, WINDOW_MINUTES, lambda d: d.dataloader_starvation.window_minutes),
    ("DataLoaderStarvation", {}, FOR, lambda d: d.dataloader_starvation.min_minutes),
    ("StragglerRank", {"severity": "warning"}, NUMBER_BEFORE_QUANTILE, lambda d: d.straggler.slowdown),
    ("StragglerRank", {"severity": "critical"}, NUMBER_BEFORE_QUANTILE, lambda d: d.straggler.critical_slowdown),
    ("StragglerRank", {}, WINDOW_MINUTES, lambda d: d.straggler.block_minutes),
    ("StragglerRank", {}, FOR, lambda d: d.straggler.min_minutes),
    ("GPUIdleWhileAllocated", {}, r"<= ([\d.]+)", lambda d: d.idle_gpu.util_max_pct),
    ("GPUIdleWhileAllocated", {}, WINDOW_MINUTES, lambda d: d.idle_gpu.gap_minutes),
    ("GPUIdleWhileAllocated", {"severity": "warning"}, FOR, lambda d: d.idle_gpu.min_minutes),
    ("GPUIdleWhileAllocated", {"severity": "critical"}, FOR, lambda d: d.idle_gpu.critical_hours * 60),
    ("GPUThermalThrottling", {"severity": "warning"}, NUMBER_BEFORE_QUANTILE,
     lambda d: d.thermal_throttle.clock_ratio),
    ("GPUThermalThrottling", {"severity": "critical"}, NUMBER_BEFORE_QUANTILE,
     lambda d: d.thermal_throttle.critical_ratio),
    ("GPUThermalThrottling", {}, FOR, lambda d: d.thermal_throttle.min_minutes),
    ("TrainingDiverging", {"signal": "loss_spike"}, NUMBER_BEFORE_QUANTILE, lambda d: d.diverging.loss_ratio),
    ("TrainingDiverging", {"signal": "loss_spike"}, WINDOW_MINUTES, lambda d: d.diverging.history_minutes),
    # Evaluated each minute: `for: Nm` is N + 1 evaluations in a row.
    ("TrainingDiverging", {"signal": "loss_spike"}, FOR, lambda d: d.diverging.loss_reports - 1),
    ("TrainingDiverging", {"signal": "grad_norm_spike"}, NUMBER_BEFORE_QUANTILE, lambda d: d.diverging.grad_ratio),
    ("TrainingDiverging", {"signal": "grad_norm_spike"}, FOR, lambda d: d.diverging.grad_reports - 1),
    ("TrainingStalled", {}, r"(\d+) \* \(", lambda d: d.stalled.interval_factor),
    ("TrainingStalled", {}, r"(\d+)\s*\)\s*or on", lambda d: d.stalled.floor_minutes * 60),
    ("TrainingStalled", {}, r"\+ (\d+)\s*\)", lambda d: d.stalled.floor_minutes * 60),
    # A save or an evaluation under way within the floor is no stall.
    ("TrainingStalled", {}, r"(?:checkpoint|eval)_seconds_total\[(\d+)s\]", lambda d: d.stalled.floor_minutes * 60),
]


def read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize("path", GENERATED, ids=os.path.basename)
def test_the_shipped_file_is_what_the_detectors_defaults_render(path):
    assert regenerated(path, read(path)) == read(path), f"{os.path.relpath(path, ROOT)} is stale: run {REGENERATE}"


def test_the_rendered_groups_read_back_as_the_groups():
    for config in (DetectorConfig(), MOVED):
        for name in A.GROUPS:
            assert yaml.safe_load(A.render(name, config)) == [A.group(name, config)], name
    shipped = {g["name"]: g for g in yaml.safe_load(read(RULES))["groups"]}
    assert all(shipped[name] == A.group(name) for name in A.GROUPS)


def minutes(duration: str) -> float:
    value, unit = re.fullmatch(r"(\d+)([smh])", duration).groups()
    return float(value) * {"s": 1 / 60, "m": 1, "h": 60}[unit]


@pytest.mark.parametrize("config", [DetectorConfig(), MOVED], ids=["defaults", "moved"])
@pytest.mark.parametrize("alert, labels, pattern, value", CASES,
                         ids=[f"{a}-{'-'.join(l.values()) or 'all'}-{p if p == FOR else 'expr'}"
                              for a, l, p, _ in CASES])
def test_each_threshold_lands_in_its_rule(config, alert, labels, pattern, value):
    rendered = [rule for name in A.GROUPS for rule in A.group(name, config)["rules"]
                if rule.get("alert") == alert and labels.items() <= rule.get("labels", {}).items()]
    assert rendered, f"no {alert} rule with labels {labels}"
    for rule in rendered:
        if pattern == FOR:
            assert minutes(rule["for"]) == pytest.approx(value(config)), (alert, labels)
        else:
            figures = re.findall(pattern, rule["expr"], flags=re.MULTILINE)
            assert figures, f"{alert} {labels}: {pattern!r} not in its expression"
            assert all(float(f) == pytest.approx(value(config)) for f in figures), (alert, labels, figures)


def test_the_words_follow_the_figures():
    """Comments and annotations say the thresholds the expressions use."""
    text = A.render(A.GPU, MOVED) + A.render(A.TRAINING, MOVED)
    for said in ("at or below 7% utilization for 50 minutes", "for 6 hours while a pod holds it",
                 "at least 25% longer per step", "below 80% of this GPU model's usual peak", "three times its recent",
                 "at least 8 times its mean over the 20 minutes", "for 5 evaluations in a row",
                 "max(6 usual step times, 16 minutes)", "waits for data"):
        assert said in text, said
    for default in ("2%", "30 minutes", "15%", "85%", "twice", "10 minutes)"):
        assert default not in text, default


def test_a_dashboard_takes_the_idle_threshold():
    fleet = json.loads(dashboard_text(read(os.path.join(GRAFANA, "burnrate-fleet-cost.json")), MOVED))
    [panel] = [p for p in fleet["panels"] if p.get("title") == "GPUs: allocated, idle, unallocated"]
    [idle] = [t for t in panel["targets"] if t["refId"] == "B"]
    assert "DCGM_FI_DEV_GPU_UTIL[$__rate_interval])) <= 7 and" in idle["expr"]
    assert "7%" in idle["legendFormat"] and "7%" in panel["description"]


def test_rules_rendered_for_a_team_pass_promtool(tmp_path):
    path = tmp_path / "burnrate-rules.yaml"
    path.write_text(rules_text(read(RULES), MOVED))
    proc = subprocess.run([require("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Only the rendered groups moved: the rest of the file is the shipped one, comments and all.
    outside = lambda text: re.sub(r"^  # BEGIN (\S+).*?^  # END \1\n", "", text, flags=re.M | re.S)
    assert outside(path.read_text()) == outside(read(RULES))


def run(*argv: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "burnrate", "rules", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_the_module_checks_rewrites_and_renders_a_teams_config(tmp_path):
    rules, dashboard = tmp_path / "rules.yaml", tmp_path / "fleet.json"
    rules.write_text(read(RULES).replace("<= 2,", "<= 3,"))
    dashboard.write_text(read(os.path.join(GRAFANA, "burnrate-fleet-cost.json")))
    proc = run("--check", str(rules), str(dashboard), cwd=str(tmp_path))
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"not as rendered: {rules} (run without --check to rewrite)"]
    assert run(str(rules), str(dashboard), cwd=str(tmp_path)).returncode == 0
    assert rules.read_text() == read(RULES)
    team = tmp_path / "team.yaml"
    team.write_text(dump_detector_config(MOVED))
    proc = run("--detector-config", str(team), str(rules), str(dashboard), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(rules.read_text())["groups"][:2] == [A.group(name, MOVED) for name in A.GROUPS]
    assert "<= 7 and" in dashboard.read_text()
    printed = run("--detector-config", str(team), cwd=str(tmp_path))
    assert printed.returncode == 0 and printed.stdout == "".join(A.render(name, MOVED) for name in A.GROUPS)


@pytest.mark.parametrize("argv, files, message", [
    (["{tmp}/missing.yaml"], {}, "burnrate rules: error: {tmp}/missing.yaml: No such file or directory"),
    (["{tmp}/bare.yaml"], {"bare.yaml": "groups: []\n"},
     "burnrate rules: error: {tmp}/bare.yaml: expected one '# BEGIN burnrate-training' ... '# END burnrate-training' block, found 0"),
    (["{tmp}/other.json"], {"other.json": '{"uid": "someone-else"}'},
     "burnrate rules: error: {tmp}/other.json: not a burnrate dashboard (uid 'someone-else'; known: burnrate-fleet-cost, "
     "burnrate-training-job)"),
    (["--detector-config", "{tmp}/bad.yaml"], {"bad.yaml": "idle_gpu:\n  util_max_pct: -1\n"},
     "burnrate rules: error: {tmp}/bad.yaml: idle_gpu.util_max_pct: expected a non-negative float, got -1"),
])
def test_user_mistakes_are_one_line(tmp_path, argv, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    proc = run(*[a.replace("{tmp}", str(tmp_path)) for a in argv], cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [message.replace("{tmp}", str(tmp_path))]


def test_durations_are_written_whole_in_their_largest_unit():
    assert [Y.duration(s) for s in (30, 60, 600, 1800, 3600, 5400, 14400, 0)] == [
        "30s", "1m", "10m", "30m", "1h", "90m", "4h", "0s"]
    assert [Y.spelled(d) for d in ("1m", "30m", "1h", "4h", "90s")] == [
        "1 minute", "30 minutes", "1 hour", "4 hours", "90 seconds"]
