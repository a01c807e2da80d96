"""Every detector against `burnrate simulate`'s ground truth.

A finding matches a labelled fault when the kinds agree, every identity field both
name (namespace, training_job, Hostname, pod, rank) agrees, the labelled GPU is among
the finding's (a finding is an episode and may span several GPUs: analyzer.detectors.episodes),
and their times overlap. Precision: the share of findings that match a fault; recall:
the share of faults some finding matches.
"""
from __future__ import annotations

import json
import os

import pytest

from burnrate.analyzer.costing import ledger_findings
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze
from burnrate.analyzer.detectors.findings import KINDS, Finding
from burnrate.simulator.simulate import GROUND_TRUTH, Spec, simulate
from burnrate.analyzer.sources import RecordingSource
from burnrate.analyzer.sources.timeparse import parse_time

END = 1_800_000_000.0
IDENTITY = ("namespace", "training_job", "Hostname", "pod", "rank")
SEEDS = (0, 1, 2)


def matches(finding: Finding, truth: dict, step: float) -> bool:
    d = finding.to_dict()
    if d["kind"] != truth["kind"]:
        return False
    if any(d[k] is not None and truth[k] is not None and str(d[k]) != str(truth[k]) for k in IDENTITY):
        return False
    if d["gpu"] is not None and truth["gpu"] is not None and truth["gpu"] not in gpus_on(d, truth["Hostname"]):
        return False
    # A labelled end is the last sample showing the fault: it covers that interval.
    start, end = parse_time(truth["start"]), parse_time(truth["end"]) + step
    return finding.start < end and start < max(finding.end, finding.start + step)


def gpus_on(finding: dict, host: str | None) -> set[str]:
    """The GPU indices a finding names on one node: its `nodes` map when it spans several."""
    evidence = finding["evidence"]
    named = evidence["nodes"].get(host, []) if "nodes" in evidence else evidence["gpus"]
    return {str(g) for g in named}


def evaluate(root: str) -> tuple[list[Finding], list[dict], float]:
    frames = RecordingSource(root).frames()
    with open(os.path.join(root, GROUND_TRUTH), encoding="utf-8") as fh:
        truth = json.load(fh)
    # The whole analysis, as `burnrate analyze` gives it: a job's stall ends where its ledger
    # says its process did, and the time after is held_after_exit.
    return analyze(frames, load_catalog()).findings, truth, frames.step_s


@pytest.fixture(scope="module")
def default_fleets(tmp_path_factory) -> list[tuple[list[Finding], list[dict], float]]:
    out = []
    for seed in SEEDS:
        root = str(tmp_path_factory.mktemp(f"fleet{seed}"))
        simulate(root, Spec(seed=seed, end=END))          # the `burnrate simulate` defaults
        out.append(evaluate(root))
    return out


# `burnrate simulate` runs training fleets; serving and notebooks' own kinds are scored on
# fleets written from the contract (tests/test_real_clusters.py, test_serving_rightsizing.py)
# and in test_detectors.py. The simulator plants no restarts or checkpoints: the ledger's
# findings are checked against runs with known restarts in test_ledger, test_contract_ledger
# and test_ledger_torchrun, bar held_after_exit, a trainer that ends with its pods left.
SIMULATED_KINDS = tuple(k for k in KINDS if k not in ("underused_gpu", "oversized_serving")
                        and (k not in ledger_findings.KINDS or k == "held_after_exit"))


def test_precision_and_recall_per_detector(default_fleets):
    lines, failures = [], []
    for kind in SIMULATED_KINDS:
        found = labelled = true_found = true_labelled = 0
        for findings, truth, step in default_fleets:
            mine = [f for f in findings if f.kind == kind]
            faults = [t for t in truth if t["kind"] == kind]
            found += len(mine)
            labelled += len(faults)
            true_found += sum(any(matches(f, t, step) for t in faults) for f in mine)
            true_labelled += sum(any(matches(f, t, step) for f in mine) for t in faults)
        precision = true_found / found if found else 1.0
        recall = true_labelled / labelled if labelled else 1.0
        lines.append(f"{kind:22s} findings={found:3d} faults={labelled:3d} "
                     f"precision={precision:.3f} recall={recall:.3f}")
        assert labelled, f"the default fleet labels no {kind} fault"
        if precision < 0.95 or recall < 0.95:
            failures.append(kind)
    print("\n" + "\n".join(lines))
    assert not failures, "below 0.95: " + ", ".join(failures)


def test_healthy_fleet_has_no_findings(tmp_path):
    simulate(str(tmp_path), Spec(seed=5, end=END, healthy_only=True))
    findings, truth, _ = evaluate(str(tmp_path))
    assert truth == []
    assert [f.to_dict() for f in findings] == []
