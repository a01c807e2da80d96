"""`burnrate report --budgets FILE` (docs/budgets.md): each budgeted team's spend in the period
that holds the window's end, day by day as `burnrate report --period day` counts it, against
its budget, and the forecast to the period's end (analyzer/costing/budgets.py)."""
from __future__ import annotations

import html
from typing import Any

from burnrate.exporter.errors import UserError, printable

from ..costing.budgets import assess
from ..grid.frames import Window
from ..sources.budgets_file import NAMESPACE, PERIOD_KEYS, Budget, BudgetsFileError, load_budgets
from .pod_labels import label_key, pod_labels
from .showback import BOUNDARY_S, exact, period_start, periods, team_by_label, team_figures

DAY = 86400.0
# a time past the period's end and before the next one's: month 28-31 days, week 7, day 1
PAST_THE_END = {"month": 32 * DAY, "week": 7.5 * DAY, "day": 1.5 * DAY}
PERIOD_KEY = {period: key for key, period in PERIOD_KEYS.items()}


def read(path: str) -> list[Budget]:
    try:
        return load_budgets(path)
    except BudgetsFileError as exc:
        raise UserError(str(exc)) from None


def report_dollars(report, source, key: str | None, window: Window, pod_labels) -> dict[str, float]:
    """Each team's dollars in one analysis of `window` (None: no GPU sample in it), the teams by
    the pods' label `key` (None: by namespace)."""
    from ..sources import PrometheusError

    if report is None:
        return {}
    team_of = {}
    if key is not None:
        try:
            team_of = team_by_label(report, pod_labels(source, key, window))
        except (PrometheusError, OSError, ValueError) as exc:
            raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    return {t.team: t.dollars for t in team_figures(report, team_of)[0]}


def budget_block(budgets: list[Budget], by: str, unit: str, end: float, now: float,
                 dollars_of_day) -> dict[str, Any]:
    """The budgets of the `by` teams for the `unit` period holding `end` (the window's end),
    with `dollars_of_day(Window)` the teams' dollars in each day of it so far. A window that
    ends at a period's first instant holds none of it: its period is the one before."""
    start = period_start(end - BOUNDARY_S, unit)
    period = periods(Window(start, end), unit, now)[-1]
    days = [dollars_of_day(p.window) for p in periods(Window(start, end), "day", now)]
    period_end = period_start(start + PAST_THE_END[unit], unit)
    notes = [f"{b.describe()}: no {PERIOD_KEY[unit]} in the file" for b in budgets
             if b.by == by and unit not in b.dollars]
    others = sorted({b.by for b in budgets if b.by != by})
    if others:
        notes.append(f"budgets by {', '.join(others)} are not shown: the report is --by {by}")
    teams = [{"team": b.team, **assess(b.dollars[unit], [d.get(b.team, 0.0) for d in days], DAY, start,
                                       period_end, end).to_dict()}
             for b in budgets if b.by == by and unit in b.dollars]
    return {"period": period.name, "start": exact(start), "as_of": exact(end), "teams": teams, "notes": notes}


def add_to_table(text: str, doc: dict[str, Any]) -> str:
    return text + render_table(doc["budgets"]) if "budgets" in doc else text


def add_to_html(page: str, doc: dict[str, Any]) -> str:
    return page.replace("</body>", render_html(doc["budgets"]) + "</body>") if "budgets" in doc else page


HEADERS = ["TEAM", "BUDGET $", "SPENT $", "SPENT %", "FORECAST $", "LOW $", "HIGH $", "STATUS", "CROSSES ON"]


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def rows(block: dict[str, Any]) -> list[list[str]]:
    """The cells of each team, as the table prints them."""
    return [[t["team"], _money(t["budget_dollars"]), _money(t["spent_dollars"]), f"{t['share_spent']:.1%}",
             _money(t["forecast"]["expected"]), _money(t["forecast"]["low"]), _money(t["forecast"]["high"]),
             t["status"], t["crosses_on"] or "-"] for t in block["teams"]]


