"""The alert rules: promtool checks and unit tests, the PrometheusRule that carries
them, their runbooks, and every metric and label they name against the catalog."""
import os
import re
import subprocess

import pytest
import yaml

from burnrate.analyzer.costing import budgets as B
from burnrate.exporter import catalog
from burnrate.exporter import labels as L
from tests.conftest import ROOT, require

RULES = os.path.join(ROOT, "manifests", "alerts", "burnrate-rules.yaml")
PROMETHEUS_RULE = os.path.join(ROOT, "manifests", "alerts", "prometheusrule.yaml")
RULE_TESTS = os.path.join(ROOT, "tests", "rules", "burnrate-rules.test.yaml")
ROLLUP_TESTS = os.path.join(ROOT, "tests", "rules", "burnrate-rollups.test.yaml")
LEDGER_TESTS = os.path.join(ROOT, "tests", "rules", "burnrate-ledger.test.yaml")
# Written from analyzer/costing/budgets.py by tests/test_budgets_alerts.py.
BUDGET_TESTS = os.path.join(ROOT, "tests", "rules", "burnrate-budgets.test.yaml")
# Rendered by exporter/ledger_rules.py and unit-tested in LEDGER_TESTS (tests/test_ledger_rules.py).
LEDGER_GROUP = "burnrate-ledger"
RUNBOOKS = os.path.join(ROOT, "docs", "runbooks.md")

ALERTS = {"TrainingStalled", "TrainingHeldAfterExit", "TrainingDiverging", "DataLoaderStarvation", "GPUIdleWhileAllocated",
          "StragglerRank", "GPUThermalThrottling", "GPUXidError", "GPULost", "BurnrateAgentDown",
          "TelemetryRejected", "TrainingGoodputLow", "BudgetExceeded", "BudgetForecastOverrun"}
# Exported by `burnrate analyze --serve --budgets`, not by the agent (analyzer/costing/budgets.py).
BUDGET_GAUGES = {B.BUDGET, B.SPENT, B.FORECAST, B.FORECAST_LOW, B.FORECAST_HIGH}
# Labels Prometheus attaches to every scraped series (the scrape configs keep these two).
TARGET_LABELS = {"job", "instance"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                "offset", "bool", "inf", "nan", "atan2", "start", "end"}

def load_rules() -> dict:
    with open(RULES) as fh:
        return yaml.safe_load(fh)


def alert_rules() -> list[dict]:
    return [rule for group in load_rules()["groups"] for rule in group["rules"] if "alert" in rule]


def recorded_names() -> set[str]:
    return {rule["record"] for group in load_rules()["groups"] for rule in group["rules"] if "record" in rule}


def test_prometheus_rule_carries_the_rules_file():
    """The PrometheusRule is rendered from the chart, which reads the rules file (release/render-manifests)."""
    with open(PROMETHEUS_RULE) as fh:
        resource = yaml.safe_load(fh)
    assert resource["spec"] == load_rules(), (
        "alerts/prometheusrule.yaml differs from alerts/burnrate-rules.yaml; run `make manifests`")


def test_promtool_check_rules():
    proc = subprocess.run([require("promtool"), "check", "rules", RULES], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests():
    proc = subprocess.run([require("promtool"), "test", "rules", RULE_TESTS, ROLLUP_TESTS, LEDGER_TESTS],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_rollup_is_unit_tested_at_two_scrape_intervals():
    records = {rule["record"] for group in load_rules()["groups"] if group["name"] != LEDGER_GROUP
               for rule in group["rules"] if "record" in rule}
    with open(ROLLUP_TESTS) as fh:
        tests = yaml.safe_load(fh)["tests"]
    assert sorted(test["interval"] for test in tests) == ["15s", "1m"]
    for test in tests:
        tested = {re.match(r"[\w:]+", case["expr"]).group() for case in test["promql_expr_test"]}
        assert tested == records


def test_every_alert_is_there_and_unit_tested_both_ways():
    assert {rule["alert"] for rule in alert_rules()} == ALERTS
    cases = []
    for path in (RULE_TESTS, LEDGER_TESTS, BUDGET_TESTS):
        with open(path) as fh:
            cases += [case for test in yaml.safe_load(fh)["tests"] for case in test.get("alert_rule_test", [])]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    silent = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fired == ALERTS, f"no case where these fire: {ALERTS - fired}"
    assert silent == ALERTS, f"no case where these stay silent: {ALERTS - silent}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_severity_annotations_and_a_runbook_entry():
    with open(RUNBOOKS) as fh:
        anchors = {_slug(line[3:]) for line in fh if line.startswith("## ")}
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        url = annotations["runbook_url"]
        assert url.endswith(f"docs/runbooks.md#{name.lower()}"), (name, url)
        assert name.lower() in anchors, f"docs/runbooks.md has no '## {name}' section"


def _strip(expr: str) -> str:
    """The expression without strings, label matchers, range or subquery selectors,
    numbers and durations (`offset 5m`)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    return re.sub(r"(?<![\w:])\d[\w.]*", " ", expr)


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects: identifiers that are neither
    functions, keywords, numbers nor label lists of by/on/without/ignoring/group_*."""
    expr = _strip(expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = match.group()
        if expr[match.end():].lstrip().startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    """Labels named in matchers and in by/on/without/ignoring/group_* lists."""
    names = set()
    for matchers in re.findall(r"\{([^}]*)\}", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        names |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*[=!]", matchers))
    for group in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        names |= {name.strip() for name in group.split(",") if name.strip()}
    return names


def test_the_expression_parser_sees_what_it_should():
    expr = ('sum by (namespace) (rate(burnrate_train_steps_total{xid=~"a|b"}[5m] offset 5m)) / 1e3 '
            '> on (UUID) group_left () Inf * up')
    assert metric_names(expr) == {"burnrate_train_steps_total", "up"}
    assert label_names(expr) == {"namespace", "xid", "UUID"}


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_rules_use_only_catalog_metrics_and_labels(rule):
    names = metric_names(rule["expr"])
    assert names, rule["expr"]
    # An alert may read a recording rule of the same file (TrainingGoodputLow reads goodput).
    unknown = names - catalog.sample_names() - {"up"} - recorded_names() - BUDGET_GAUGES
    assert not unknown, f"{rule['alert']} uses metrics that are not in exporter/catalog.py: {unknown}"
    known_labels = {label for m in catalog.CATALOG for label in m.labels} | TARGET_LABELS | {L.HOSTNAME}
    unknown = label_names(rule["expr"]) - known_labels - (set(B.GAUGE_LABELS) if names <= BUDGET_GAUGES else set())
    assert not unknown, f"{rule['alert']} uses labels no burnrate series carries: {unknown}"
