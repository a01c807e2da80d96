"""Figure builders: aggregates in, Plotly figures out. Pure functions, no Dash, so
they are tested without a server or a browser."""
from __future__ import annotations

import html
from typing import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from burnrate.analyzer.costing.cost import JobCost
from burnrate.analyzer.detectors.findings import KINDS
from burnrate.analyzer.grid.views import RankSteps
from burnrate.exporter.ledger import BADPUT, CATEGORIES, PRODUCTIVE

from .aggregate import BadputTimeline, CostSummary, Fleet, JobDetail

SIMULATED_NOTE = "simulated data"
SEVERITY_COLORS = {"critical": "#c0392b", "warning": "#e67e22", "info": "#2980b9"}
STATE_COLORS = {"busy": "#2e86de", "idle": "#f39c12", "utilization unknown": "#636e72", "unallocated": "#b2bec3"}
PHASE_COLORS = {"data wait": "#e17055", "compute": "#00b894", "other": "#b2bec3"}
KIND_COLORS = dict(zip(KINDS, ("#e17055", "#fdcb6e", "#b2bec3", "#6c5ce7", "#d63031", "#e84393",
                               "#fd79a8", "#2d3436", "#0984e3", "#74b9ff", "#a29bfe", "#00cec9",
                               "#ffeaa7", "#4b4b4b", "#e67e22")))
# The ledger's categories, one colour each wherever they are drawn.
LEDGER_COLORS = dict(zip(("productive", "data_wait", "sync_wait", "checkpoint", "evaluation", "startup", "restart",
                          "lost_progress", "diverged", "stalled", "no_process"),
                         ("#00b894", "#e17055", "#fdcb6e", "#74b9ff", "#a29bfe", "#81ecec", "#d63031",
                          "#e84393", "#2d3436", "#6c5ce7", "#636e72")))
MEANINGS = {c.name: c.meaning for c in CATEGORIES}
RESTART_COLOR = "#d63031"
BLOWN_COLOR = LEDGER_COLORS["diverged"]
NO_FINDINGS = "No findings for this job"


def _title(text: str, simulated: bool) -> str:
    return f"{text}  <span style='color:#d35400;font-size:0.8em'>({SIMULATED_NOTE})</span>" if simulated else text


