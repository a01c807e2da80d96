"""The app factory: one Dash app (Dash Pages) over one data source, or one per cluster.

The shell around the pages holds what they share: the URL (cluster, time range, the job
in the path, the findings' filters), the cluster and range pickers, the live-refresh interval and the header that
says which window is shown and whether its data is simulated. The app only reads.
"""
from __future__ import annotations

import os

import dash
import flask
from dash import Input, Output, ctx, dcc, html, no_update

from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.costing.pricing import Catalog, load_catalog

from . import auth
from .data import Analysis, DataService, Services, Source, Unavailable, describe_window
from .timerange import ALL, CUSTOM, PRESETS, from_query, picker_value, query, with_params
from .ui import POLL_MS, SERVICE_KEY, current_service, range_search

HERE = os.path.dirname(os.path.abspath(__file__))


def create_app(source: Source | dict[str, Source], catalog: Catalog | None = None, *, ttl_s: float = 30.0,
               refresh_s: float = 60.0, basic_auth: tuple[str, str] | None = None,
               config: DetectorConfig = DetectorConfig(), forced_by: str | None = None,
               rollup_interval_s: float | None = None) -> dash.Dash:
    """A dashboard over `source` (a PrometheusSource or RecordingSource), or over each
    cluster of a store (cluster name -> its source), picked in the header. Analyses
    are cached for `ttl_s`; pages refresh every `refresh_s` while live refresh is on;
    `config` holds the detectors' thresholds; a store is read as `burnrate analyze` reads it,
    fleet mode or per GPU as the store's roll-ups or `forced_by` (--fleet, --per-gpu) say."""
    app = dash.Dash("burnrate.dashboard", use_pages=True, pages_folder=os.path.join(HERE, "pages"),
                    assets_folder=os.path.join(HERE, "assets"), title="burnrate",
                    suppress_callback_exceptions=True, update_title=None)
    catalog = catalog or load_catalog(None)
    sources = source if isinstance(source, dict) else {"": source}
    services = Services({name: DataService(s, catalog, ttl_s=ttl_s, config=config, forced_by=forced_by,
                                                  rollup_interval_s=rollup_interval_s) for name, s in sources.items()})
    service = services.of(None)
    app.server.extensions[SERVICE_KEY] = services
    auth.add_health(app.server)
    if basic_auth is not None:
        auth.require_basic_auth(app.server, *basic_auth)
    _start_first_reads(app)     # after the credentials are checked
    options = [{"label": "whole recording", "value": ALL}] if service.default_range == ALL else []
    options += [{"label": f"last {p}", "value": p} for p in PRESETS]
    options.append({"label": "custom range", "value": CUSTOM, "disabled": True})
    app.layout = html.Div([
        dcc.Location(id="app-url", refresh="callback-nav"),
        dcc.Interval(id="app-refresh", interval=int(refresh_s * 1000)),
        html.Header([
            html.Div("burnrate", className="br-brand"),
            html.Nav(id="app-nav", className="br-nav"),
            html.Div([
                dcc.Dropdown(id="app-cluster", value=services.default,
                             options=[{"label": f"cluster {c or '(no label)'}", "value": c} for c in services.clusters],
                             clearable=False, searchable=False, className="br-range",
                             style={} if services.clusters else {"display": "none"}),
                dcc.Dropdown(id="app-range", options=options, value=service.default_range, clearable=False,
                             searchable=False, className="br-range"),
                dcc.Checklist(id="app-live", options=[{"label": " live", "value": "live"}], value=["live"],
                              className="br-live"),
            ], className="br-controls"),
        ], className="br-header"),
        html.Div(id="app-status", className="br-status"),
        dcc.Interval(id="app-status-poll", interval=POLL_MS, disabled=True),
        html.Main(dash.page_container, className="br-main"),
    ])
    _register_shell_callbacks(app, service.default_range, services.default)
    return app


def _start_first_reads(app: dash.Dash) -> None:
    """A page's HTML starts the read its first callback waits on: the browser loads the page's
    scripts in between, a third of a second of a first paint from a fleet's store (bench/RESULTS.md).
    Only a browser's request for a page does (it asks for text/html by name); its scripts, its
    callbacks and probes read nothing."""
    # Dash serves every page from these two routes; its scripts, callbacks, assets and the
    # health check have routes of their own.
    pages = {app.config.routes_pathname_prefix, app.config.routes_pathname_prefix + "<path:path>"}

    @app.server.before_request
    def start() -> None:
        request = flask.request
        if request.method != "GET" or request.url_rule is None or request.url_rule.rule not in pages or \
                "text/html" not in request.headers.get("Accept", ""):
            return
        search = request.query_string.decode("utf-8", "replace")
        try:
            service = current_service(search)
            service.start_overview(from_query(search, service.default_range))
        except (KeyError, ValueError):
            pass    # the page says what is wrong with its URL


