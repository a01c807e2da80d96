"""`burnrate analyze`'s table fits 120 columns (a pipe, a file, a narrow terminal) with every
figure still in it: findings' place and evidence and the advice wrap onto indented lines."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from burnrate.simulator.simulate import Spec, simulate

END = 1_800_000_000.0


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> tuple[str, dict]:
    root = str(tmp_path_factory.mktemp("fleet"))
    simulate(root, Spec(nodes=4, gpus_per_node=8, hours=2, seed=3, end=END))

    def analyze(*argv: str) -> str:
        return subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--recording", root, *argv],
                              capture_output=True, text=True, timeout=120, check=True).stdout
    return analyze(), json.loads(analyze("--format", "json"))


def test_every_line_fits_120_columns(outputs):
    table, doc = outputs
    assert any(len(f["recommendation"]) > 120 for f in doc["findings"])     # the advice must wrap to fit
    assert max(len(line) for line in table.splitlines()) <= 120, table


def test_every_figure_is_still_there(outputs):
    table, doc = outputs
    words = " ".join(table.split())      # wrapped text read as one
    for f in doc["findings"]:
        assert any(" ".join(g["recommendation"].split()) in words       # WHAT TO DO: one advice a kind
                   for g in doc["findings"] if g["kind"] == f["kind"]), f["kind"]
        if f["training_job"]:
            assert f"{f['namespace']}/{f['training_job']}" in table
        if f["pod"] and f["rank"] is None:      # a rank names the process better than its pod
            assert f["pod"] in table
        assert f"{f['wasted_dollars']:,.2f}" in table
    for j in doc["jobs"]:
        row = next(line for line in table.split("\nJOBS (", 1)[1].splitlines()
                   if line.startswith(f"{j['namespace']}/{j['training_job']} "))
        assert f"{j['cost_dollars']:,.2f}" in row and f"{j['on_demand_cost_dollars']:,.2f}" in row
        if j["mfu"] is not None:       # in the job's row of the second block
            assert re.search(rf"^{re.escape(j['namespace'])}/{re.escape(j['training_job'])} .*{j['mfu']:.1%}$",
                             table, re.M)


def test_a_finding_s_place_and_evidence_follow_its_row(outputs):
    table, _ = outputs
    lines = table.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("warning   straggler"))
    assert "recsys/clip-contrastive-1" in lines[row] and lines[row].rstrip().endswith("47.23")
    assert lines[row + 1] == "          gpu-node-0:gpu1 rank 1: 1.37x slower compute"


def test_a_finding_with_no_place_or_evidence_has_no_blank_line_under_it():
    from burnrate.analyzer.detectors.findings import Finding
    from burnrate.analyzer.output.report import _findings_table

    bare = Finding(kind="slow_startup", severity="warning", start=END - 3600, end=END, namespace="ml",
                   training_job="a-job-with-a-name-long-enough-to-need-the-second-line" * 2, wasted_gpu_hours=1.0,
                   wasted_dollars=2.5, evidence={}, recommendation="start faster")
    lines = _findings_table([bare], 120)
    assert all(line.strip() for line in lines), lines


@pytest.mark.parametrize("minutes, text", [(0.25, "stalled for 15 s"), (50.2, "stalled for 50 min")])
def test_a_stall_s_headline_is_in_seconds_under_a_minute(minutes, text):
    """Thresholds of seconds (the demo's) find stalls that short: 15 s read "stalled for 0 min"."""
    from burnrate.analyzer.detectors.findings import Finding
    from burnrate.analyzer.output.report import headline

    stall = Finding("stalled", "critical", END, END + minutes * 60, evidence={"stalled_minutes": minutes})
    assert headline(stall) == text


@pytest.mark.parametrize("evidence, wasted, text", [
    ({"mfu": 0.18, "waste_counted_under": ["dataloader_starvation"]}, 0.0,
     "MFU 18.0%; its waste counted under dataloader_starvation"),
    ({"stalled_minutes": 147.0, "waste_counted_under": ["gpu_error"]}, 7.3,
     "stalled for 147 min; some of its waste counted under gpu_error"),
    ({"signals": ["loss_spike"], "waste_counted_under": []}, 5.7, "loss_spike"),
    ({"held_minutes": 222.25, "gpus_held": 2.0}, 7.4, "2 GPUs held 222 min after its last process ended"),
    ({"held_minutes": 30.0, "gpus_held": 1.0}, 0.5, "1 GPU held 30 min after its last process ended"),
])
def test_a_finding_s_headline_says_where_its_waste_went(evidence, wasted, text):
    """A finding whose waste another finding's time already holds reads 0 (or less) in the
    table: its evidence line says under which, as the JSON's waste_counted_under does."""
    from burnrate.analyzer.detectors.findings import Finding
    from burnrate.analyzer.output.report import headline

    finding = Finding("low_mfu", "warning", END, END + 3600, namespace="nlp", training_job="ft",
                      wasted_gpu_hours=wasted, evidence=evidence)
    assert headline(finding) == text