def _layout(fig: go.Figure, title: str, simulated: bool, height: int = 320) -> go.Figure:
    fig.update_layout(title={"text": _title(title, simulated), "x": 0.01, "font": {"size": 15}},
                      template="plotly_white", height=height, margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": -0.18}, hovermode="x unified")
    return fig


def empty_figure(message: str, height: int = 240) -> go.Figure:
    """A figure that says why there is nothing to draw, instead of blank axes."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 15, "color": "#636e72"})
    fig.update_layout(template="plotly_white", height=height, xaxis={"visible": False},
                      yaxis={"visible": False}, margin={"l": 20, "r": 20, "t": 20, "b": 20})
    return fig


def _plain(labels: Iterable) -> list[str]:
    """Names from the cluster (jobs, namespaces, nodes) as Plotly text: Plotly renders
    a subset of HTML in labels (`<a href>` among it), so their angle brackets and ampersands are
    written as entities, which it shows as the characters they are."""
    return [html.escape(str(label), quote=False) for label in labels]


def utilization_heatmap(fleet: Fleet, simulated: bool) -> go.Figure:
    if not fleet.gpu_labels:
        return empty_figure("no GPU data in this window")
    fig = go.Figure(go.Heatmap(
        z=np.round(fleet.util, 1), x=fleet.times, y=_plain(fleet.gpu_labels), zmin=0, zmax=100, colorscale="Viridis",
        colorbar={"title": {"text": "util %"}}, hovertemplate="%{y}<br>%{x}<br>%{z:.0f}%<extra></extra>"))
    fig.update_yaxes(autorange="reversed", showticklabels=len(fleet.gpu_labels) <= 64, title="node/GPU")
    height = int(min(900, max(300, 14 * len(fleet.gpu_labels) + 120)))
    return _layout(fig, f"GPU utilization ({len(fleet.gpu_labels)} GPUs)", simulated, height)


def fleet_state(fleet: Fleet, simulated: bool) -> go.Figure:
    if not len(fleet.times):
        return empty_figure("no GPU data in this window")
    fig = go.Figure()
    states = [("busy", fleet.busy), ("idle", fleet.idle), ("unallocated", fleet.unallocated)]
    if np.nansum(fleet.util_unknown) > 0:
        states.insert(2, ("utilization unknown", fleet.util_unknown))
    # Only the buckets where some GPU reported: a stacked area would draw the others as 0 GPUs.
    known = np.isfinite(fleet.busy)
    for name, values in states:
        fig.add_trace(go.Scatter(x=fleet.times[known], y=np.round(values[known], 2), name=name, stackgroup="gpus",
                                 line={"width": 0.5, "color": STATE_COLORS[name]}))
    fig.update_yaxes(title="GPUs", rangemode="tozero")
    return _layout(fig, "Allocated (busy, idle) vs unallocated GPUs", simulated)


def burn_rate(fleet: Fleet, simulated: bool) -> go.Figure:
    if not len(fleet.times):
        return empty_figure("no GPU data in this window")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=fleet.times, y=np.round(fleet.burn, 2), name="fleet $/h",
                             line={"color": "#2d3436"}))
    fig.add_trace(go.Scatter(x=fleet.times, y=np.round(fleet.burn_unallocated, 2), name="of which unallocated",
                             fill="tozeroy", line={"color": STATE_COLORS["unallocated"]}))
    fig.update_yaxes(title="$ per hour", rangemode="tozero", tickprefix="$")
    return _layout(fig, "Burn rate", simulated)


def rank_breakdown(steps: RankSteps, simulated: bool) -> go.Figure:
    """Stacked seconds per step by rank: a straggler's compute bar stands out, a
    starving loader turns every bar's data-wait part tall."""
    if not steps.ranks:
        return empty_figure("no training telemetry for this job in this window")
    fig = go.Figure()
    for name, values in (("data wait", steps.data_wait), ("compute", steps.compute), ("other", steps.other)):
        fig.add_trace(go.Bar(x=_plain(steps.ranks), y=np.round(values, 4), name=name, marker_color=PHASE_COLORS[name]))
    fig.update_layout(barmode="stack", hovermode="x")
    fig.update_xaxes(title="rank", type="category")
    fig.update_yaxes(title="seconds per step")
    return _layout(fig, "Step time by rank", simulated)


def _any_finite(*series: np.ndarray) -> bool:
    return any(np.isfinite(np.asarray(v, float)).any() for v in series if v is not None and len(v))


def _say_in_panel(fig: go.Figure, row: int, text: str) -> None:
    """Said in the panel, on no axis: an empty row of gridlines reads as a chart that failed,
    and an empty axis's default range (0 to 400%) as figures that are not there."""
    fig.add_annotation(text=text, showarrow=False, xref="x domain", yref="y domain",
                       x=0.5, y=0.5, row=row, col=1, font={"size": 14, "color": "#636e72"})
    fig.update_yaxes(visible=False, row=row, col=1, secondary_y=False)
    fig.update_yaxes(visible=False, row=row, col=1, secondary_y=True)


def _pair_title(left: str, left_values: np.ndarray, right: str, right_values: np.ndarray) -> str:
    """A panel of two series on two axes, titled by those reported ("MFU (no tokens/s reported)")."""
    if _any_finite(left_values) == _any_finite(right_values):
        return f"{left} and {right}"
    shown, missing = (left, right) if _any_finite(left_values) else (right, left)
    return f"{shown} (no {missing} reported)"


def _hide_unreported(fig: go.Figure, row: int, left_values: np.ndarray, right_values: np.ndarray) -> None:
    """The axis of a series the ranks did not report is not drawn: its default range (-1 to 4)
    reads as figures that are not there."""
    for values, secondary in ((left_values, False), (right_values, True)):
        if not _any_finite(values):
            fig.update_yaxes(visible=False, row=row, col=1, secondary_y=secondary)


GPU_PANELS = (("GPU util %", "util"), ("memory used MiB", "memory"), ("power W", "power"), ("NVLink MB/s", "nvlink"))
GPU_PANEL_NAMES = {"util": "utilization", "memory": "memory use", "power": "power draw", "nvlink": "NVLink traffic"}


def job_timeline(detail: JobDetail, simulated: bool, shown: tuple[float, float] | None = None,
                 pending: str | None = None) -> go.Figure:
    """The job's GPUs, training progress and findings on one shared time axis,
    with checkpoints as vertical lines through every panel. The axis opens on `shown`
    (unix seconds: a range the user picked) or else on the job's own life. `pending` says,
    in the training and findings panels, that their figures are still to come."""
    panels = [(t, key) for t, key in GPU_PANELS if key in detail.gpu_series]
    titles = [t for t, _ in panels] + [_pair_title("MFU", detail.mfu, detail.throughput_unit, detail.throughput),
                                       _pair_title("loss", detail.loss, "grad norm", detail.grad_norm), "findings"]
    rows = len(titles)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.045, subplot_titles=titles,
                        specs=[[{"secondary_y": True}]] * rows)
    palette = ["#0984e3", "#00b894", "#6c5ce7", "#e17055", "#fdcb6e", "#e84393", "#00cec9", "#2d3436"]
    for row, (_, key) in enumerate(panels, start=1):
        for i, label in enumerate(detail.gpu_labels):
            fig.add_trace(go.Scatter(x=detail.times, y=np.round(detail.gpu_series[key][i], 2), name=_plain([label])[0],
                                     legendgroup=label, showlegend=row == 1, mode="lines",
                                     line={"width": 1.2, "color": palette[i % len(palette)]}), row=row, col=1)
    # From zero: a GPU's memory, power and traffic are amounts, and a constant one then reads
    # "48.6k" on a plain axis instead of "48.5965k" on an axis around a single value.
    for row, (_, key) in enumerate(panels, start=1):
        fig.update_yaxes(rangemode="tozero", tickformat="~s", row=row, col=1, secondary_y=False)
        # A field the GPUs' exporter does not export (NVLink on PCIe GPUs, a trimmed field list).
        if not _any_finite(*detail.gpu_series[key]):
            _say_in_panel(fig, row, f"no {GPU_PANEL_NAMES[key]} reported for this job's GPUs")
    row = len(panels) + 1
    fig.add_trace(go.Scatter(x=detail.times, y=np.round(detail.mfu, 4), name="MFU", line={"color": "#2d3436"}),
                  row=row, col=1)
    fig.add_trace(go.Scatter(x=detail.times, y=np.round(detail.throughput, 1), name=detail.throughput_unit,
                             line={"color": "#00b894", "dash": "dot"}), row=row, col=1, secondary_y=True)
    # Three significant digits: a CPU run's 0.4% and a GPU run's 41% both read as themselves,
    # where a fixed ".0%" repeats "0%" down a small axis, and ticks half a percent apart (a
    # steady 46-47%) read 46.5% and 47%, where two digits labelled them 46%, 46%, 47%, 47%.
    fig.update_yaxes(tickformat=".3~p", row=row, col=1, secondary_y=False)
    if pending or not _any_finite(detail.mfu, detail.throughput):
        _say_in_panel(fig, row, pending or f"no MFU or {detail.throughput_unit} reported by this job's ranks")
    else:
        _hide_unreported(fig, row, detail.mfu, detail.throughput)
    row += 1
    fig.add_trace(go.Scatter(x=detail.times, y=detail.loss, name="loss", line={"color": "#d63031"}), row=row, col=1)
    fig.add_trace(go.Scatter(x=detail.times, y=detail.grad_norm, name="grad norm", line={"color": "#636e72"}),
                  row=row, col=1, secondary_y=True)
    if pending or not _any_finite(detail.loss, detail.grad_norm):
        _say_in_panel(fig, row, pending or "no loss or grad norm reported by this job's ranks")
    else:
        _hide_unreported(fig, row, detail.loss, detail.grad_norm)
    loss_row = row
    row += 1
    for f in detail.findings:
        start, end = _datetimes([f.start, f.end])
        fig.add_trace(go.Scatter(
            x=[start, end], y=[f.kind, f.kind], mode="lines+markers", name=f.kind, showlegend=False,
            line={"width": 10, "color": SEVERITY_COLORS[f.severity]},
            hovertext=f"{f.kind} ({f.severity}) {_money(f.wasted_dollars)}", hoverinfo="text"), row=row, col=1)
    if pending or not detail.findings:
        # A row without a trace is not drawn at all, its note with it: an empty one holds it.
        fig.add_trace(go.Scatter(x=detail.times[:1], y=[None], showlegend=False, hoverinfo="skip"), row=row, col=1)
        _say_in_panel(fig, row, pending or NO_FINDINGS)
    # All rows share one x range and domain, so one paper-high line per checkpoint
    # crosses every panel (add_vline per panel costs seconds at a day of checkpoints).
    fig.update_layout(shapes=[{"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                               "line": {"color": "#b2bec3", "dash": "dash", "width": 1}}
                              for x in _datetimes(detail.checkpoints)])
    if detail.checkpoints:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="checkpoint",
                                 line={"color": "#b2bec3", "dash": "dash"}), row=1, col=1)
    _mark_restarts(fig, detail)
    if not pending:
        _mark_blown(fig, detail, loss_row)
    # A date axis over the job's own time on every row: a row without traces (no findings)
    # would otherwise make the shared axis linear and squeeze every panel into the edge.
    # Every panel shows its time ticks: shared axes would keep them for the bottom one only,
    # a screen's height below the top panels.
    x_range = list(_datetimes(list(shown))) if shown is not None else _job_extent(detail)
    fig.update_xaxes(type="date", range=x_range, showticklabels=True, tickformatstops=TIME_TICKS)
    fig.update_xaxes(tickformatstops=None, row=rows, col=1)
    fig = _layout(fig, _plain([f"{detail.namespace}/{detail.training_job} over time"])[0], simulated, height=190 * rows)
    fig.update_layout(legend={"orientation": "h", "y": -0.04}, hovermode="x")
    return fig


