"""Cost: by namespace and job, what spot saved, what waste cost, and unit costs."""
from __future__ import annotations

import dash
from dash import Input, Output, State, callback, html, no_update

from burnrate.analyzer.costing.accounting import COVERAGE_WARNING
from burnrate.analyzer.output.report import Report
from burnrate.exporter.errors import UserError

from ..aggregate import CostSummary, badput_timeline, cost_summary, from_rollups, namespace_goodput
from ..data import Analysis, Unavailable
from ..figures import (TOP_JOBS, badput_over_time, cost_by_job, cost_by_namespace, cost_per_billion_tokens,
                       namespace_goodput as goodput_figure, spot_savings, waste_by_cause)
from .. import budgets, showback_table
from ..showback import BY, PERIOD, Choice, ShowbackError, showback, team_key
from ..overview import Overview
from ..ui import (current_service, early_parts, graph, job_href, money, notice, poll_fired, render_after,
                  render_early, stat)

dash.register_page(__name__, path="/cost", name="Cost", title="burnrate · cost", order=3)


def layout(**query: str) -> html.Div:
    return html.Div([html.H2("Cost"), *early_parts("cost"), html.Div(id="cost-content"),
                     html.H3("Showback: each team's GPUs per calendar period"),
                     showback_table.controls(Choice.of(query.get(BY), query.get(PERIOD))),
                     html.Div(id="cost-showback"),
                     html.H3("Budgets: each team's spend and forecast in the current period"),
                     html.Div(id="cost-budgets")])


@callback(Output("cost-content", "children"), Output("cost-progress", "children"), Output("cost-poll", "disabled"),
          Input("app-url", "search"), Input("app-refresh", "n_intervals"), Input("cost-poll", "n_intervals"))
def update(search: str | None, _n: int | None, polls: int | None = None):
    return render_early(search, content, early_content, poll_fired("cost", polls))


@callback(Output("app-url", "search", allow_duplicate=True), Input("cost-showback-by", "value"),
          Input("cost-showback-period", "value"), State("app-url", "search"), prevent_initial_call=True)
def showback_to_url(by: str | None, period: str | None, search: str | None):
    """A changed grouping or period goes into the URL; the section then draws what the URL says."""
    changed = Choice.of(by, period).in_query(search)
    return no_update if changed == (search or "") else changed


@callback(Output("cost-showback", "children"), Input("app-url", "search"), Input("app-refresh", "n_intervals"),
          Input("cost-poll", "disabled"))
def update_showback(search: str | None, _n: int | None, _waiting: bool | None = None):
    """A wrong choice in the URL is said at once; the table follows the window's analysis."""
    try:
        team_key(current_service(search), Choice.from_query(search))
    except ShowbackError as exc:
        return notice(f"Showback: {exc}", error=True)
    except KeyError:    # a cluster the store lacks: render_after says so
        pass
    return render_after(search, showback_content, "The showback follows when the window's analysis is done.")


def showback_content(a: Analysis, search: str) -> list | html.Div:
    service = current_service(search)
    try:
        return showback_table.table(showback(service, a, Choice.from_query(search), service.clock()))
    except (ShowbackError, Unavailable) as exc:
        return notice(f"Showback: {exc}", error=True)


# --- budgets (docs/budgets.md): `burnrate dashboard --budgets FILE` -----------------------------

@callback(Output("cost-budgets", "children"), Input("app-url", "search"), Input("app-refresh", "n_intervals"),
          Input("cost-poll", "disabled"))
def update_budgets(search: str | None, _n: int | None, _waiting: bool | None = None):
    if budgets.installed() is None:
        return html.P("Start the dashboard with --budgets FILE to see each team's budget here (docs/budgets.md).",
                      className="br-hint")
    return render_after(search, budgets_content, "The budgets follow when the window's analysis is done.")


def budgets_content(a: Analysis, search: str) -> list | html.Div:
    service = current_service(search)
    try:
        return budgets.section(budgets.block(service, a, Choice.from_query(search), budgets.installed(),
                                             service.clock()))
    except (ShowbackError, Unavailable, UserError) as exc:
        return notice(f"Budgets: {exc}", error=True)


# One callback a graph: the early page has the cost chart without the tokens chart, and a
# callback whose inputs are only partly on the page is an error in the browser.
@callback(Output("app-url", "href", allow_duplicate=True), Input("cost-jobs", "clickData"),
          State("app-url", "search"), prevent_initial_call=True)
def open_job(click: dict | None, search: str | None):
    """A click on a job's bar opens the job's page, inside the app (the URL changes, the document stays)."""
    return clicked_job_href(click, search) or no_update


@callback(Output("app-url", "href", allow_duplicate=True), Input("cost-tokens", "clickData"),
          State("app-url", "search"), prevent_initial_call=True)
def open_job_by_tokens(click: dict | None, search: str | None):
    return open_job(click, search)


def clicked_job_href(click: dict | None, search: str | None) -> str | None:
    """The page of the job whose bar `click` (a graph's clickData) hit; None for anything else."""
    points = (click or {}).get("points") or [{}]
    key = points[0].get("customdata")
    return job_href(key[0], key[1], search) if isinstance(key, list) and len(key) == 2 else None


def rollup_note(report: Report) -> list:
    """In fleet mode, the jobs the goodput charts leave out, and where their ledgers are."""
    rolled = len(from_rollups(report))
    return [html.P(f"{rolled} training jobs were costed from roll-ups (fleet mode), which keep no ledger: the "
                   "charts below hold the jobs read per GPU; each job's own page reads its ledger.",
                   className="br-hint", id="cost-ledger-basis")] if rolled else []


