"""The `burnrate-ledger` rule group: rendered by exporter/ledger_rules.py from the ledger's
definitions (exporter/ledger.py) and the catalog, and carried verbatim by
manifests/alerts/burnrate-rules.yaml. After changing either, regenerate the group and then the
PrometheusRule with
  BURNRATE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_ledger_rules.py && make manifests
(the tests fail while they differ). Its values are checked by promtool on
tests/rules/burnrate-ledger.test.yaml (tests/test_alert_rules.py) and on both engines by
tests/test_rollup_engines.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import yaml

from burnrate.exporter import catalog, ledger
from burnrate.exporter import ledger_rules as R
from burnrate.exporter import rules_yaml as Y
from tests.conftest import PYTHON, ROOT
from tests.contract_fleet import BASE_TIME, Series, import_lines
from tests.processes import victoria_metrics
from tests.test_alert_rules import LEDGER_TESTS, RULES, load_rules, metric_names

def shipped_group() -> dict:
    [group] = [g for g in load_rules()["groups"] if g["name"] == R.GROUP]
    return group


def test_the_rules_file_carries_the_group_as_rendered_now():
    with open(RULES) as fh:
        text = fh.read()
    if os.environ.get("BURNRATE_UPDATE_GOLDEN"):
        text = Y.splice(text, R.GROUP, R.render())
        with open(RULES, "w") as fh:
            fh.write(text)
    stale = ("manifests/alerts/burnrate-rules.yaml holds another burnrate-ledger group than "
             "exporter/ledger_rules.py renders; rerun with BURNRATE_UPDATE_GOLDEN=1")
    assert Y.blocks(text, R.GROUP) == [R.render()], stale
    assert shipped_group() == R.group(), stale


def test_the_rendered_yaml_reads_back_as_the_group():
    assert yaml.safe_load(R.render()) == [R.group()]


def test_the_module_prints_the_group():
    proc = subprocess.run([PYTHON, "-m", "burnrate.exporter.ledger_rules"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == R.render()


def test_each_counted_category_is_recorded_from_its_own_counters_per_job_and_per_namespace():
    records = {rule["record"]: rule["expr"] for rule in shipped_group()["rules"] if "record" in rule}
    allocated = catalog.BY_NAME["burnrate_gpu_allocated_seconds_total"].sample_name
    # The steps' categories give up the wait for saves and evaluations (ledger.BLOCKING), reported as step time.
    waits = {R.rank_counter(field) for b in ledger.BLOCKING for field, _ in b.counters} | {R.rank_counter("step_s")}
    for c in ledger.COUNTED:
        counters = {R.rank_counter(field) for field, _ in c.counters} | (set() if c.blocks else waits)
        assert counters <= catalog.sample_names(), c.name
        assert metric_names(records[R.category_record(c.name)]) == counters, c.name
        assert metric_names(records[R.category_record(c.name, R.NAMESPACE)]) == counters | {allocated}, c.name
    for level in (R.JOB, R.NAMESPACE):
        assert metric_names(records[R.gpu_record(level)]) <= {allocated, R.rank_counter("compute_s")} | waits
        assert metric_names(records[R.goodput_record(level)]) == {allocated, R.rank_counter("compute_s")} | waits
    # Every record reads raw counters only: back-filling tools cannot see another rule's results.
    assert all(not (metric_names(expr) & records.keys()) for expr in records.values())
    # Per job and per namespace, nothing else; kept by `cluster` where the agents carry it.
    assert {name.split(":")[0] for name in records} == {"cluster_namespace_training_job", "cluster_namespace"}
    assert len(records) == 2 * (len(ledger.COUNTED) + 2)


def test_the_goodput_alert_uses_the_named_threshold_and_duration():
    [alert] = [rule for rule in shipped_group()["rules"] if "alert" in rule]
    assert alert["alert"] == "TrainingGoodputLow"
    assert alert["expr"] == f"{R.goodput_record()} < {R.GOODPUT_LOW:g}"
    assert alert["for"] == R.GOODPUT_LOW_FOR
    assert alert["labels"] == {"severity": "warning"}
    assert alert["annotations"]["runbook_url"] == "docs/runbooks.md#traininggoodputlow"


def test_every_ledger_record_is_unit_tested_at_two_scrape_intervals():
    records = {rule["record"] for rule in shipped_group()["rules"] if "record" in rule}
    with open(LEDGER_TESTS) as fh:
        tests = yaml.safe_load(fh)["tests"]
    assert sorted(test["interval"] for test in tests) == ["15s", "1m"]
    for test in tests:
        tested = {re.match(r"[\w:]+", case["expr"]).group() for case in test["promql_expr_test"]}
        assert tested == records
        fired = {case["alertname"] for case in test["alert_rule_test"] if case["exp_alerts"]}
        assert fired == {"TrainingGoodputLow"}


def test_the_training_job_dashboard_stacks_every_counted_category():
    """The Goodput row reads the job-level records, one target per category in the ledger's
    order and the GPUs held last (tests/test_grafana_dashboards.py runs them)."""
    with open(os.path.join(ROOT, "manifests", "grafana", "burnrate-training-job.json")) as fh:
        panels = {p["title"]: p for p in json.load(fh)["panels"]}
    selector = '{namespace="$namespace", training_job="$training_job"}'
    assert [t["expr"] for t in panels["Goodput"]["targets"]] == [R.goodput_record() + selector]
    stacked = [t["expr"] for t in panels["Where the job's GPU-time goes"]["targets"]]
    assert stacked == [R.category_record(c.name) + selector for c in ledger.COUNTED] + [R.gpu_record() + selector]


def _promtool_values(notation: str) -> list[float]:
    """promtool's expanding notation, as the rules tests write it: `a+bxN` and `axN`, N+1 values."""
    start, _, count = notation.partition("x")
    first, _, increment = start.partition("+")
    return [float(first) + float(increment or 0) * i for i in range(int(count) + 1)]


