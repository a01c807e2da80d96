"""`burnrate analyze --serve --budgets` (docs/budgets.md) end to end: a real Prometheus scrapes
a real `analyze --serve` on loopback and evaluates the shipped burnrate-budgets group (a copy
with a 1 s interval) over a recording of today's last quarter hour. vision's daily budget is
half a dollar, well under its spend; ml-research's is far over its spend: BudgetExceeded fires
for vision only, and the gauges hold `burnrate report --budgets`'s figures."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml

from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.budget_report import DAY, ServedBudgets
from burnrate.analyzer.output.showback import period_start
from burnrate.analyzer.sources.budgets_file import budgets
from burnrate.cli import main as burnrate
from burnrate.simulator.simulate import Spec, simulate
from tests.conftest import PYTHON, ROOT, free_port, require
from tests.processes import prometheus, stop, wait_http

BUDGETS = ("budgets:\n"
           "  - {namespace: vision, daily_dollars: 0.5}\n"          # ~$6 a quarter hour
           "  - {namespace: ml-research, daily_dollars: 100000}\n")
RULES = os.path.join(ROOT, "manifests", "alerts", "burnrate-rules.yaml")


def budget_rules(tmp_path) -> str:
    """The rendered burnrate-budgets group, evaluated every second."""
    with open(RULES, encoding="utf-8") as fh:
        [group] = [g for g in yaml.safe_load(fh)["groups"] if g["name"] == "burnrate-budgets"]
    path = tmp_path / "budgets-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{**group, "interval": "1s"}]}))
    return str(path)


def alerts(prom) -> list[dict]:
    return [a for a in prom.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == "BudgetExceeded"]


@pytest.mark.slow
def test_budget_exceeded_fires_for_the_team_over_its_budget(tmp_path, capsys):
    require("prometheus")
    # the recording's quarter hour must hold a few minutes of today for the daily budget to see
    into_day = time.time() - period_start(time.time(), "day")
    if into_day < 180:
        time.sleep(180 - into_day)
    recording, path = str(tmp_path / "rec"), tmp_path / "budgets.yaml"
    simulate(recording, Spec(nodes=1, gpus_per_node=4, hours=0.25, step_s=15.0, seed=0, end=time.time()))
    path.write_text(BUDGETS)
    assert burnrate(["report", "--recording", recording, "--period", "day", "--budgets", str(path),
                     "--format", "json"]) == 0
    truth = {t["team"]: t for t in json.loads(capsys.readouterr().out)["budgets"]["teams"]}
    assert (truth["vision"]["status"], truth["ml-research"]["status"]) == ("over", "within")

    port = free_port()
    log = open(tmp_path / "analyze.log", "wb")
    proc = subprocess.Popen([PYTHON, "-m", "burnrate", "analyze", "--recording", recording, "--serve",
                             "--listen", f"127.0.0.1:{port}", "--interval", "2", "--budgets", str(path)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        with prometheus(tmp_path, targets=[f"127.0.0.1:{port}"],
                        config=f"rule_files: [{budget_rules(tmp_path)!r}]\n") as prom:
            spent = prom.wait_for('burnrate_budget_spent_dollars{team="vision"}')
            deadline = time.monotonic() + 30
            while not alerts(prom) and time.monotonic() < deadline:
                time.sleep(0.5)
            fired = alerts(prom)
            ml = prom.wait_for('burnrate_budget_dollars{team="ml-research"}')
            # rules evaluated a few more times: the team within its budget stays silent
            time.sleep(3)
            assert [a["labels"]["team"] for a in alerts(prom)] == ["vision"]
            under = prom.query('burnrate_budget_spent_dollars{team="ml-research"}')
    finally:
        stop(proc, 10)
        log.close()
    assert [(a["state"], a["labels"]["team_by"], a["labels"]["period"], a["labels"]["severity"]) for a in fired] \
        == [("firing", "namespace", "day", "critical")]
    assert float(fired[0]["value"]) == truth["vision"]["spent_dollars"]
    assert float(spent[0]["value"][1]) == truth["vision"]["spent_dollars"] > 0.5
    assert float(ml[0]["value"][1]) == 100000.0
    assert float(under[0]["value"][1]) == truth["ml-research"]["spent_dollars"] > 0


def test_a_finished_day_is_analysed_once():
    """Three evaluations within one day, then one the next day: yesterday, the days before and
    today are analysed as they must be, and no finished day twice."""
    asked: list[tuple[str, float, float]] = []

    def dollars_of_day(by: str, day: Window) -> dict[str, float]:
        asked.append((by, day.start, day.end))
        return {"a": 10.0}

    served = ServedBudgets(budgets({"budgets": [{"namespace": "a", "monthly_dollars": 1000, "weekly_dollars": 300,
                                                 "daily_dollars": 20}]}), dollars_of_day)
    wednesday = 1_794_873_600.0 + DAY          # 2026-11-18 00:00 UTC: its ISO week began on the 16th
    assert time.strftime("%a %d", time.gmtime(wednesday)) == "Wed 18"
    first = served.blocks(wednesday + 3600)
    assert [(b["unit"], b["teams"][0]["spent_dollars"]) for b in first] == [("month", 180.0), ("week", 30.0),
                                                                             ("day", 10.0)]
    # the 17 finished days of November and today, today analysed once for the three periods
    assert len(asked) == 18
    served.blocks(wednesday + 7200)
    served.blocks(wednesday + 7300)
    assert len(asked) == 20 and {a[1] for a in asked[18:]} == {wednesday}
    served.blocks(wednesday + DAY + 60)
    # the next day: the 18th as a whole day, and the 19th so far
    assert asked[20:] == [("namespace", wednesday, wednesday + DAY - 0.001), ("namespace", wednesday + DAY, wednesday + DAY + 60)]


@pytest.mark.parametrize("flags, budgets_text, message", [
    ([], "budgets: [{namespace: a, daily_dollars: 1}]\n",
     "--budgets exports the budget gauges of --serve: it needs --serve (`burnrate report --budgets FILE` prints them)"),
    (["--serve", "--listen", "127.0.0.1:0"], "budgets: [{label: {team: a}, daily_dollars: 1}]\n",
     "{path}: budgets by label:team read kube-state-metrics' kube_pod_labels from Prometheus; a recording does not "
     "carry pod labels: budget namespaces, or use --prometheus URL"),
    (["--serve", "--listen", "127.0.0.1:0"], "budgets: [{namespace: a, daily_dollars: 0}]\n",
     "{path}: budgets[0].daily_dollars: expected a positive number of dollars, e.g. daily_dollars: 20000, got 0"),
])
def test_a_serve_budgets_mistake_is_one_line(flags, budgets_text, message, tmp_path, capsys):
    path = tmp_path / "b.yaml"
    path.write_text(budgets_text)
    assert burnrate(["analyze", "--recording", str(tmp_path), *flags, "--budgets", str(path)]) == 2
    assert capsys.readouterr().err == f"burnrate analyze: error: {message.format(path=path)}\n"