# Each side of a job's life: a one-minute job in a day's window fills its panels instead of
# being a sliver at their edge, and its first and last points are not on the frame.
JOB_MARGIN = 0.05


def _job_extent(detail: JobDetail) -> list[pd.Timestamp] | None:
    """From the job's first to the end of its last bucket with any series, its findings and
    restarts included, widened by JOB_MARGIN of that each side and at least one bucket."""
    seen = np.zeros(len(detail.times), bool)
    for values in (*detail.gpu_series.values(), detail.mfu[None], detail.throughput[None], detail.loss[None],
                   detail.grad_norm[None]):
        if values.size:
            seen |= np.isfinite(values).any(axis=0)
    times = pd.DatetimeIndex(detail.times)
    step = times[1] - times[0] if len(times) > 1 else pd.Timedelta(0)
    ends = list(_datetimes([v for f in detail.findings for v in (f.start, f.end)] +
                           [v for r in detail.restarts for v in (r.start, r.end)]))
    if seen.any():
        ends += [times[seen].min(), times[seen].max() + step]
    if not ends:
        return None
    first, last = min(ends), max(ends)
    margin = max((last - first) * JOB_MARGIN, step)
    return [first - margin, last + margin]


# The upper panels' time ticks, short as the tick spacing allows (the bottom panel's carry the
# date): seconds where ticks are under a minute apart, so a 3-minute job's ticks are not all
# "15:04"; the day where they are a day apart or more.
TIME_TICKS = [{"dtickrange": [None, 60_000], "value": "%H:%M:%S"},
              {"dtickrange": [60_000, 86_400_000], "value": "%H:%M"},
              {"dtickrange": [86_400_000, None], "value": "%b %d"}]


