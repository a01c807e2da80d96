"""The Cost page's budgets (docs/budgets.md): each team's budget, spend and forecast in the
period holding the range's end, for the page's team grouping and period, worked out as
`burnrate report --budgets` works them out; each day of the period is one analysis in the
service's cache, shared with the showback's days."""
from __future__ import annotations

from typing import Any

import flask
import plotly.graph_objects as go
from dash import html

from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.budget_report import HEADERS, budget_block, report_dollars, rows
from burnrate.analyzer.output.pod_labels import pod_labels
from burnrate.analyzer.sources.budgets_file import Budget

from .data import Analysis, DataService
from .showback import Choice, period_analysis, team_key
from .ui import graph, money

# where `burnrate dashboard --budgets FILE` keeps the file's budgets: the server's extensions
BUDGETS_KEY = "burnrate.budgets"


def install(server: flask.Flask, budgets: list[Budget]) -> None:
    server.extensions[BUDGETS_KEY] = budgets


def installed() -> list[Budget] | None:
    return flask.current_app.extensions.get(BUDGETS_KEY)


def block(service: DataService, analysis: Analysis, choice: Choice, budgets: list[Budget],
          now: float) -> dict[str, Any]:
    """`burnrate report --budgets`'s block for the page's grouping and period; the range's own
    analysis stands for a day it spans exactly."""
    key = team_key(service, choice)

    def dollars_of_day(day: Window) -> dict[str, float]:
        a = period_analysis(service, analysis, day, key, choice)
        return report_dollars(None if a.frames.gpu.empty else a.report, service.source, key, day, pod_labels)

    return budget_block(budgets, choice.by, choice.period, analysis.frames.window.end, now, dollars_of_day)


def section(doc: dict[str, Any]) -> list:
    """A bar per team of its spend and forecast against its budget, and the report's table."""
    body = [html.Tr([html.Td(c, className="br-num") if 0 < i < 7 else html.Td(c) for i, c in enumerate(cells)],
                    className="br-budget-row", **{"data-team": team["team"], "data-status": team["status"]})
            for team, cells in zip(doc["teams"], rows(doc))]
    parts = [html.P(f"{doc['period']} from {doc['start']} as of {doc['as_of']}", className="br-hint")]
    if doc["teams"]:
        parts += [graph("cost-budgets-bars", figure(doc)),
                  html.Table([html.Thead(html.Tr([html.Th(h) for h in HEADERS])), html.Tbody(body)],
                             id="cost-budgets-table"),
                  html.P(f"forecast: {doc['teams'][0]['forecast']['method']}", className="br-hint")]
    else:
        parts.append(html.P(f"no budget for a {doc['period']} of these teams in the budgets file"))
    return parts + [html.Ul([html.Li(n) for n in doc["notes"]], id="cost-budgets-notes", className="br-hint")]


def figure(doc: dict[str, Any]) -> go.Figure:
    """Each team's spend and forecast as a share of its own budget, so that one line at 100% is
    every team's budget; the forecast's 95% interval as an error bar where it has one."""
    teams = doc["teams"][::-1]      # the file's first team on top
    names = [t["team"] for t in teams]
    share = lambda dollars, t: None if dollars is None else round(100 * dollars / t["budget_dollars"], 2)
    expected = [share(t["forecast"]["expected"], t) for t in teams]
    fig = go.Figure([
        go.Bar(x=[share(t["spent_dollars"], t) for t in teams], y=names, orientation="h", name="spent",
               marker_color=["#d63031" if t["status"] == "over" else "#0984e3" for t in teams],
               customdata=[[t["spent_dollars"], t["budget_dollars"]] for t in teams],
               hovertemplate="spent $%{customdata[0]:,.2f} of $%{customdata[1]:,.2f} (%{x:.1f}%)<extra></extra>"),
        go.Scatter(x=expected, y=names, mode="markers", name="forecast", marker={"symbol": "diamond", "size": 11,
                                                                                 "color": "#2d3436"},
                   error_x={"type": "data", "symmetric": False,
                            "array": [(share(t["forecast"]["high"], t) or e) - e for t, e in zip(teams, expected)],
                            "arrayminus": [e - (share(t["forecast"]["low"], t) or e) for t, e in zip(teams, expected)]},
                   customdata=[[money(t["forecast"][k]) for k in ("expected", "low", "high")] for t in teams],
                   hovertemplate="forecast %{customdata[0]} (low %{customdata[1]}, high %{customdata[2]})"
                                 "<extra></extra>"),
    ])
    fig.add_vline(x=100, line_dash="dash", line_color="#d63031", annotation_text="budget")
    fig.update_xaxes(title="% of the team's budget", ticksuffix="%", rangemode="tozero")
    fig.update_layout(title={"text": f"Budgets, {doc['period']}", "x": 0.01, "font": {"size": 15}},
                      template="plotly_white", height=max(240, 40 * len(teams) + 120),
                      margin={"l": 60, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return fig
