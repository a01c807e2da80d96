"""Budgets (docs/budgets.md): the budgets file's entries and mistakes, and the forecast to the
end of the period against figures worked out by hand."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from burnrate.analyzer.costing.budgets import FORECAST_OVER, OVER, WITHIN, assess
from burnrate.analyzer.sources.budgets_file import Budget, BudgetsFileError, budgets, load_budgets

DAY = 86400
NOV = datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp()   # a 30-day month
END = NOV + 30 * DAY


def test_the_file_names_teams_as_report_by_does(tmp_path):
    path = tmp_path / "budgets.yaml"
    path.write_text("budgets:\n"
                    "  - {namespace: team-a, monthly_dollars: 20000}\n"
                    "  - label: {team: vision}\n    monthly_dollars: 50000\n    weekly_dollars: 12000.5\n"
                    "  - {label: {team: speech}, daily_dollars: 300}\n")
    assert load_budgets(str(path)) == [
        Budget("namespace", "team-a", {"month": 20000.0}),
        Budget("label:team", "vision", {"month": 50000.0, "week": 12000.5}),
        Budget("label:team", "speech", {"day": 300.0})]


@pytest.mark.parametrize("doc, message", [
    (None, "b.yaml: expected one key, budgets, holding a list of entries, e.g. budgets: "
           "[{namespace: team-a, monthly_dollars: 20000}]"),
    ({"budget": []}, "b.yaml: expected one key, budgets, holding a list of entries, e.g. budgets: "
                     "[{namespace: team-a, monthly_dollars: 20000}]"),
    ({"budgets": ["team-a"]}, "b.yaml: budgets[0]: expected a mapping such as "
                              "{namespace: team-a, monthly_dollars: 20000}, got 'team-a'"),
    ({"budgets": [{"namespace": "a", "monthly": 5}]},
     "b.yaml: budgets[0]: unknown key 'monthly' (known: namespace, label, monthly_dollars, weekly_dollars, "
     "daily_dollars)"),
    ({"budgets": [{"monthly_dollars": 5}]},
     "b.yaml: budgets[0]: name the team with exactly one of namespace: NAME or label: {KEY: VALUE}"),
    ({"budgets": [{"namespace": "a", "label": {"team": "b"}, "monthly_dollars": 5}]},
     "b.yaml: budgets[0]: name the team with exactly one of namespace: NAME or label: {KEY: VALUE}"),
    ({"budgets": [{"namespace": 7, "monthly_dollars": 5}]},
     "b.yaml: budgets[0].namespace: expected a namespace's name, e.g. namespace: team-a, got 7"),
    ({"budgets": [{"label": "team=vision", "monthly_dollars": 5}]},
     "b.yaml: budgets[0].label: expected one KEY: VALUE, e.g. label: {team: vision}, got 'team=vision'"),
    ({"budgets": [{"label": {"team": "a", "org": "b"}, "monthly_dollars": 5}]},
     "b.yaml: budgets[0].label: expected one KEY: VALUE, e.g. label: {team: vision}, got {'team': 'a', 'org': 'b'}"),
    ({"budgets": [{"namespace": "a", "monthly_dollars": -1}]},
     "b.yaml: budgets[0].monthly_dollars: expected a positive number of dollars, e.g. monthly_dollars: 20000, got -1"),
    ({"budgets": [{"namespace": "a", "weekly_dollars": True}]},
     "b.yaml: budgets[0].weekly_dollars: expected a positive number of dollars, e.g. weekly_dollars: 20000, got True"),
    ({"budgets": [{"namespace": "a"}]},
     "b.yaml: budgets[0]: no budget: give one of monthly_dollars, weekly_dollars, daily_dollars, "
     "e.g. monthly_dollars: 20000"),
    ({"budgets": [{"namespace": "a", "monthly_dollars": 1}, {"namespace": "a", "weekly_dollars": 1}]},
     "b.yaml: budgets[1]: namespace a already has a budget in budgets[0]; merge the two entries into one"),
])
def test_each_mistake_is_one_line_naming_the_entry_and_the_fix(doc, message):
    with pytest.raises(BudgetsFileError) as raised:
        budgets(doc, "b.yaml")
    assert str(raised.value) == message


def test_a_file_that_is_not_yaml_is_one_line(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("budgets: [\n")
    with pytest.raises(BudgetsFileError, match=r"^\S+b\.yaml is not valid YAML: [^\n]+$"):
        load_budgets(str(path))
    with pytest.raises(BudgetsFileError, match="^cannot read budgets file .*missing.yaml: No such file"):
        load_budgets(str(tmp_path / "missing.yaml"))


def test_an_even_spend_forecasts_its_month_exactly():
    status = assess(24500.0, [1000.0] * 12, DAY, NOV, END, NOV + 12 * DAY)
    assert (status.spent, status.low, status.expected, status.high) == (12000.0, 30000.0, 30000.0, 30000.0)
    assert status.status == FORECAST_OVER and status.crosses_on == "2026-11-25"   # 24,500 / 1,000 a day
    assert assess(35000.0, [1000.0] * 12, DAY, NOV, END, NOV + 12 * DAY).to_dict() == {
        "budget_dollars": 35000.0, "spent_dollars": 12000.0, "share_spent": 0.3429, "status": WITHIN,
        "forecast": {"low": 30000.0, "expected": 30000.0, "high": 30000.0, "interval_reason": None,
                     "method": "expected: spent + time left × spent / time elapsed; low, high: the rate ± "
                               "t(0.975, n−1)·sd/√n over the n whole days elapsed"},
        "crosses_on": None,
        "crosses_on_reason": "at the burn rate the spend stays within the budget to the end of the period"}


def test_the_interval_is_t_times_the_days_spread():
    # five whole days (sd $141.42), half of the sixth: rate $1,000 a day, 24.5 days left;
    # 2.776 × 141.42 / √5 = $175.57 a day either side
    status = assess(40000.0, [1000.0, 1200.0, 800.0, 1000.0, 1000.0, 500.0], DAY, NOV, END, NOV + 5.5 * DAY)
    assert (status.spent, status.low, status.expected, status.high) == (5500.0, 25698.54, 30000.0, 34301.46)
    # three days of $1,000, $2,000, $3,000: 4.303 × 1,000 / √3 = $2,484.34 a day, more than the rate
    status = assess(40000.0, [1000.0, 2000.0, 3000.0], DAY, NOV, END, NOV + 3 * DAY)
    assert (status.low, status.expected, status.high) == (6000.0, 60000.0, 127077.13)


def test_spent_is_to_the_cent_and_over_names_the_day_it_crossed():
    spends = [333.33] * 16 + [900.01, 100.0]   # 5,333.28 by day 16; over 6,000 on day 17
    status = assess(6000.0, spends, DAY, NOV, END, NOV + 18 * DAY)
    assert status.spent == 6333.29 and status.status == OVER and status.crosses_on == "2026-11-17"
    assert status.to_dict()["share_spent"] == 1.0555


def test_too_little_history_says_why():
    status = assess(1000.0, [10.0, 5.0], DAY, NOV, END, NOV + 1.5 * DAY)
    assert (status.low, status.high, status.expected) == (None, None, 300.0)   # $15 in 1.5 days × 30
    assert status.interval_reason == "fewer than 2 whole days elapsed in the period"
    idle = assess(1000.0, [0.0, 0.0, 0.0], DAY, NOV, END, NOV + 3 * DAY)
    assert (idle.expected, idle.crosses_on, idle.crosses_on_reason) == (
        0.0, None, "nothing spent in the period so far")


def test_the_report_block_counts_the_period_from_its_start_day_by_day():
    from burnrate.analyzer.output.budget_report import budget_block, render_table
    asked = []

    def dollars_of_day(window):
        asked.append(window.start)
        return {"team-a": 1000.0}

    file = budgets({"budgets": [{"namespace": "team-a", "monthly_dollars": 24500},
                                {"label": {"team": "v"}, "monthly_dollars": 1}]})
    block = budget_block(file, "namespace", "month", NOV + 12 * DAY - 0.001, NOV + 20 * DAY, dollars_of_day)
    assert asked == [NOV + d * DAY for d in range(12)]
    assert block["notes"] == ["budgets by label:team are not shown: the report is --by namespace"]
    [team] = block["teams"]
    assert (team["team"], team["spent_dollars"], team["status"], team["crosses_on"]) == (
        "team-a", 12000.0, FORECAST_OVER, "2026-11-25")
    lines = render_table(block).splitlines()
    assert lines[1] == "budgets, 2026-11 from 2026-11-01T00:00:00.000Z as of 2026-11-12T23:59:59.999Z"
    assert lines[2].startswith("note: ") and lines[5].split() == ["team-a", "24,500.00", "12,000.00", "49.0%", "30,000.00", "30,000.00",
                                "30,000.00", "forecast_over", "2026-11-25"]


def test_a_window_ending_at_a_period_s_first_instant_is_the_period_before_s():
    """A window up to 00:00 UTC holds none of the new day: its daily budget is yesterday's."""
    from burnrate.analyzer.output.budget_report import budget_block

    file = budgets({"budgets": [{"namespace": "team-a", "daily_dollars": 100}]})
    block = budget_block(file, "namespace", "day", NOV + 3 * DAY, NOV + 3 * DAY, lambda w: {"team-a": 150.0})
    assert block["period"] == "2026-11-03"
    [team] = block["teams"]
    assert (team["spent_dollars"], team["status"]) == (150.0, "over")


def test_a_daily_report_with_budgets_analyses_each_day_once(tmp_path, monkeypatch, capsys):
    """With `--period day`, the budgets' days are the report's periods: one analysis each."""
    from burnrate.analyzer.output import showback_command
    from burnrate.cli import main as burnrate
    from burnrate.simulator.simulate import Spec, simulate

    simulate(str(tmp_path / "rec"), Spec(nodes=1, gpus_per_node=2, hours=30.0, seed=3, end=NOV + 2 * DAY + 3600))
    (tmp_path / "b.yaml").write_text("budgets:\n  - {namespace: nlp, daily_dollars: 100}\n")
    asked = []
    real = showback_command.period_report
    monkeypatch.setattr(showback_command, "period_report", lambda *a: asked.append(a[3]) or real(*a))
    assert burnrate(["report", "--recording", str(tmp_path / "rec"), "--period", "day", "--format", "json",
                     "--budgets", str(tmp_path / "b.yaml")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["periods"]) == 3 and doc["budgets"]["period"] == "2026-11-03"
    assert len(asked) == len(set(asked)) == 3
