"""Fleet: where the GPUs are and what they cost right now."""
from __future__ import annotations

import dash
from dash import Input, Output, callback, dash_table, html

from burnrate.analyzer.costing.cost import wasted_dollars
from burnrate.analyzer.sources.timeparse import format_time

from ..aggregate import finding_rows
from ..data import Analysis
from ..figures import burn_rate, fleet_state, utilization_heatmap
from ..ui import finding_columns, graph, job_link, money, render, stat

dash.register_page(__name__, path="/", name="Fleet", title="burnrate · fleet", order=0)

TOP_FINDINGS = 8


def layout(**_query: str) -> html.Div:
    return html.Div([html.H2("Fleet"), html.Div(id="fleet-content")])


@callback(Output("fleet-content", "children"), Input("app-url", "search"), Input("app-refresh", "n_intervals"))
def update(search: str | None, _n: int | None):
    return render(search, content)


def content(a: Analysis, search: str) -> list:
    fleet, sim = a.fleet, a.simulated
    now = fleet.now
    waste = wasted_dollars(a.report.findings)
    hours = (a.frames.window.end - a.frames.window.start) / 3600
    unpriced = f"{fleet.unpriced_gpus} GPUs unpriced" if fleet.unpriced_gpus else None
    basis = f"of {fleet.reporting_now} GPUs reporting"
    if fleet.silent:
        basis += f"; {fleet.silent} more stopped reporting at {format_time(fleet.silent_since)}"
    stats = html.Div([
        stat("GPUs busy now", f"{now.get('busy', 0):.0f}", basis),
        stat("allocated, idle", f"{now.get('idle', 0):.0f}",
             f"{now['util_unknown']:.0f} more with utilization unknown" if now.get("util_unknown") else None),
        stat("unallocated", f"{now.get('unallocated', 0):.0f}"),
        stat("burn rate now", money(fleet.burn_now) + "/h",
             ", ".join(filter(None, [f"the {fleet.reporting_now} reporting" if fleet.silent else None, unpriced]))),
        stat("over the window", money(fleet.window_dollars, 0),
             f"{money(fleet.window_dollars / hours if hours else None)}/h average"),
        stat("findings", str(len(a.report.findings)), f"{money(waste)} wasted"),
    ], className="br-stats")
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
    return [
        stats,
        html.Div([graph("fleet-state", fleet_state(fleet, sim)), graph("fleet-burn", burn_rate(fleet, sim))],
                 className="br-row"),
        graph("fleet-heatmap", utilization_heatmap(fleet, sim)),
        html.H3("Top findings by wasted dollars"),
        table if rows else html.Div("No findings in this window.", className="br-notice"),
    ]