def _register_shell_callbacks(app: dash.Dash, default_range: str, default_cluster: str) -> None:
    @app.callback(Output("app-url", "search"), Output("app-range", "value"), Output("app-cluster", "value"),
                  Input("app-range", "value"), Input("app-cluster", "value"), Input("app-url", "search"))
    def sync_pickers(value: str, cluster: str, search: str | None):
        if ctx.triggered_id == "app-cluster":
            return cluster_sync(cluster, search, default_cluster), no_update, no_update
        url, picked = range_sync(ctx.triggered_id, value, search, default_range)
        return url, picked, query(search).get("cluster", default_cluster)

    @app.callback(Output("app-refresh", "disabled"), Input("app-live", "value"))
    def live(value: list[str] | None) -> bool:
        return "live" not in (value or [])

    @app.callback(Output("app-nav", "children"), Input("app-url", "pathname"), Input("app-url", "search"))
    def nav(pathname: str | None, search: str | None) -> list:
        return nav_links(pathname, search)

    # While a page draws its overview, the header asks again until the analysis is done, which
    # says how the store was read and what its report notes.
    @app.callback(Output("app-status", "children"), Output("app-status-poll", "disabled"),
                  Input("app-url", "search"), Input("app-refresh", "n_intervals"),
                  Input("app-status-poll", "n_intervals"))
    def status(search: str | None, _n: int | None, _polls: int | None) -> tuple[list, bool]:
        parts, pending = status_line(search)
        return parts, not pending


def range_sync(trigger: str | None, value: str, search: str | None, default_range: str):
    """The picker writes the range into the URL; a URL (typed, shared, or history)
    sets the picker. One callback, so the two never chase each other."""
    if trigger == "app-range" and value != CUSTOM:
        if value == picker_value(search, default_range):
            return no_update, no_update
        return with_params(search, range=value, start=None, end=None), no_update
    return no_update, picker_value(search, default_range)


def cluster_sync(cluster: str, search: str | None, default_cluster: str):
    """The cluster picker writes `cluster=` into the URL (the first cluster needs none)."""
    if cluster == query(search).get("cluster", default_cluster):
        return no_update
    return with_params(search, cluster=None if cluster == default_cluster else cluster)


def nav_links(pathname: str | None, search: str | None) -> list:
    """A link per page in the registry, keeping the range; pages with path
    variables (a job's detail) are reached from their listing instead."""
    keep = range_search(search)
    links = []
    for page in dash.page_registry.values():
        if page.get("path_template"):
            continue
        active = (pathname or "/") == page["relative_path"]
        links.append(dcc.Link(page["name"], href=page["relative_path"] + keep,
                              className="br-link br-active" if active else "br-link"))
    return links


def status_line(search: str | None) -> tuple[list, bool]:
    """The header's line, and whether it is the overview's while the analysis runs (the
    analysis' way of reading the store and its notes follow)."""
    try:
        service = current_service(search)
        time_range = from_query(search, service.default_range)
        # While the analysis runs, the overview the page draws says which window it is.
        shown = (service.analysis(time_range) if service.kept(time_range) else
                 service.overview(time_range) or service.analysis(time_range))
    except (KeyError, ValueError, Unavailable):
        return [], False     # the page itself says what is wrong
    parts: list = []
    if shown.simulated:
        parts.append(html.Span("SIMULATED DATA", className="br-badge", id="app-simulated"))
    parts.append(html.Span(f"{describe_window(shown.frames.window)} UTC · {service.where}"))
    if not isinstance(shown, Analysis):
        return parts, True
    analysis = shown
    if analysis.way:
        parts.append(html.Span(analysis.way, id="app-way"))
    if analysis.report.missing:
        parts.append(html.Span("missing signals: " + ", ".join(analysis.report.missing), className="br-warn"))
    parts += [html.Span(note, className="br-warn") for note in analysis.report.notes]
    return parts, False
