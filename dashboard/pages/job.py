"""Job detail: why one job costs what it does. The URL names the job, so it can be shared."""
from __future__ import annotations

import dash
from dash import Input, Output, callback, dcc, html

from burnrate.analyzer.costing.cost import JobCost

from ..aggregate import caveats, job_detail, unmeasured
from ..data import Analysis, Unavailable
from ..figures import SEVERITY_COLORS, job_timeline, ledger_waterfall, rank_breakdown
from ..overview import Overview
from ..timerange import names_range
from ..ui import early_parts, gpu_hours_text, graph, money, notice, poll_fired, render_early, stat

dash.register_page(__name__, path_template="/job/<namespace>/<training_job>", name="Job",
                   title="burnrate · job", order=9)


def layout(namespace: str | None = None, training_job: str | None = None, **_query: str) -> html.Div:
    return html.Div([
        html.H2(f"{namespace}/{training_job}"),
        dcc.Store(id="job-key", data={"namespace": namespace, "training_job": training_job}),
        *early_parts("job"),
        html.Div(id="job-content"),
    ])


@callback(Output("job-content", "children"), Output("job-progress", "children"), Output("job-poll", "disabled"),
          Input("job-key", "data"), Input("app-url", "search"), Input("app-refresh", "n_intervals"),
          Input("job-poll", "n_intervals"))
def update(key: dict | None, search: str | None, _n: int | None, polls: int | None = None):
    if not key or not key.get("namespace") or not key.get("training_job"):
        return notice("No job named in the URL (expected /job/<namespace>/<training_job>).", error=True), None, True
    ns, name = key["namespace"], key["training_job"]
    return render_early(search, lambda a, s: content(a, ns, name, s), lambda o, s: early_content(o, ns, name, s),
                        poll_fired("job", polls))


def _shown(shown: Analysis | Overview, search: str) -> tuple[float, float] | None:
    """A range the URL names is the user's: keep it. The default range opens on the job's own life."""
    return (shown.frames.window.start, shown.frames.window.end) if names_range(search) else None


def early_content(o: Overview, namespace: str, training_job: str, search: str) -> list:
    """The job's GPUs, hours and dollars from the overview's read, and its GPUs over its life at the
    read's steps; the ledger, findings and training series follow the analysis."""
    match = o.jobs[(o.jobs["namespace"] == namespace) & (o.jobs["training_job"] == training_job)]
    if match.empty:
        return [notice(f"No job {namespace}/{training_job} held GPUs in this window.")]
    row = match.iloc[0]
    detail = job_detail(o.views, o.report, namespace, training_job)
    stats = html.Div([
        stat("GPUs", f"{row['gpus']:g}", _capacity(row["capacity_type"])),
        stat("cost so far", money(row["cost_dollars"]), f"{money(row['dollars_per_hour'])}/h"),
        stat("GPU-hours", gpu_hours_text(row["gpu_hours"]), "from the GPUs' held samples, as the analysis counts them"),
        stat("findings", "…", "when the analysis is done"),
    ], className="br-stats")
    return [
        html.Div(f"The ledger, findings, MFU and tokens follow when the window's analysis is done; the timeline "
                 f"is the job's GPUs at {o.step_text} means.", className="br-notice", id="job-pending"),
        stats,
        graph("job-timeline", job_timeline(detail, o.simulated, _shown(o, search),
                                           pending="follows when the window's analysis is done")),
    ]


def content(whole: Analysis, namespace: str, training_job: str, search: str) -> list:
    try:
        a = whole.job((namespace, training_job))
    except Unavailable as exc:    # fleet mode's read of the job's own nodes
        return [notice(f"Cannot read {namespace}/{training_job} per GPU: {exc}", error=True)]
    jobs = a.jobs
    match = jobs[(jobs["namespace"] == namespace) & (jobs["training_job"] == training_job)]
    if match.empty:
        return [notice(f"No job {namespace}/{training_job} held GPUs in this window.")]
    row = match.iloc[0]
    job = next(j for j in a.report.jobs if (j.namespace, j.training_job) == (namespace, training_job))
    detail = job_detail(a.views, a.report, namespace, training_job)
    sim = a.simulated
    shown = _shown(a, search)
    mfu, tps = row["mfu"], row["tokens_per_s"]
    stats = html.Div([
        stat("GPUs", f"{row['gpus']:g}", _capacity(row["capacity_type"])),
        stat("cost so far", money(row["cost_dollars"]), f"{money(row['dollars_per_hour'])}/h"),
        stat("goodput", "-" if job.goodput is None else f"{job.goodput:.0%}", "productive / held GPU-hours"),
        stat("MFU", "-" if mfu != mfu or mfu is None else f"{mfu:.1%}"),
        stat("tokens/s", "-" if tps != tps or tps is None else f"{tps:,.0f}"),
        stat("findings", str(len(detail.findings)), f"{money(row['waste_dollars'])} wasted"),
    ], className="br-stats")
    findings = [html.Li([html.Span(f.severity, className="br-sev",
                                   style={"background": SEVERITY_COLORS[f.severity]}),
                         html.B(f" {f.kind} "), html.Span(f"{money(f.wasted_dollars)} wasted · "),
                         html.Span(f.recommendation)]) for f in detail.findings]
    # In fleet mode the job is read on its own: say so, since the range's other pages are the roll-ups'.
    way = [] if a is whole else [html.P(f"This page: {a.way}; the other pages' figures are fleet mode's.",
                                        id="job-way", className="br-hint")]
    return way + [
        ledger_panel(job, sim),
        stats,
        html.Ul(findings, className="br-findings") if findings else html.P("No findings for this job."),
        graph("job-ranks", rank_breakdown(detail.steps, sim)),
        graph("job-timeline", job_timeline(detail, sim, shown)),
    ]


def ledger_panel(job: JobCost, simulated: bool) -> html.Div:
    """The job's ledger as a waterfall, with the categories it cannot measure and why, and what a
    measured one leaves out; one line saying why where the job has no ledger."""
    if job.ledger is None:
        why = job.ledger_basis.get("ledger", "no ledger for this job")
        return html.Div(html.P(f"No GPU-hour ledger for this job: {why}.", id="job-ledger-none", className="br-hint"),
                        id="job-ledger")
    lines = [html.Li([html.B(name.replace("_", " ")), f" not measured: {why}"]) for name, why in unmeasured(job)]
    lines += [html.Li([html.B(name.replace("_", " ")), f": {why}"]) for name, why in caveats(job)]
    note = html.Ul(lines, id="job-ledger-note", className="br-hint") if lines else None
    return html.Div([graph("job-waterfall", ledger_waterfall(job, simulated)), note], id="job-ledger")


def _capacity(kind: str) -> str:
    """Spot or on-demand, under the GPU count; said in full where the node did not say which."""
    return "spot or on-demand: unknown" if kind == "unknown" else kind
