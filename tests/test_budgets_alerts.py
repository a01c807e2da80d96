"""The budget alerts fire on the right day in a real Prometheus engine (promtool).

A 30-day month, one team spending $400 a day for 10 days, then $1,500 a day, evenly over
each day, against a budget of $14,000. The gauges `burnrate analyze --serve --budgets`
exports are written every hour, as analyzer/costing/budgets.py computes them, into
tests/rules/burnrate-budgets.test.yaml (`python -m tests.test_budgets_alerts` writes it
again). The truth, by arithmetic:
- spent passes $14,000 on day 17, at 16d16h (13,000 + 1,500 × 16/24 = 14,000, not over):
  BudgetExceeded fires from the 16d17h sample, never on day 16;
- the forecast spent × 30d / elapsed passes $14,000 where (4,000 + 1,500 (t − 10)) / t >
  14,000 / 30, t > 10.645 days = 10d15.5h: over from the 10d16h sample, so
  BudgetForecastOverrun (for: 1h) fires at 10d17h, and hands over to BudgetExceeded at 16d17h.
"""
from __future__ import annotations

import os
import subprocess

import yaml

from burnrate.analyzer.costing import budgets as B
from tests.conftest import ROOT, require

TESTS = os.path.join(ROOT, "tests", "rules", "burnrate-budgets.test.yaml")
DAY, HOUR = 86400, 3600
DAYS, BUDGET = 30, 14000.0
LABELS = 'team_by="namespace", team="team-a", period="month", job="burnrate-analyzer", instance="analyzer:9402"'
HEADER = ("# promtool test rules for the burnrate-budgets group, written by tests/test_budgets_alerts.py from\n"
          "# analyzer/costing/budgets.py (`python -m tests.test_budgets_alerts`); see that file for the truth.\n")


def daily(day: int) -> float:
    return 400.0 if day < 10 else 1500.0


def gauges(hour: int) -> dict[str, float | None]:
    """The gauges at `hour` hours into the month."""
    whole, part = divmod(hour, 24)
    spends = [daily(d) for d in range(whole)] + ([daily(whole) * part / 24] if part else [])
    status = B.assess(BUDGET, spends, DAY, 0.0, DAYS * DAY, hour * HOUR)
    return {B.BUDGET: BUDGET, B.SPENT: status.spent, B.FORECAST: status.expected, B.FORECAST_LOW: status.low,
            B.FORECAST_HIGH: status.high}


def _value(v: float | None) -> str:
    return "_" if v is None else f"{v:g}"


def _alert(name: str, severity: str, summary: str) -> dict:
    return {"exp_labels": {"severity": severity, "team_by": "namespace", "team": "team-a", "period": "month"},
            "exp_annotations": {"summary": summary, "description": DESCRIPTIONS[name],
                                "runbook_url": f"docs/runbooks.md#{name.lower()}"}}


DESCRIPTIONS = {
    "BudgetExceeded": "The team's GPU spend since the start of the period is over its budget; every further "
                      "GPU-hour adds to the overrun until the period ends.",
    "BudgetForecastOverrun": "At the burn rate of the period so far, the team's GPU spend will pass its budget "
                             "before the period ends; burnrate_budget_forecast_low_dollars and _high_dollars "
                             "bound the forecast."}


def cases() -> list[dict]:
    exceeded = lambda spent: _alert("BudgetExceeded", "critical", f"Team team-a (namespace) has spent {spent} "
                                       "dollars this month, over its budget.")
    overrun = lambda fc: _alert("BudgetForecastOverrun", "warning", f"Team team-a (namespace) is forecast to "
                                   f"spend {fc} dollars this month, over its budget.")
    return [
        {"eval_time": "15d23h", "alertname": "BudgetExceeded", "exp_alerts": []},
        {"eval_time": "16d16h", "alertname": "BudgetExceeded", "exp_alerts": []},
        {"eval_time": "16d17h", "alertname": "BudgetExceeded", "exp_alerts": [exceeded("14.06k")]},
        # 4,000 + 19 × 1,500 + 1,500 × 23/24
        {"eval_time": "29d23h", "alertname": "BudgetExceeded", "exp_alerts": [exceeded("33.94k")]},
        {"eval_time": "10d15h", "alertname": "BudgetForecastOverrun", "exp_alerts": []},
        # over since the 10d16h sample: pending for the hour `for` asks
        {"eval_time": "10d16h", "alertname": "BudgetForecastOverrun", "exp_alerts": []},
        # 5,062.50 spent × 30 / 10.7083 days
        {"eval_time": "10d17h", "alertname": "BudgetForecastOverrun", "exp_alerts": [overrun("14.18k")]},
        # 14,000 spent × 30 / 16.6667 days
        {"eval_time": "16d16h", "alertname": "BudgetForecastOverrun", "exp_alerts": [overrun("25.2k")]},
        {"eval_time": "16d17h", "alertname": "BudgetForecastOverrun", "exp_alerts": []},
    ]


def document() -> dict:
    hours = range(DAYS * 24)
    series = [{"series": f"{name}{{{LABELS}}}", "values": " ".join(_value(gauges(h)[name]) for h in hours)}
              for name in (B.BUDGET, B.SPENT, B.FORECAST, B.FORECAST_LOW, B.FORECAST_HIGH)]
    # evaluated at the samples: the gauges change once an hour here
    return {"rule_files": ["../../manifests/alerts/burnrate-rules.yaml"], "evaluation_interval": "1h",
            "tests": [{"name": "a team crossing its monthly budget on day 17", "interval": "1h",
                       "input_series": series, "alert_rule_test": cases()}]}


def rendered() -> str:
    return HEADER + yaml.safe_dump(document(), sort_keys=False, width=10**6)


def test_the_shipped_promtool_tests_are_the_budgets_modules_gauges():
    with open(TESTS, encoding="utf-8") as fh:
        assert fh.read() == rendered(), "run python -m tests.test_budgets_alerts"


def test_the_gauges_meet_the_arithmetic():
    # spent to the cent, and the forecast of an even spend is that spend × 30 days
    assert gauges(16 * 24 + 16)[B.SPENT] == 14000.0 and gauges(16 * 24 + 17)[B.SPENT] == 14062.5
    assert gauges(5 * 24)[B.FORECAST] == 12000.0
    assert gauges(10 * 24 + 15)[B.FORECAST] < BUDGET < gauges(10 * 24 + 16)[B.FORECAST]


def test_the_alerts_fire_on_the_right_hours():
    proc = subprocess.run([require("promtool"), "test", "rules", TESTS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


if __name__ == "__main__":
    with open(TESTS, "w", encoding="utf-8") as fh:
        fh.write(rendered())