def content(a: Analysis, _search: str) -> list:
    summary, sim = cost_summary(a.report), a.simulated
    waste = float(summary.waste_by_cause.sum()) if len(summary.waste_by_cause) else 0.0
    stats = html.Div([
        stat("jobs' cost", money(summary.total_dollars),
             f"{summary.unpriced_jobs} jobs unpriced" if summary.unpriced_jobs else None),
        stat("paid on spot", money(summary.spot_dollars)),
        stat("spot saved", money(summary.spot_saved), "against on-demand prices"),
        stat("wasted", money(waste), "incl. unallocated capacity"),
        stat("fleet over the window", money(a.fleet.window_dollars)),
    ], className="br-stats")
    return [
        stats,
        accounting_panel(a.report),
        html.Div([graph("cost-namespace", cost_by_namespace(summary, sim)),
                  graph("cost-spot", spot_savings(summary, sim))], className="br-row"),
        html.Div([graph("cost-jobs", cost_by_job(summary, sim)),
                  graph("cost-waste", waste_by_cause(summary, sim))], className="br-row"),
        graph("cost-tokens", cost_per_billion_tokens(summary, sim)),
        tokens_note(summary),
        html.H3("Goodput: where the training jobs' GPU-hours went"),
        *rollup_note(a.report),
        graph("cost-goodput", goodput_figure(namespace_goodput(a.report), sim)),
        graph("cost-badput", badput_over_time(badput_timeline(a.report, a.views), sim)),
    ]


def early_content(o: Overview, _search: str) -> list:
    """The jobs' dollars from the overview's read, per namespace and capacity; waste, tokens and
    goodput need the detectors and the rank series: they follow the analysis."""
    summary, sim = cost_summary(o.report), o.simulated
    basis = "from each GPU's held samples, as the analysis counts them"
    stats = html.Div([
        stat("jobs' cost", money(summary.total_dollars), basis),
        stat("paid on spot", money(summary.spot_dollars)),
        stat("spot saved", money(summary.spot_saved), "against on-demand prices"),
        stat("wasted", "…", "when the analysis is done"),
        stat("fleet over the window", money(o.fleet.window_dollars), f"GPUs priced at {o.step_text} steps"),
    ], className="br-stats")
    return [
        stats,
        html.Div([graph("cost-namespace", cost_by_namespace(summary, sim)),
                  graph("cost-spot", spot_savings(summary, sim))], className="br-row"),
        graph("cost-jobs", cost_by_job(summary, sim)),
        html.Div("Where the GPU-hours went, waste by cause, cost per billion tokens and goodput follow when the window's analysis is done.",
                 className="br-notice", id="cost-pending"),
    ]


def tokens_note(summary: CostSummary) -> html.Ul:
    """What the cost per billion tokens is worked out from, and how many jobs its chart leaves out, and why."""
    counted = int(summary.by_job["cost_per_billion_tokens"].notna().sum())
    lines = ["Each bar: the job's cost in this window over the tokens its ranks counted in it; "
             "hover a bar for the tokens and GPU-hours."]
    if counted > TOP_JOBS:
        lines.append(f"{counted - TOP_JOBS} jobs with a lower cost per billion tokens not drawn: "
                     f"the chart shows the {TOP_JOBS} highest.")
    if len(summary.by_job) > counted:
        lines.append(f"{len(summary.by_job) - counted} priced jobs not drawn: they counted no tokens.")
    if summary.unpriced_jobs:
        lines.append(f"{summary.unpriced_jobs} jobs not drawn: they have no price.")
    return html.Ul([html.Li(line) for line in lines], id="cost-tokens-note", className="br-hint")


def accounting_panel(report: Report) -> html.Div:
    """Where every GPU-hour went, with the identity that ties the dollars to it, the
    share of time that had samples, and why any job has no price."""
    acc = report.accounting
    if acc is None:
        return html.Div(id="cost-accounting")
    rows = [("observed", acc.observed_gpu_hours, "= allocated + unallocated"),
            ("allocated", acc.allocated_gpu_hours, "= busy + idle; the jobs' GPU-hours add up to it"),
            ("unallocated", acc.unallocated_gpu_hours, "paid for, held by nobody"),
            ("busy", acc.busy_gpu_hours, "allocated and used"),
            ("idle", acc.idle_gpu_hours, f"allocated, utilization at or below {acc.idle_util_pct:g}%")]
    coverage = "-" if acc.coverage is None else f"{acc.coverage:.1%}"
    low = acc.coverage is not None and acc.coverage < COVERAGE_WARNING
    return html.Div([
        html.H3("GPU-hours"),
        html.Table([html.Tbody([html.Tr([html.Td(name), html.Td(f"{hours:,.1f}", className="br-num"), html.Td(why)],
                                        id=f"cost-accounting-{name}") for name, hours, why in rows])]),
        html.P(f"samples cover {coverage} of the GPUs' time" + (": hours and dollars are for that part only" if low
                                                               else ""),
               id="cost-coverage", className="br-warn" if low else "br-hint"),
        html.Ul([html.Li(f"{j['namespace']}/{j['training_job']} has no price: {j['reason']}")
                 for j in report.unpriced_jobs], id="cost-unpriced"),
    ], id="cost-accounting")