def _mark_restarts(fig: go.Figure, detail: JobDetail) -> None:
    """A band through every panel from each run's last step to the next run's process start
    (its edge a line, so a restart shorter than a pixel still shows), labelled at the top."""
    if not detail.restarts:
        return
    starts, ends = _datetimes([r.start for r in detail.restarts]), _datetimes([r.end for r in detail.restarts])
    for r, x0, x1 in zip(detail.restarts, starts, ends):
        fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, layer="below",
                      fillcolor=RESTART_COLOR, opacity=0.15, line={"color": RESTART_COLOR, "width": 1})
        fig.add_annotation(x=x0, xref="x", y=1, yref="paper", yanchor="bottom", xanchor="right", showarrow=False,
                           text=r.label, font={"size": 11, "color": RESTART_COLOR},
                           bgcolor="rgba(255,255,255,0.85)", name="restart")
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="restart",
                             line={"color": RESTART_COLOR, "width": 6}, opacity=0.4), row=1, col=1)


def _mark_blown(fig: go.Figure, detail: JobDetail, row: int) -> None:
    """A band over the loss panel where the ranks reported a loss or gradient norm that was not
    finite, which the panel cannot draw: the model had blown up, and the ledger's `diverged`
    holds those steps."""
    times = detail.times
    bucket = times[1] - times[0] if len(times) > 1 else np.timedelta64(0, "s")
    edges = np.flatnonzero(np.diff(np.r_[False, detail.blown, False]))
    for a, b in zip(edges[::2], edges[1::2]):
        fig.add_vrect(x0=times[a], x1=times[b] if b < len(times) else times[-1] + bucket, row=row, col=1,
                      fillcolor=BLOWN_COLOR, opacity=0.15, line_width=0, layer="below",
                      annotation_text="loss or grad norm not finite" if a == edges[0] else None,
                      annotation_position="top left", annotation_font={"size": 11, "color": BLOWN_COLOR})


