"""Layout pieces every page uses: the empty and error states, number cards,
links that keep the time range, and the one place a page's callback turns a URL
into an analysis."""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable
from urllib.parse import quote

import flask
from dash import callback_context, dcc, html, no_update
from dash.dash_table import FormatTemplate
from dash.dash_table.Format import Format, Scheme
from plotly.graph_objects import Figure

from .data import Analysis, DataService, Services, Unavailable, describe_window
from .overview import Overview
from .timerange import TimeRange, from_query, query, with_params

SERVICE_KEY = "burnrate"
# How often a page drawn from the overview asks whether its window's analysis is done.
POLL_MS = 2000


def current_services() -> Services:
    """The app's data services; callbacks and layouts run inside its Flask app."""
    return flask.current_app.extensions[SERVICE_KEY]


def current_service(search: str | None = None) -> DataService:
    """The data service of the cluster the URL names (KeyError for one the store lacks)."""
    return current_services().of(query(search).get("cluster"))


def notice(message: str, error: bool = False) -> html.Div:
    return html.Div(message, className="br-notice br-error" if error else "br-notice")


def stat(label: str, value: str, sub: str | None = None) -> html.Div:
    return html.Div([html.Div(label, className="br-stat-label"), html.Div(value, className="br-stat-value"),
                     html.Div(sub or "", className="br-stat-sub")], className="br-stat")


def graph(id_: str, figure: Figure) -> dcc.Graph:
    return dcc.Graph(id=id_, figure=figure, config={"displaylogo": False, "responsive": True})


