"""Findings: every problem found, its evidence, what it wasted and what to do."""
from __future__ import annotations

import dash
from dash import Input, Output, State, callback, dash_table, dcc, html, no_update

from burnrate.analyzer.detectors.findings import KINDS, SEVERITIES
from burnrate.analyzer.output.report import SEVERITY_ORDER

from ..aggregate import finding_rows
from ..data import Analysis
from ..filters import FindingFilters
from ..ui import early_parts, finding_columns, job_link, money, poll_fired, render_early

dash.register_page(__name__, path="/findings", name="Findings", title="burnrate · findings", order=2)

COLUMNS = [("severity", "severity"), ("kind", "kind"), ("namespace", "namespace"), ("job", "training_job"),
           ("where", "where"), ("start (UTC)", "start"), ("hours", "hours"), ("wasted GPU-h", "wasted_gpu_hours"),
           ("wasted $", "wasted_dollars"), ("evidence", "evidence"), ("what to do", "recommendation")]


def layout(**query: str | list[str]) -> html.Div:
    """The filters start as the URL says, so a shared link opens the same view."""
    chosen = FindingFilters.from_params(query)

    def picker(id_: str, label: str, options: list[str], value: tuple[str, ...]) -> html.Div:
        return html.Div([html.Label(label), dcc.Dropdown(id=id_, options=options, value=list(value), multi=True,
                                                         placeholder="all")], className="br-filter")
    return html.Div([
        html.H2("Findings"),
        html.Div([picker("findings-kind", "kind", list(KINDS), chosen.kinds),
                  # Until the analysis lists every namespace, the URL's must be options, or they would not show.
                  picker("findings-namespace", "namespace", list(chosen.namespaces), chosen.namespaces),
                  picker("findings-severity", "severity", list(SEVERITIES), chosen.severities)],
                 className="br-filters"),
        *early_parts("findings"),
        html.Div(id="findings-content"),
    ])


@callback(Output("app-url", "search", allow_duplicate=True), Input("findings-kind", "value"),
          Input("findings-namespace", "value"), Input("findings-severity", "value"), State("app-url", "search"),
          prevent_initial_call=True)
def filters_to_url(kinds: list[str] | None, namespaces: list[str] | None, severities: list[str] | None,
                   search: str | None):
    """A changed filter goes into the URL; the page then draws what the URL says."""
    changed = FindingFilters.of(kinds, namespaces, severities).in_query(search)
    return no_update if changed == (search or "") else changed


@callback(Output("findings-content", "children"), Output("findings-namespace", "options"),
          Output("findings-progress", "children"), Output("findings-poll", "disabled"),
          Input("app-url", "search"), Input("app-refresh", "n_intervals"), Input("findings-poll", "n_intervals"))
def update(search: str | None, _n: int | None, polls: int | None = None):
    filters = FindingFilters.from_query(search)
    namespaces = set(filters.namespaces)

    def build(a: Analysis, s: str) -> list:
        namespaces.update(f.namespace for f in a.report.findings if f.namespace)
        return content(a, s, filters)

    children, progress, done = render_early(search, build, pending, poll_fired("findings", polls))
    return children, sorted(namespaces), progress, done


def pending(_o: object, _search: str) -> html.Div:
    """While the analysis runs there is nothing to list yet, which is not the same as no findings."""
    return html.Div("Findings follow when the window's analysis is done.", className="br-notice",
                    id="findings-pending")


def select(findings: list, filters: FindingFilters) -> list:
    """The findings the filters keep, costliest first, the worse first where they cost the same:
    the page answers where the money goes, so a $57 warning is above a $0.07 critical; the
    severity filter shows the critical ones alone."""
    kept = [f for f in findings if filters.keeps(f)]
    return sorted(kept, key=lambda f: (-(f.wasted_dollars or 0.0), SEVERITY_ORDER[f.severity]))


def content(a: Analysis, search: str, filters: FindingFilters) -> list:
    kept = select(a.report.findings, filters)
    rows = finding_rows(kept)
    for row in rows:
        if row["training_job"]:
            row["training_job"] = job_link(row["namespace"], row["training_job"], search)
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
            columns=finding_columns(COLUMNS),
            style_cell={"textAlign": "left", "fontSize": 13, "whiteSpace": "normal", "height": "auto",
                        "maxWidth": 420},
            style_data_conditional=[{"if": {"filter_query": f'{{severity}} = "{s}"', "column_id": "severity"},
                                     "color": c, "fontWeight": "bold"}
                                    for s, c in (("critical", "#c0392b"), ("warning", "#e67e22"))],
            style_as_list_view=True),
    ]
