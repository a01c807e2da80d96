"""The Cost page's Showback section: its controls and its table of teams per period, with the
cells `burnrate report` prints (analyzer/output/showback_render.py)."""
from __future__ import annotations

from typing import Any

from dash import dcc, html

from burnrate.analyzer.output.showback import PERIODS
from burnrate.analyzer.output.showback_render import HEADERS, team_rows

from .showback import Choice

COLUMNS = ["period", *(h.lower() for h in HEADERS), "waste by cause"]


def controls(choice: Choice) -> html.Div:
    """The grouping and the period, starting as the URL says."""
    return html.Div([
        html.Div([html.Label("teams by"),
                  dcc.Input(id="cost-showback-by", value=choice.by, debounce=True, placeholder="namespace or label:KEY",
                            type="text")], className="br-filter"),
        html.Div([html.Label("period (UTC)"),
                  dcc.Dropdown(id="cost-showback-period", options=list(PERIODS), value=choice.period,
                               clearable=False, searchable=False)], className="br-filter"),
    ], className="br-filters")


def table(doc: dict[str, Any]) -> list:
    """A row per period and team; a period's first row names it, and says when the range holds only part of it."""
    rows = []
    for period in doc["periods"]:
        name = period["period"] + (f" (partial: {period['partial_reason']})" if period["partial"] else "")
        for team, cells in zip(period["teams"], team_rows(period)):
            causes = ", ".join(f"{kind} ${dollars:,.2f}" for kind, dollars in team["waste_dollars"].items())
            rows.append(html.Tr([html.Td(name), *(html.Td(c, className="br-num") if i else html.Td(c)
                                                  for i, c in enumerate(cells)), html.Td(causes or "-")],
                                className="br-showback-row",
                                **{"data-period": period["period"], "data-team": team["team"]}))
        if not period["teams"]:
            rows.append(html.Tr([html.Td(name), html.Td("no team's jobs in the period", colSpan=len(COLUMNS) - 1)]))
    notes = doc["notes"] + [f"{p['period']}: {n}" for p in doc["periods"] for n in p["notes"]]
    return [
        html.Table([html.Thead(html.Tr([html.Th(c) for c in COLUMNS])), html.Tbody(rows)], id="cost-showback-table"),
        html.P("Each period is analysed as `burnrate report` analyses it (docs/showback.md): the teams' cost adds "
               "up, to the cent, to the jobs' cost of the period; the change is against the period before.",
               className="br-hint"),
        html.Ul([html.Li(n) for n in notes], id="cost-showback-notes", className="br-hint"),
    ]
