"""A team's budget against its spend and the forecast to the end of the period (docs/budgets.md).

The forecast extends the burn rate: spend to date + the time left × (spend to date / time
elapsed). Its interval comes from the spread of the whole slices (days of a month or week,
hours of a day) elapsed so far: the rate ± t·sd/√n, t being Student's 97.5% quantile with
n − 1 degrees of freedom, a 95% interval for the mean rate. Pure: figures in, figures out.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone

WITHIN, FORECAST_OVER, OVER = "within", "forecast_over", "over"
# The gauges `burnrate analyze --serve --budgets` exports, labelled team_by, team and period,
# and the alert rules read (analyzer/output/alert_rules.py).
BUDGET, SPENT = "burnrate_budget_dollars", "burnrate_budget_spent_dollars"
FORECAST, FORECAST_LOW, FORECAST_HIGH = ("burnrate_budget_forecast_dollars", "burnrate_budget_forecast_low_dollars",
                                         "burnrate_budget_forecast_high_dollars")
GAUGE_LABELS = ("team_by", "team", "period")
METHOD = ("expected: spent + time left × spent / time elapsed; low, high: the rate ± t(0.975, n−1)·sd/√n "
          "over the n whole {slice}s elapsed")
# Student's t, 97.5% quantile, by degrees of freedom: a month has at most 30 whole days before its last
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


@dataclass(frozen=True)
class BudgetStatus:
    budget: float
    spent: float
    low: float | None
    expected: float
    high: float | None
    interval_reason: str | None
    status: str
    crosses_on: str | None
    crosses_on_reason: str | None
    method: str

    def to_dict(self) -> dict[str, object]:
        return {"budget_dollars": self.budget, "spent_dollars": self.spent,
                "share_spent": round(self.spent / self.budget, 4), "status": self.status,
                "forecast": {"low": self.low, "expected": self.expected, "high": self.high,
                             "interval_reason": self.interval_reason, "method": self.method},
                "crosses_on": self.crosses_on, "crosses_on_reason": self.crosses_on_reason}


def t975(df: int) -> float:
    return T975[min(df, len(T975)) - 1]


def assess(budget: float, spends: list[float], slice_s: float, start: float, end: float, now: float,
           slice_name: str = "day") -> BudgetStatus:
    """`spends`: the team's dollars in each slice of `slice_s` seconds from the period's `start`
    up to `now` (the last one may be running); `end`: the period's end."""
    now = min(max(now, start), end)
    elapsed, left = now - start, end - now
    spent = round(sum(spends), 2)
    rate = spent / elapsed if elapsed > 0 else 0.0
    expected = round(spent + left * rate, 2)
    whole = spends[:int(elapsed // slice_s)]
    low = high = reason = None
    if len(whole) >= 2:
        half = t975(len(whole) - 1) * statistics.stdev(whole) / math.sqrt(len(whole)) / slice_s
        low, high = round(spent + left * max(rate - half, 0.0), 2), round(spent + left * (rate + half), 2)
    else:
        reason = f"fewer than 2 whole {slice_name}s elapsed in the period"
    status = OVER if spent > budget else FORECAST_OVER if expected > budget else WITHIN
    crosses_on, why = _crossing(budget, spends, slice_s, start, end, now, spent, rate)
    return BudgetStatus(budget, spent, low, expected, high, reason, status, crosses_on, why,
                        METHOD.format(slice=slice_name))


def _crossing(budget: float, spends: list[float], slice_s: float, start: float, end: float, now: float,
              spent: float, rate: float) -> tuple[str | None, str | None]:
    """The UTC day the spend crossed, or is forecast to cross, the budget; or None and why."""
    if spent > budget:
        total = 0.0
        for i, dollars in enumerate(spends):
            total += dollars
            if round(total, 2) > budget:
                return _day(start + i * slice_s), None
    if rate <= 0:
        return None, "nothing spent in the period so far"
    at = now + (budget - spent) / rate
    if at >= end:
        return None, "at the burn rate the spend stays within the budget to the end of the period"
    return _day(at), None


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")