@pytest.mark.slow
def test_victoria_metrics_reads_a_save_from_rank_0_alone_as_promtool_does(tmp_path):
    """The rules test's `solo` job (rank 0 alone saves, rank 1 waits in its steps) imported into a
    real VictoriaMetrics, each ledger record's expression asked there at minute 10: MetricsQL's
    max, count and `or` give the figures promtool gives in Prometheus, to the last digit."""
    with open(LEDGER_TESTS) as fh:       # every scalar a string: YAML 1.1 reads `0x60` as hexadecimal
        [test] = [t for t in yaml.load(fh, Loader=yaml.BaseLoader)["tests"] if t["interval"] == "1m"]
    series = []
    for item in test["input_series"]:
        name, labels = re.fullmatch(r"([\w:]+)\{(.*)\}", item["series"]).groups()
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if labels.get("namespace") == "vision":
            values = np.array(_promtool_values(item["values"]))
            series.append(Series(name, labels, BASE_TIME + 60.0 * np.arange(len(values)), values))
    expected = {sample["labels"].split("{")[0]: float(sample["value"]) for case in test["promql_expr_test"]
                if case["eval_time"] == "10m" for sample in case["exp_samples"]
                if 'namespace="vision"' in sample["labels"] and not sample["labels"].startswith("{")}
    records = {rule["record"]: rule["expr"] for rule in shipped_group()["rules"] if "record" in rule}
    assert set(expected) == set(records) and len(series) == 12
    with victoria_metrics(tmp_path) as vm:
        request = urllib.request.Request(f"{vm.url}/api/v1/import", data=import_lines(series), method="POST")
        with urllib.request.urlopen(request, timeout=60) as resp:
            resp.read()
        with urllib.request.urlopen(f"{vm.url}/internal/force_flush", timeout=60) as resp:
            resp.read()
        at = f"{BASE_TIME + 600:.3f}"

        def ask(promql: str) -> list[dict]:
            return vm.get("/api/v1/query", query=promql, time=at)["result"]

        # A flush makes the samples searchable; a new series' index entry may follow a moment later.
        deadline = time.monotonic() + 30
        while not ask(f'count(last_over_time({{namespace="vision"}}[15m])) == {len(series)}'):
            assert time.monotonic() < deadline, "VictoriaMetrics never found every series imported"
            time.sleep(0.2)
        for record, value in expected.items():
            [answer] = ask(records[record])
            assert float(answer["value"][1]) == pytest.approx(value, rel=1e-12), record