def money(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def sum_of_money(value: float | None) -> str:
    """A window's dollars: whole from $100, with cents below, so a short window's $0.31 is
    not "$0"."""
    return money(value, 0 if value is not None and abs(value) >= 100 else 2)


def gpu_hours_text(value: float) -> str:
    """GPU-hours: one decimal from 10, three significant digits below (a three-minute job's
    0.0397 is not "0.0")."""
    return f"{value:,.1f}" if abs(value) >= 10 or value == 0 else f"{value:.3g}"


# Numbers stay numbers in a table, so that sorting a column orders them by value; the format only shows them.
_MONEY = {"type": "numeric", "format": FormatTemplate.money(2)}
_TWO_DECIMALS = {"type": "numeric", "format": Format(precision=2, scheme=Scheme.fixed)}
_COLUMN_KINDS = {"training_job": {"presentation": "markdown"}, "wasted_dollars": _MONEY,
                 "hours": _TWO_DECIMALS, "wasted_gpu_hours": _TWO_DECIMALS}


def finding_columns(columns: Iterable[tuple[str, str]]) -> list[dict]:
    """A findings table's columns, (header, row key) each: dollars as "$1,234.50", hours to two
    decimals, the job as a link."""
    return [{"name": name, "id": id_, **_COLUMN_KINDS.get(id_, {})} for name, id_ in columns]


def range_search(search: str | None) -> str:
    """Only the cluster and time range of a query string: what a link to another page keeps."""
    params = query(search)
    return with_params("", **{k: params[k] for k in ("cluster", "range", "start", "end") if k in params})


_MARKDOWN_PUNCTUATION = re.compile(r"[!-/:-@\[-`{-~]")


def job_href(namespace: str, training_job: str, search: str | None) -> str:
    return f"/job/{quote(namespace, safe='')}/{quote(training_job, safe='')}{range_search(search)}"


def job_link(namespace: str, training_job: str, search: str | None) -> str:
    """A job's name linking to its page, as markdown: what a table cell can hold.
    assets/links.js makes such links navigate inside the app. The name is whatever a
    pod's labels say: escaped, it can only ever be text, never a link or an image."""
    return f"[{markdown_text(training_job)}]({job_href(namespace, training_job, search)})"


def markdown_text(text: str) -> str:
    """`text` as literal markdown: every ASCII punctuation mark backslash-escaped
    (CommonMark allows it on each), so no bracket, bang or angle bracket means anything."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\g<0>", text)


def render(search: str | None, build: Callable[[Analysis, str], Any],
           service: DataService | None = None) -> Any:
    """A page's content for the URL's range: `build(analysis, search)`, or a clear
    notice when the range is malformed, the data unreachable, or the window empty."""
    picked = _picked(search, service)
    if isinstance(picked, html.Div):
        return picked
    service, time_range = picked
    try:
        analysis = service.analysis(time_range)
    except Unavailable as exc:
        return notice(str(exc), error=True)
    return _built(analysis, build, search)


def _picked(search: str | None, service: DataService | None) -> tuple[DataService, TimeRange] | html.Div:
    """The URL's service and range, or the notice that says why there is none."""
    try:
        service = service or current_service(search)
    except KeyError:
        known = ", ".join(current_services().clusters)
        return notice(f"No cluster {query(search).get('cluster')!r} in this store (it holds {known}).", error=True)
    try:
        return service, from_query(search, service.default_range)
    except ValueError as exc:
        return notice(f"Invalid time range in the URL: {exc}", error=True)


def _built(shown: Analysis | Overview, build: Callable, search: str | None) -> Any:
    if shown.empty:
        return notice(f"No data in this window ({describe_window(shown.frames.window)}).")
    return build(shown, search or "")


def early_parts(page: str) -> list:
    """Where `render_early` says the analysis is running, and the poll that asks whether it is done:
    `<page>-progress` and `<page>-poll`, the second and third outputs of the page's callback."""
    return [html.Div(id=f"{page}-progress"), dcc.Interval(id=f"{page}-poll", interval=POLL_MS, disabled=True)]


def poll_fired(page: str, polls: int | None) -> bool:
    """Whether the callback running now was fired by the page's poll (`early_parts`)."""
    return bool(polls) and callback_context.triggered_id == f"{page}-poll"


def render_after(search: str | None, build: Callable[[Analysis, str], Any], waiting: str) -> Any:
    """A section drawn from the analysis alone: `waiting` while it runs, never starting it (the
    page's `render_early` does, after its overview). Put the page's poll's `disabled` among the
    section's inputs: the poll stops once the analysis is kept, which draws the section."""
    picked = _picked(search, None)
    if isinstance(picked, html.Div):
        return picked
    service, time_range = picked
    if not service.kept(time_range) and service.overview(time_range) is not None:
        return notice(waiting)
    return render(search, build, service)


def render_early(search: str | None, build: Callable[[Analysis, str], Any],
                 build_early: Callable[[Overview, str], Any], polled: bool) -> tuple[Any, Any, bool]:
    """A page that draws before its analysis is done: (content, progress line, whether to stop
    polling). While the analysis runs, `build_early` draws the overview (dashboard/overview.py)
    and the progress line says so; a poll that finds it still running sends the line alone."""
    picked = _picked(search, None)
    if isinstance(picked, html.Div):
        return picked, None, True
    service, time_range = picked
    try:
        early = None if service.kept(time_range) else service.overview(time_range)
        # The analysis starts from the first poll, once the page has drawn the overview: started
        # before, it would share the store and the CPUs with the overview's read and its drawing.
        analysis = service.ready(time_range) if early is None or polled else None
    except Unavailable as exc:
        return notice(str(exc), error=True), None, True
    if analysis is None and early is None:    # a source without an early read: wait for the analysis
        return render(search, build, service), None, True
    if analysis is not None:
        return _built(analysis, build, search), None, True
    gpus = len(early.fleet.gpu_labels)
    line = notice(f"analysing the window's {gpus:,} GPUs… ({service.analysing_for(time_range):.0f} s so far): "
                  f"findings and the ledger follow when it is done; until then the figures are "
                  f"{early.basis}.")
    return (no_update if polled else _built(early, build_early, search)), line, False
