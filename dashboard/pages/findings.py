"""Findings: every problem found, its evidence, what it wasted and what to do."""
from __future__ import annotations

import dash
from dash import Input, Output, callback, dash_table, dcc, html

from analyzer.findings import KINDS, SEVERITIES
from analyzer.report import SEVERITY_ORDER

from ..aggregate import finding_rows
from ..data import Analysis
from ..ui import job_href, money, render

dash.register_page(__name__, path="/findings", name="Findings", title="burnrate · findings", order=2)

COLUMNS = [("severity", "severity"), ("kind", "kind"), ("namespace", "namespace"), ("job", "training_job"),
           ("where", "where"), ("start (UTC)", "start"), ("hours", "hours"), ("wasted GPU-h", "wasted_gpu_hours"),
           ("wasted $", "wasted_dollars"), ("evidence", "evidence"), ("what to do", "recommendation")]


def layout(**_query: str) -> html.Div:
    def picker(id_: str, label: str, options: list[str]) -> html.Div:
        return html.Div([html.Label(label), dcc.Dropdown(id=id_, options=options, multi=True, placeholder="all")],
                        className="br-filter")
    return html.Div([
        html.H2("Findings"),
        html.Div([picker("findings-kind", "kind", list(KINDS)), picker("findings-namespace", "namespace", []),
                  picker("findings-severity", "severity", list(SEVERITIES))], className="br-filters"),
        html.Div(id="findings-content"),
    ])


@callback(Output("findings-content", "children"), Output("findings-namespace", "options"),
          Input("app-url", "search"), Input("app-refresh", "n_intervals"), Input("findings-kind", "value"),
          Input("findings-namespace", "value"), Input("findings-severity", "value"))
def update(search: str | None, _n: int | None, kinds: list[str] | None, namespaces: list[str] | None,
           severities: list[str] | None):
    namespaces_seen: list[str] = []

    def build(a: Analysis, s: str) -> list:
        namespaces_seen.extend(sorted({f.namespace for f in a.report.findings if f.namespace}))
        return content(a, s, kinds, namespaces, severities)

    children = render(search, build)
    return children, namespaces_seen


def select(findings: list, kinds: list[str] | None, namespaces: list[str] | None,
           severities: list[str] | None) -> list:
    """The findings the filters keep (an empty filter keeps all), worst and costliest first."""
    kept = [f for f in findings if (not kinds or f.kind in kinds)
            and (not namespaces or f.namespace in namespaces) and (not severities or f.severity in severities)]
    return sorted(kept, key=lambda f: (SEVERITY_ORDER[f.severity], -(f.wasted_dollars or 0.0)))


def content(a: Analysis, search: str, kinds: list[str] | None, namespaces: list[str] | None,
            severities: list[str] | None) -> list:
    kept = select(a.report.findings, kinds, namespaces, severities)
    rows = finding_rows(kept)
    for row in rows:
        if row["training_job"]:
            row["training_job"] = f"[{row['training_job']}]({job_href(row['namespace'], row['training_job'], search)})"
    hours = sum(f.wasted_gpu_hours or 0.0 for f in kept)
    dollars = sum(f.wasted_dollars or 0.0 for f in kept)
    summary = (f"{len(kept)} of {len(a.report.findings)} findings · {hours:,.1f} GPU-hours and {money(dollars)} "
               f"wasted" + (" · simulated data" if a.simulated else ""))
    if not rows:
        return [html.P(summary, className="br-hint"), html.Div("No findings match.", className="br-notice")]
    return [
        html.P(summary, className="br-hint", id="findings-summary"),
        dash_table.DataTable(
            id="findings-table", data=rows, page_size=50, sort_action="native",
            markdown_options={"link_target": "_self"},
            columns=[{"name": n, "id": c, "presentation": "markdown"} if c == "training_job" else {"name": n, "id": c}
                     for n, c in COLUMNS],
            style_cell={"textAlign": "left", "fontSize": 13, "whiteSpace": "normal", "height": "auto",
                        "maxWidth": 420},
            style_data_conditional=[{"if": {"filter_query": f'{{severity}} = "{s}"', "column_id": "severity"},
                                     "color": c, "fontWeight": "bold"}
                                    for s, c in (("critical", "#c0392b"), ("warning", "#e67e22"))],
            style_as_list_view=True),
    ]