def render_table(block: dict[str, Any]) -> str:
    lines = ["", f"budgets, {block['period']} from {block['start']} as of {block['as_of']}"]
    lines += [f"note: {n}" for n in block["notes"]]
    cells_of = rows(block)
    if cells_of:
        widths = [max(len(h), *(len(r[i]) for r in cells_of)) for i, h in enumerate(HEADERS)]
        for cells in [HEADERS, ["-" * w for w in widths]] + cells_of:
            lines.append("  ".join(c.ljust(w) if i in (0, 7, 8) else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
        lines.append(f"forecast: {block['teams'][0]['forecast']['method']}")
    return printable("\n".join(lines), keep="\n") + "\n"


def render_html(block: dict[str, Any]) -> str:
    """A section: each team's spend and forecast against its budget, every figure carried in
    data- attributes so that it can be read back."""
    e = html.escape
    parts = [f"<section class='budgets' data-period='{e(block['period'])}'><h2>Budgets, {e(block['period'])}"
             f" as of {e(block['as_of'])}</h2>"]
    parts += [f"<p class='note'>{e(n)}</p>" for n in block["notes"]]
    parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr>")
    for team, row in zip(block["teams"], rows(block)):
        parts.append(f"<tr class='budget' data-team='{e(team['team'])}' data-budget='{team['budget_dollars']}' "
                     f"data-spent='{team['spent_dollars']}' data-forecast='{team['forecast']['expected']}' "
                     f"data-status='{team['status']}'>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    if block["teams"]:
        parts.append(f"<p class='method'>forecast: {e(block['teams'][0]['forecast']['method'])}</p>")
    return "".join(parts) + "</section>"


class ServedBudgets:
    """The budget blocks `burnrate analyze --serve --budgets` exports: for every team grouping
    and period the file budgets, the period holding the evaluation's time. A day that has ended
    is analysed once and kept; only today's dollars are analysed at each evaluation (once for
    all the periods that hold today)."""

    def __init__(self, budgets: list[Budget], dollars_of_day) -> None:
        """`dollars_of_day(by, Window)`: the `by` teams' dollars in the day `window`."""
        self.budgets, self.dollars_of_day = budgets, dollars_of_day
        self.groupings = list(dict.fromkeys((b.by, unit) for b in budgets for unit in b.dollars))
        self.days: dict[tuple[str, float, float], dict[str, float]] = {}

    def blocks(self, now: float) -> list[dict[str, Any]]:
        oldest = min(period_start(now, unit) for _, unit in self.groupings)
        # kept: whole days that ended in a current period; a day so far (its window ends at the
        # evaluation's time) is analysed anew at each evaluation, since its dollars still grow
        self.days = {key: dollars for key, dollars in self.days.items()
                     if key[1] >= oldest and key[2] - key[1] >= DAY - 1 and key[2] < now}
        return [{"by": by, "unit": unit, **budget_block(self.budgets, by, unit, now, now,
                                          lambda day, by=by: self._day(by, day))}
                for by, unit in self.groupings]

    def _day(self, by: str, day: Window) -> dict[str, float]:
        key = (by, day.start, day.end)
        if key not in self.days:
            self.days[key] = self.dollars_of_day(by, day)
        return self.days[key]


def served(path: str, options, open_source, report_of_day) -> ServedBudgets:
    """`--budgets FILE` of `burnrate analyze --serve`: `report_of_day(by, source, Window, key)` is
    the analysis `burnrate report --by BY --period day` runs for the day (None: no GPU sample),
    in the store `open_source()` opens anew for each day (a rotated token file is read again)."""
    budgets = read(path)
    labelled = next((b.by for b in budgets if b.by != NAMESPACE), None)
    if labelled is not None and options.recording is not None:
        raise UserError(f"{path}: budgets by {labelled} read kube-state-metrics' kube_pod_labels from Prometheus; "
                        "a recording does not carry pod labels: budget namespaces, or use --prometheus URL")

    def dollars_of_day(by: str, day: Window) -> dict[str, float]:
        key, source = label_key(by), open_source()
        return report_dollars(report_of_day(by, source, day, key), source, key, day, pod_labels)

    return ServedBudgets(budgets, dollars_of_day)
