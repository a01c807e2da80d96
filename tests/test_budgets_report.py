"""`burnrate report --budgets` (docs/budgets.md) against the showback's fleet of known spend
(tests/test_showback.py): three teams in a real Prometheus, the report's window ending at
noon on the fleet's third day, a Sunday (a millisecond short: a sample stands for the time up
to the next one, docs/analyze.md). The ISO week began four days before the fleet did,
so 6.5 days of it have elapsed and 0.5 is left: expected = spent × 7 / 6.5."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from burnrate.cli import main as burnrate
from tests.test_showback import CAPACITY, DAY, RATE, START, WORKLOADS

END = START + 2.5 * DAY
WEEK_START = START - 4 * DAY
BUDGETS = ("budgets:\n"
           "  - {namespace: ml, weekly_dollars: 300}\n"          # spent $327.21 on the fleet's first day
           "  - {namespace: research, weekly_dollars: 170}\n"    # $65.88 a day: $164.70, forecast $177.37
           "  - {namespace: data, weekly_dollars: 50, monthly_dollars: 400}\n"
           "  - {namespace: nobody, monthly_dollars: 10}\n"
           "  - {label: {team: alpha}, weekly_dollars: 1}\n")


def spent(namespace: str, start: float, end: float) -> float:
    """The namespace's dollars held between start and end, from the exact intervals."""
    out = 0.0
    for w in WORKLOADS:
        if w.namespace == namespace:
            held_h = max(0.0, min(w.end, end) - max(w.start, start)) / 3600
            out += sum(w.share * len(gpus) * held_h * RATE[CAPACITY[node]] for node, gpus in w.placements)
    return out


@pytest.mark.slow
def test_spent_and_forecast_meet_the_arithmetic(store, capsys, tmp_path):
    path = tmp_path / "budgets.yaml"
    path.write_text(BUDGETS)
    html = tmp_path / "page.html"
    assert burnrate(["report", "--prometheus", store, "--start", str(START), "--end", str(END - 0.001), "--period", "week",
                     "--format", "json", "--budgets", str(path), "--html", str(html)]) == 0
    block = json.loads(capsys.readouterr().out)["budgets"]
    assert (block["period"], block["start"], block["as_of"]) == ("2025-W51", "2025-12-15T00:00:00.000Z",
                                                                 "2025-12-21T11:59:59.999Z")
    assert block["notes"] == ["namespace nobody: no weekly_dollars in the file",
                              "budgets by label:team are not shown: the report is --by namespace"]
    teams = {t["team"]: t for t in block["teams"]}
    assert list(teams) == ["ml", "research", "data"]
    days = [WEEK_START + i * DAY for i in range(7)] + [END]
    for name, status, crosses in (("ml", "over", "2025-12-19"), ("research", "forecast_over", "2025-12-21"),
                                  ("data", "within", None)):
        team, truth = teams[name], spent(name, WEEK_START, END)
        # each day's dollars are to the cent, as `--period day` reports them: half a cent a day at most
        assert team["spent_dollars"] == pytest.approx(truth, abs=0.015), name
        assert team["forecast"]["expected"] == pytest.approx(team["spent_dollars"] * 7 / 6.5, abs=0.006), name
        whole = [spent(name, days[i], days[i + 1]) for i in range(6)]
        half = 2.571 * statistics.stdev(whole) / math.sqrt(6)          # Student's t, 5 degrees of freedom
        rate = team["spent_dollars"] / 6.5
        assert team["forecast"]["low"] == pytest.approx(team["spent_dollars"] + 0.5 * max(rate - half, 0), abs=0.02)
        assert team["forecast"]["high"] == pytest.approx(team["spent_dollars"] + 0.5 * (rate + half), abs=0.02)
        assert (team["status"], team["crosses_on"]) == (status, crosses), name
    assert teams["research"]["spent_dollars"] == pytest.approx(2.5 * 24 * RATE["on-demand"], abs=0.015)
    page = html.read_text()
    assert (f"data-team='ml' data-budget='300.0' data-spent='{teams['ml']['spent_dollars']}'" in page
            and "data-status='forecast_over'" in page)


@pytest.mark.parametrize("text, message", [
    ("budgets: [{namespace: a}]\n", "{path}: budgets[0]: no budget: give one of monthly_dollars, weekly_dollars, "
                                    "daily_dollars, e.g. monthly_dollars: 20000"),
    ("budgets: [\n", None),
])
def test_a_budgets_mistake_is_one_line(text, message, tmp_path, capsys):
    path = tmp_path / "b.yaml"
    path.write_text(text)
    assert burnrate(["report", "--recording", str(tmp_path), "--budgets", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"burnrate report: error: {path}")
    if message:
        assert err == f"burnrate report: error: {message.format(path=path)}\n"


def test_csv_carries_the_budget_block_as_a_second_section(tmp_path, capsys):
    import csv
    from burnrate.simulator.simulate import Spec, simulate

    recording, path = str(tmp_path / "rec"), tmp_path / "budgets.yaml"
    simulate(recording, Spec(nodes=1, gpus_per_node=4, hours=2, step_s=15.0, seed=0, end=1_795_000_000.0))
    path.write_text("budgets:\n  - {namespace: vision, daily_dollars: 20}\n  - {namespace: ml-research, "
                    "daily_dollars: 1000}\n")
    asked = ["report", "--recording", recording, "--period", "day", "--budgets", str(path), "--format"]
    assert burnrate([*asked, "json"]) == 0
    block = json.loads(capsys.readouterr().out)["budgets"]
    assert burnrate([*asked, "csv"]) == 0
    showback, budgets = capsys.readouterr().out.split("\n\n")
    assert showback.startswith("period,start,end,")
    rows = list(csv.DictReader(budgets.splitlines()))
    assert [(r["budget_period"], r["as_of"], r["team"], float(r["budget_dollars"]), float(r["spent_dollars"]),
             r["status"], float(r["forecast_expected"]), r["forecast_low"], r["crosses_on"]) for r in rows] == \
        [(block["period"], block["as_of"], t["team"], t["budget_dollars"], t["spent_dollars"], t["status"],
          t["forecast"]["expected"], "", t["crosses_on"] or "") for t in block["teams"]]
    assert [r["status"] for r in rows] == ["over", "within"]