def _datetimes(seconds: list[float]) -> pd.DatetimeIndex:
    # To the millisecond: Plotly would drop the nanoseconds a float's conversion leaves, with a warning each.
    return pd.to_datetime(seconds, unit="s").round("ms")


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def cost_by_namespace(summary: CostSummary, simulated: bool) -> go.Figure:
    if summary.by_namespace.empty:
        return empty_figure("no priced jobs in this window")
    fig = go.Figure()
    for capacity, part in summary.by_namespace.groupby("capacity_type", sort=True):
        fig.add_trace(go.Bar(x=_plain(part["namespace"]), y=part["cost_dollars"].round(2), name=_plain([capacity])[0]))
    # Each namespace's total written over its stack: beside a $200 one, a $0.20 namespace has
    # no bar to see, and its legend entry would name nothing on the chart.
    totals = summary.by_namespace.groupby("namespace", sort=True)["cost_dollars"].sum()
    fig.add_trace(go.Scatter(x=_plain(totals.index), y=totals.round(2), mode="text", text=[_money(v) for v in totals],
                             textposition="top center", showlegend=False, hoverinfo="skip", cliponaxis=False))
    fig.update_layout(barmode="stack", hovermode="x")
    # Room above the tallest stack for its total: autorange fits the bars, not the text over them.
    fig.update_yaxes(title="$", tickprefix="$", range=[0, max(float(totals.max()), 0.01) * 1.15])
    return _layout(fig, "Cost by namespace and capacity type", simulated)


def cost_by_job(summary: CostSummary, simulated: bool, top: int = 15) -> go.Figure:
    jobs = summary.by_job.head(top)
    if jobs.empty:
        return empty_figure("no priced jobs in this window")
    jobs = jobs[::-1]     # the costliest on top
    fig = go.Figure(go.Bar(x=jobs["cost_dollars"].round(2), y=_plain(jobs["job"]), orientation="h", marker_color="#0984e3",
                           name="cost", **_opens_job(jobs, "$%{x:,.2f}")))
    fig.update_xaxes(title="$", tickprefix="$")
    fig.update_layout(hovermode="y")
    return _layout(fig, f"Top {len(jobs)} jobs by cost", simulated, height=max(320, 26 * len(jobs) + 100))


def _opens_job(jobs: pd.DataFrame, value: str) -> dict:
    """A bar per job carries the job's key, so that a click on it can open the job's page."""
    return {"customdata": jobs[["namespace", "training_job"]].to_numpy().tolist(),
            "hovertemplate": f"%{{y}}: {value}<br>click to open the job<extra></extra>"}


def spot_savings(summary: CostSummary, simulated: bool) -> go.Figure:
    if summary.spot_on_demand_dollars <= 0:
        return empty_figure("no spot capacity in this window")
    fig = go.Figure(go.Bar(x=["paid on spot", "same hours on-demand"],
                           y=[round(summary.spot_dollars, 2), round(summary.spot_on_demand_dollars, 2)],
                           marker_color=["#00b894", "#b2bec3"],
                           text=[_money(summary.spot_dollars), _money(summary.spot_on_demand_dollars)]))
    fig.update_yaxes(title="$", tickprefix="$")
    fig.update_layout(hovermode="x")
    return _layout(fig, f"Spot saved {_money(summary.spot_saved)}", simulated)


def waste_by_cause(summary: CostSummary, simulated: bool) -> go.Figure:
    waste = summary.waste_by_cause
    if waste.empty:
        return empty_figure("no waste found in this window")
    fig = go.Figure(go.Bar(x=list(waste.index), y=waste.round(2).to_numpy(),
                           marker_color=[KIND_COLORS.get(k, "#636e72") for k in waste.index]))
    fig.update_yaxes(title="wasted $", tickprefix="$")
    fig.update_layout(hovermode="x")
    return _layout(fig, "Waste by cause", simulated)


