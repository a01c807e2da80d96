"""One threshold, one owner: the idle threshold of a --detector-config moves the findings, the
accounting's idle GPU-hours, the dashboard's figures and the rendered rules together; the
agent's idle counter keeps the contract's, and fleet mode says where the two differ
(docs/thresholds.md)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.detectors.config_file import load_detector_config
from burnrate.analyzer.fleet.mode import analyze_fleet
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.grafana_thresholds import dashboard_text
from burnrate.analyzer.sources.openmetrics import write_openmetrics
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.sources import PrometheusSource, RecordingSource
from burnrate.analyzer.fleet.rollups import idle_threshold_note
from burnrate.analyzer.output.thresholds import rules_text
from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS
from burnrate.dashboard.app import create_app
from burnrate.dashboard.data import DataService
from burnrate.dashboard.timerange import from_query
from burnrate.dashboard.ui import current_service
from burnrate.exporter.catalog import IDLE_UTIL_PCT
from burnrate.simulator.simulate import Spec, simulate
from tests.conftest import PYTHON, ROOT
from tests.processes import prometheus, promtool_backfill
from tests.recorded_counters import write_gpu_time
from tests.rollup_stores import evaluate_in_prometheus, rollup_rules
from tests.test_alert_rules import RULES

END = 1_795_000_000.0
SPEC = Spec(nodes=2, gpus_per_node=8, hours=1.0, step_s=15.0, seed=0, end=END)
IDLE_PCT = 40
OVERRIDE = f"idle_gpu:\n  util_max_pct: {IDLE_PCT}\n"


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("override") / "recording")
    simulate(root, SPEC)
    return root


def analyze(recording: str, *argv: str) -> dict:
    proc = subprocess.run([PYTHON, "-m", "burnrate", "analyze", "--recording", recording, "--format", "json", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def dashboard_idle_gpu_hours(service: DataService) -> float:
    """The Fleet page's idle GPUs over the window, in GPU-hours."""
    a = service.analysis(from_query("", service.default_range))
    fleet = a.fleet
    per_bucket = -(-a.views.n // len(fleet.idle))
    return float(fleet.idle.sum()) * per_bucket * a.views.step / 3600


def test_the_idle_detectors_default_is_the_contracts_constant():
    assert DetectorConfig().idle_gpu.util_max_pct == IDLE_UTIL_PCT


def test_an_idle_threshold_moves_findings_accounting_dashboard_and_rules_together(recording, tmp_path):
    path = tmp_path / "detectors.yaml"
    path.write_text(OVERRIDE)
    config = load_detector_config(str(path))
    default, moved = analyze(recording), analyze(recording, "--detector-config", str(path))
    # The accounting: GPUs between 2% and 40% utilization are idle now, and the report says at what.
    assert default["accounting"]["idle_util_pct"] == IDLE_UTIL_PCT
    assert moved["accounting"]["idle_util_pct"] == IDLE_PCT
    assert moved["accounting"]["idle_gpu_hours"] > default["accounting"]["idle_gpu_hours"] + 1.0
    for field in ("observed_gpu_hours", "allocated_gpu_hours"):
        assert moved["accounting"][field] == default["accounting"][field], field
    assert moved["accounting"]["busy_gpu_hours"] == pytest.approx(
        default["accounting"]["busy_gpu_hours"] - (moved["accounting"]["idle_gpu_hours"]
                                                    - default["accounting"]["idle_gpu_hours"]), abs=1e-3)
    # The findings judge by the same threshold.
    idle = [f for f in moved["findings"] if f["kind"] == "idle_gpu"]
    assert idle and all(f["evidence"]["util_threshold_pct"] == IDLE_PCT for f in idle)
    # The dashboard: the Fleet page's idle GPUs are the accounting's idle GPU-hours, either way.
    catalog = load_catalog()
    assert dashboard_idle_gpu_hours(DataService(RecordingSource(recording), catalog)) == pytest.approx(
        default["accounting"]["idle_gpu_hours"], abs=1e-4)
    app = create_app(RecordingSource(recording), catalog, refresh_s=3600, config=config)
    with app.server.app_context():
        assert dashboard_idle_gpu_hours(current_service()) == pytest.approx(
            moved["accounting"]["idle_gpu_hours"], abs=1e-4)
        from burnrate.dashboard.pages import cost     # registered by create_app
        with app.server.test_request_context():
            page = str(cost.update("", 1))
    assert f"{moved['accounting']['idle_gpu_hours']:,.1f}" in page
    assert f"allocated, utilization at or below {IDLE_PCT}%" in page
    # The rules a team renders with the same file alert at the same threshold.
    with open(RULES, encoding="utf-8") as fh:
        shipped = fh.read()
    for text, pct in ((shipped, IDLE_UTIL_PCT), (rules_text(shipped, config), IDLE_PCT)):
        rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]
                 if r.get("alert") == "GPUIdleWhileAllocated"]
        assert len(rules) == 2
        assert all(f"min_over_time(DCGM_FI_DEV_GPU_UTIL[2m]) <= {pct:g}," in r["expr"] for r in rules)
        assert all(f"at or below {pct:g}% utilization" in r["annotations"]["description"] for r in rules)
    with open(os.path.join(ROOT, "manifests", "grafana", "burnrate-fleet-cost.json"), encoding="utf-8") as fh:
        assert f"<= {IDLE_PCT} and on(UUID)" in dashboard_text(fh.read(), config)


@pytest.mark.slow
def test_fleet_mode_says_its_roll_ups_count_idle_at_the_contracts_threshold(recording, tmp_path):
    """The roll-ups' idle GPU-seconds are the agent's counter, split at IDLE_UTIL_PCT: under a
    config with another threshold, the report says which figures keep the contract's."""
    text = tmp_path / "fleet.om"
    with open(text, "w", encoding="utf-8") as fh:
        write_openmetrics(recording, fh, columns=ANALYSIS_COLUMNS, end=False)
        write_gpu_time(recording, fh, SPEC.step_s)
        fh.write("# EOF\n")
    data = str(tmp_path / "tsdb")
    promtool_backfill(text, data)
    rules = rollup_rules(tmp_path)
    evaluate_in_prometheus(tmp_path, data, rules, END - 3600.0, END)
    path = tmp_path / "detectors.yaml"
    path.write_text(OVERRIDE)
    config = load_detector_config(str(path))
    with prometheus(tmp_path, storage=data, config=f"rule_files: [{rules!r}]\n") as prom:
        source = PrometheusSource(prom.url, min_step_s=15.0)
        window = Window(END - 3600.0, END + 600.0)
        default = analyze_fleet(source, window, load_catalog())
        moved = analyze_fleet(source, window, load_catalog(), config)
    note = idle_threshold_note(IDLE_PCT)
    assert f"at or below {IDLE_UTIL_PCT:g}%" in note and f"this config's {IDLE_PCT}%" in note
    assert note in moved.notes and note not in default.notes
    assert not any("burnrate_gpu_idle_seconds_total" in n for n in default.notes)
