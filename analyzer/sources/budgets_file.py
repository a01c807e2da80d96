"""`--budgets FILE`: each team's GPU budget per calendar period (docs/budgets.md).

    budgets:
      - namespace: team-a
        monthly_dollars: 20000
      - label: {team: vision}
        monthly_dollars: 50000
        weekly_dollars: 12000

A team is named as `burnrate report --by` names it: a namespace, or one value of a pod label.
Every mistake is one line naming the file, the entry and what to write instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .yamlfile import read_yaml

NAMESPACE, LABEL = "namespace", "label"
# the period (as `burnrate report --period` names it) of each budget key
PERIOD_KEYS = {"monthly_dollars": "month", "weekly_dollars": "week", "daily_dollars": "day"}
KNOWN = (NAMESPACE, LABEL, *PERIOD_KEYS)
EXAMPLE = "{namespace: team-a, monthly_dollars: 20000}"


class BudgetsFileError(ValueError):
    """A budgets file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Budget:
    by: str                     # "namespace" or "label:KEY", as `burnrate report --by`
    team: str
    dollars: dict[str, float]   # period (month, week, day) -> dollars

    def describe(self) -> str:
        return f"namespace {self.team}" if self.by == NAMESPACE else f"{self.by}={self.team}"


def load_budgets(path: str) -> list[Budget]:
    return budgets(read_yaml(path, "budgets file", BudgetsFileError), path)


def budgets(doc: object, path: str = "the budgets file") -> list[Budget]:
    """The budgets of a parsed budgets file, in the file's order."""
    if not isinstance(doc, dict) or set(doc) != {"budgets"} or not isinstance(doc["budgets"], list):
        raise BudgetsFileError(f"{path}: expected one key, budgets, holding a list of entries, "
                               f"e.g. budgets: [{EXAMPLE}]")
    out: list[Budget] = []
    seen: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(doc["budgets"]):
        where = f"{path}: budgets[{i}]"
        budget = _budget(entry, where)
        first = seen.setdefault((budget.by, budget.team), i)
        if first != i:
            raise BudgetsFileError(f"{where}: {budget.describe()} already has a budget in budgets[{first}]; "
                                   "merge the two entries into one")
        out.append(budget)
    return out


def _budget(entry: object, where: str) -> Budget:
    if not isinstance(entry, dict):
        raise BudgetsFileError(f"{where}: expected a mapping such as {EXAMPLE}, got {entry!r}")
    unknown = [k for k in entry if k not in KNOWN]
    if unknown:
        raise BudgetsFileError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KNOWN)})")
    if (NAMESPACE in entry) == (LABEL in entry):
        raise BudgetsFileError(f"{where}: name the team with exactly one of namespace: NAME or "
                               "label: {KEY: VALUE}")
    if NAMESPACE in entry:
        by, team = NAMESPACE, entry[NAMESPACE]
        if not isinstance(team, str) or not team:
            raise BudgetsFileError(f"{where}.namespace: expected a namespace's name, e.g. namespace: team-a, "
                                   f"got {team!r}")
    else:
        label = entry[LABEL]
        if (not isinstance(label, dict) or len(label) != 1
                or not all(isinstance(v, str) and v for v in (*label, *label.values()))):
            raise BudgetsFileError(f"{where}.label: expected one KEY: VALUE, e.g. label: {{team: vision}}, "
                                   f"got {label!r}")
        [(key, team)] = label.items()
        by = f"label:{key}"
    dollars = {}
    for key, period in PERIOD_KEYS.items():
        if key not in entry:
            continue
        value = entry[key]
        # bool is an int, but `true` is never a budget.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise BudgetsFileError(f"{where}.{key}: expected a positive number of dollars, e.g. {key}: 20000, "
                                   f"got {value!r}")
        dollars[period] = float(value)
    if not dollars:
        raise BudgetsFileError(f"{where}: no budget: give one of {', '.join(PERIOD_KEYS)}, e.g. monthly_dollars: 20000")
    return Budget(by, team, dollars)