TOP_JOBS = 15
# Past two decades between the cheapest and the dearest bar, a linear axis shows one bar:
# a CPU-trained job's $/B tokens is thousands of times a GPU job's.
LOG_SPAN = 100.0


def cost_per_billion_tokens(summary: CostSummary, simulated: bool, top: int = TOP_JOBS) -> go.Figure:
    """The jobs' $ per billion tokens, the dearest `top`, each bar labelled with its value and
    its basis (the tokens counted, the GPU-hours) on hover; on a log axis where the values span
    more than two decades."""
    jobs = summary.by_job.dropna(subset=["cost_per_billion_tokens"]).sort_values("cost_per_billion_tokens")
    jobs = jobs.tail(top)
    if jobs.empty:
        return empty_figure("no priced job counted tokens in this window")
    values = jobs["cost_per_billion_tokens"].astype(float)
    basis = [f"${c:,.2f} over {t / 1e9:,.4g} billion tokens counted in {h:,.2f} GPU-hours"
             for c, t, h in zip(jobs["cost_dollars"], jobs["tokens"], jobs["gpu_hours"])]
    fig = go.Figure(go.Bar(x=values.round(2), y=_plain(jobs["job"]), orientation="h", marker_color="#6c5ce7",
                           text=[_money(v) for v in values], textposition="outside", cliponaxis=False,
                           hovertext=basis, **_opens_job(jobs, "$%{x:,.2f} per billion tokens<br>%{hovertext}")))
    low, high = float(values.min()), float(values.max())
    if high > LOG_SPAN * low:
        # Half a decade each side: the cheapest bar stays visible, the dearest keeps room for its label.
        fig.update_xaxes(type="log", range=[np.log10(low) - 0.5, np.log10(high) + 0.5],
                         title="$ per billion tokens (log scale: each gridline ten times the last)")
    else:
        fig.update_xaxes(range=[0, high * 1.2], title="$ per billion tokens")
    fig.update_xaxes(tickprefix="$")
    fig.update_layout(hovermode="y")
    return _layout(fig, "Cost per billion tokens: the job's cost over the tokens it counted", simulated,
                   height=max(320, 26 * len(jobs) + 100))


def _label(category: str) -> str:
    return category.replace("_", " ")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _hours(value: float) -> str:
    return f"{value:,.2f} GPU-h"


def ledger_waterfall(job: JobCost, simulated: bool) -> go.Figure:
    """Where the job's money went: what it was allocated, less each cause of badput, leaves
    what its productive steps cost. In GPU-hours where the job has no price. Categories that
    cannot be measured (None) are not drawn: the page says why."""
    if job.ledger is None:
        return empty_figure(job.ledger_basis.get("ledger", "no ledger for this job"))
    priced = job.cost_dollars is not None
    value = job.ledger_dollars if priced else (lambda hours: hours)
    show = _money if priced else _hours
    causes = [(c, value(h)) for c in BADPUT if (h := job.ledger.gpu_hours.get(c)) is not None and h > 0]
    allocated = job.cost_dollars if priced else job.gpu_hours
    productive = value(job.ledger.gpu_hours.get(PRODUCTIVE) or 0.0)
    hours = [job.gpu_hours] + [job.ledger.gpu_hours[c] for c, _ in causes] + \
        [job.ledger.gpu_hours.get(PRODUCTIVE) or 0.0]
    why = ["every GPU-hour the job held"] + [MEANINGS[c] for c, _ in causes] + [MEANINGS[PRODUCTIVE]]
    fig = go.Figure(go.Waterfall(
        x=["allocated"] + [_label(c) for c, _ in causes] + [_label(PRODUCTIVE)],
        measure=["absolute"] + ["relative"] * len(causes) + ["total"],
        y=[allocated] + [-v for _, v in causes] + [productive],
        text=[show(allocated)] + [f"−{show(v)}" for _, v in causes] + [show(productive)],
        textposition="outside", cliponaxis=False,
        customdata=[[_hours(h), w] for h, w in zip(hours, why)],
        hovertemplate="%{x}: %{text} (%{customdata[0]})<br>%{customdata[1]}<extra></extra>",
        decreasing={"marker": {"color": LEDGER_COLORS["data_wait"]}},
        totals={"marker": {"color": LEDGER_COLORS[PRODUCTIVE]}},
        connector={"line": {"color": "#b2bec3", "dash": "dot", "width": 1}}))
    if priced:
        fig.update_yaxes(title="$", tickprefix="$", rangemode="tozero")
    else:
        fig.update_yaxes(title="GPU-hours (the job has no price)", rangemode="tozero")
    fig.update_layout(hovermode="x", showlegend=False)
    spent = show(allocated)
    return _layout(fig, f"Where the {spent} went · goodput {_percent(job.goodput)}", simulated, height=360)


