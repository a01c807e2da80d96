"""Fleet: where the GPUs are and what they cost right now."""
from __future__ import annotations

import dash
from dash import Input, Output, callback, ctx, dash_table, dcc, html

from burnrate.analyzer.costing.cost import wasted_dollars
from burnrate.analyzer.sources.timeparse import format_time

from ..aggregate import Fleet, finding_rows
from ..data import Analysis
from ..figures import burn_rate, fleet_state, utilization_heatmap
from ..overview import Overview
from ..ui import (POLL_MS, finding_columns, gpu_hours_text, graph, job_link, money, render_early, stat,
                  sum_of_money)

dash.register_page(__name__, path="/", name="Fleet", title="burnrate · fleet", order=0)

TOP_FINDINGS = 8


def layout(**_query: str) -> html.Div:
    return html.Div([html.H2("Fleet"), html.Div(id="fleet-progress"), html.Div(id="fleet-content"),
                     dcc.Interval(id="fleet-poll", interval=POLL_MS, disabled=True)])


@callback(Output("fleet-content", "children"), Output("fleet-progress", "children"), Output("fleet-poll", "disabled"),
          Input("app-url", "search"), Input("app-refresh", "n_intervals"), Input("fleet-poll", "n_intervals"))
def update(search: str | None, _n: int | None, _polls: int | None = None):
    return render_early(search, content, early_content, polled=bool(_polls) and ctx.triggered_id == "fleet-poll")


def content(a: Analysis, search: str) -> list:
    waste = wasted_dollars(a.report.findings)
    stats = _stats(a, a.fleet, a.report.accounting.observed_gpu_hours if a.report.accounting else None,
                   stat("findings", str(len(a.report.findings)), f"{money(waste)} wasted"), None)
    return _page(a.fleet, a.simulated, stats, findings_table(a, search))


def early_content(o: Overview, search: str) -> list:
    """The overview's figures, each saying its basis; the findings come with the analysis."""
    stats = _stats(o, o.fleet, o.accounting.observed_gpu_hours,
                   stat("findings", "…", "when the analysis is done"), o.basis)
    return _page(o.fleet, o.simulated, stats, html.Div("Findings follow when the window's analysis is done.",
                                                       className="br-notice", id="fleet-findings-pending"))


def _page(fleet: Fleet, sim: bool, stats: html.Div, findings: object) -> list:
    return [
        stats,
        html.Div([graph("fleet-state", fleet_state(fleet, sim)), graph("fleet-burn", burn_rate(fleet, sim))],
                 className="br-row"),
        graph("fleet-heatmap", utilization_heatmap(fleet, sim)),
        html.H3("Top findings by wasted dollars"),
        findings,
    ]


def _stats(shown: Analysis | Overview, fleet: Fleet, gpu_hours: float | None, findings: html.Div,
           early_basis: str | None) -> html.Div:
    """The number cards; `early_basis` says what an overview's figures are averages of."""
    now = fleet.now
    hours = (shown.frames.window.end - shown.frames.window.start) / 3600
    unpriced = f"{fleet.unpriced_gpus} GPUs unpriced" if fleet.unpriced_gpus else None
    basis = f"of {fleet.reporting_now} GPUs reporting"
    if fleet.silent:
        basis += f"; {fleet.silent} more stopped reporting at {format_time(fleet.silent_since)}"
    if early_basis:
        basis += f"; {early_basis}"
    return html.Div([
        stat("GPUs busy now", f"{now.get('busy', 0):.0f}", basis),
        stat("allocated, idle", f"{now.get('idle', 0):.0f}",
             f"{now['util_unknown']:.0f} more with utilization unknown" if now.get("util_unknown") else None),
        stat("unallocated", f"{now.get('unallocated', 0):.0f}"),
        stat("burn rate now", money(fleet.burn_now) + "/h",
             ", ".join(filter(None, [f"the {fleet.reporting_now} reporting" if fleet.silent else None, unpriced]))),
        stat("over the window", sum_of_money(fleet.window_dollars),
             f"{money(fleet.window_dollars / hours if hours else None)}/h average"
             + ("" if gpu_hours is None else f"; {gpu_hours_text(gpu_hours)} GPU-hours")),
        findings,
    ], className="br-stats")


def findings_table(a: Analysis, search: str) -> object:
    top = sorted(a.report.findings, key=lambda f: -(f.wasted_dollars or 0.0))[:TOP_FINDINGS]
    rows = finding_rows(top)
    for row in rows:
        if row["training_job"]:
            row["training_job"] = job_link(row["namespace"], row["training_job"], search)
    table = dash_table.DataTable(
        id="fleet-findings", data=rows, markdown_options={"link_target": "_self"},
        columns=finding_columns((("severity", "severity"), ("kind", "kind"), ("namespace", "namespace"),
                                 ("job", "training_job"), ("where", "where"), ("wasted $", "wasted_dollars"),
                                 ("evidence", "headline"))),
        style_cell={"textAlign": "left", "fontSize": 13}, style_as_list_view=True)
    return table if rows else html.Div("No findings in this window.", className="br-notice")