def namespace_goodput(frame: pd.DataFrame, simulated: bool) -> go.Figure:
    """Per namespace, its training jobs' goodput (GPU-hours-weighted) beside their badput by
    cause: in $ where every such job has a price, else in GPU-hours."""
    if frame.empty:
        return empty_figure("no training job has a ledger in this window")
    dollars = bool(frame["priced"].all())
    unit = "dollars" if dollars else "gpu_hours"
    frame = frame.iloc[::-1]            # the most GPU-hours on top
    names = _plain(frame["namespace"])
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.3, 0.7], horizontal_spacing=0.03,
                        subplot_titles=["goodput (productive / held GPU-hours)",
                                        "badput by cause, $" if dollars else "badput by cause, GPU-hours "
                                        "(some jobs have no price)"])
    fig.add_trace(go.Bar(x=frame["goodput"], y=names, orientation="h", marker_color=LEDGER_COLORS[PRODUCTIVE],
                         text=[_percent(g) for g in frame["goodput"]], textposition="auto", showlegend=False,
                         customdata=np.stack([frame["jobs"], frame["gpu_hours"]], axis=1),
                         hovertemplate="%{y}: goodput %{text} of %{customdata[1]:,.1f} GPU-hours "
                                       "(%{customdata[0]} training jobs)<extra></extra>"), row=1, col=1)
    for cause in BADPUT:
        values = frame[f"{cause}_{unit}"].astype(float)
        if not (values > 0).any():
            continue
        fig.add_trace(go.Bar(x=values.round(4), y=names, orientation="h", name=_label(cause),
                             marker_color=LEDGER_COLORS[cause],
                             hovertemplate=f"%{{y}}: {_label(cause)} " +
                                           ("$%{x:,.2f}" if dollars else "%{x:,.2f} GPU-h") + "<extra></extra>"),
                      row=1, col=2)
    fig.update_layout(barmode="stack", hovermode="closest")
    fig.update_xaxes(range=[0, 1], tickformat=".0%", row=1, col=1)
    fig.update_xaxes(tickprefix="$" if dollars else "", rangemode="tozero", row=1, col=2)
    fig.update_annotations(font={"size": 12})
    fig = _layout(fig, "Goodput by namespace (training jobs)", simulated, height=max(320, 34 * len(frame) + 160))
    fig.update_layout(legend={"orientation": "h", "y": -0.2, "traceorder": "normal"})
    return fig


def badput_over_time(timeline: BadputTimeline, simulated: bool) -> go.Figure:
    """The fleet's badput by cause, stacked: the training jobs' ledgers summed over time."""
    if not timeline.jobs:
        return empty_figure("no training job has a ledger in this window")
    causes = [c for c in BADPUT if np.any(timeline.rate[c] > 0)]
    if not causes:
        return empty_figure("the training jobs' ledgers show no badput in this window")
    fig = go.Figure()
    for cause in causes:
        fig.add_trace(go.Scatter(x=timeline.times, y=np.round(timeline.rate[cause], 4), name=_label(cause),
                                 stackgroup="badput", line={"width": 0.5, "color": LEDGER_COLORS[cause]}))
    if timeline.dollars:
        fig.update_yaxes(title="badput $ per hour", tickprefix="$", rangemode="tozero")
    else:
        fig.update_yaxes(title="badput GPU-hours per hour<br>(some jobs have no price)", rangemode="tozero")
    fig = _layout(fig, f"Fleet badput by cause ({timeline.jobs} training jobs)", simulated)
    fig.update_layout(legend={"traceorder": "normal"})
    return fig
