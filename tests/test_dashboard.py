"""The dashboard without a browser: time ranges and the findings' filters in the
URL, the analysis cache, aggregation, figure builders, page callbacks, the status
line, empty and error states, basic auth and the command line."""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import threading
import time

from dataclasses import replace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from dash import html, no_update

from burnrate.analyzer.costing.ledger import Ledger, RunLedger
from burnrate.analyzer.sources import PrometheusSource, RecordingSource
from burnrate.exporter.ledger import BADPUT, NAMES
from burnrate.analyzer.grid import freed
from burnrate.analyzer.grid.views import RankSteps
from burnrate.cli import main as burnrate
from burnrate.dashboard import aggregate, figures
from burnrate.dashboard.app import create_app, nav_links, range_sync, status_line
from burnrate.dashboard.data import TtlCache, Unavailable, describe_source
from burnrate.dashboard.filters import FindingFilters
from burnrate.dashboard.timerange import TimeRange, from_query, picker_value, with_params
from burnrate.dashboard.ui import current_service, render
from burnrate.simulator.simulate import Spec, simulate
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze
from tests.conftest import ROOT, free_port
from tests.test_detectors import Fleet

# Three nodes of 8 GPUs: room for a full-node straggler job beside the GPUs kept free.
SPEC = Spec(nodes=3, gpus_per_node=8, hours=1.0, step_s=15.0, seed=0, end=1_795_000_000.0)


def make_recording(root: str) -> list[dict]:
    """A small simulated fleet with every common fault injected; returns its ground truth."""
    simulate(root, SPEC)
    with open(os.path.join(root, "ground_truth.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dash") / "recording")
    return root, make_recording(root)


@pytest.fixture(scope="module")
def app(recording):
    return create_app(RecordingSource(recording[0]), refresh_s=3600)


@pytest.fixture(scope="module")
def analysis(app):
    with app.server.app_context():
        service = current_service()
        return service.analysis(from_query("", service.default_range))


@pytest.fixture(scope="module")
def pages(app):
    from burnrate.dashboard.pages import cost, fleet, findings, job, jobs   # registered by create_app
    return {"fleet": fleet, "jobs": jobs, "job": job, "findings": findings, "cost": cost}


def _find(component, id_: str):
    """The component with `id_` inside a Dash component tree (None if absent)."""
    if getattr(component, "id", None) == id_:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, str) and (found := _find(child, id_)) is not None:
            return found
    return None


def _text(component) -> str:
    """Every string inside a Dash component tree."""
    if isinstance(component, str):
        return component
    if isinstance(component, (list, tuple)):
        return " ".join(_text(c) for c in component)
    children = getattr(component, "children", None)
    return _text(children) if children is not None else ""


# --- time ranges -----------------------------------------------------------------------
def test_time_ranges_from_the_url():
    assert from_query("?range=6h", "all") == TimeRange(last=6 * 3600)
    assert from_query("", "all").is_all
    assert from_query("?start=2026-11-21T00:00:00Z&end=2026-11-21T01:00:00Z", "6h").end - \
        from_query("?start=2026-11-21T00:00:00Z", "6h").start == 3600
    for bad in ("?range=soon", "?end=2026-11-21T00:00:00Z", "?start=20&end=10"):
        with pytest.raises(ValueError):
            from_query(bad, "6h")
    assert picker_value("?start=1&end=2", "6h") == "custom"
    assert picker_value("?range=1h", "all") == "1h" and picker_value("", "all") == "all"
    # No option for these: shown as custom rather than cleared (with the range).
    assert picker_value("?range=30m", "all") == "custom" and picker_value("?range=all", "6h") == "custom"
    assert with_params("?range=1h&x=1", range="6h", x=None) == "?range=6h"


def test_the_range_picker_and_the_url_follow_each_other():
    assert range_sync("app-range", "24h", "?start=1&end=2&keep=1", "all") == ("?keep=1&range=24h", no_update)
    _, value = range_sync("app-url", "all", "?range=7d", "all")
    assert value == "7d"
    _, value = range_sync(None, "all", "", "6h")
    assert value == "6h"


def test_navigation_comes_from_the_page_registry_and_keeps_the_range(app):
    links = nav_links("/jobs", "?range=1h&other=x")
    assert [link.children for link in links] == ["Fleet", "Jobs", "Findings", "Cost"]
    assert links[1].href == "/jobs?range=1h" and "br-active" in links[1].className


# --- the analysis cache ----------------------------------------------------------------
def test_the_cache_serves_a_stale_analysis_while_it_refreshes_in_the_background():
    now = [0.0]
    calls = []
    release = threading.Event()

    def compute(key):
        calls.append(key)
        if len(calls) > 1:
            release.wait(5)
        return len(calls)

    cache = TtlCache(compute, ttl_s=10, clock=lambda: now[0])
    assert cache.get("k") == 1 and cache.get("k") == 1 and len(calls) == 1
    now[0] = 11
    assert cache.get("k") == 1          # stale, served at once
    release.set()
    deadline = time.monotonic() + 5
    while cache.get("k") != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.get("k") == 2


def test_the_cache_gives_back_what_each_computation_freed(monkeypatch):
    """A dashboard lives for weeks, analysing each range anew every refresh (analyzer/grid/freed.py)."""
    trims = []
    monkeypatch.setattr(freed, "_TRIM", trims.append)
    cache = TtlCache(lambda key: key * 2, ttl_s=10, clock=lambda: 0.0)
    assert cache.get(3) == 6 and trims == [0]
    assert cache.get(3) == 6 and trims == [0]      # a fresh entry: nothing computed, nothing freed
    assert cache.get(4) == 8 and trims == [0, 0]


def test_the_cache_keeps_an_error_for_its_ttl_but_never_serves_it_stale():
    now = [0.0]
    calls = []

    def compute(key):
        calls.append(key)
        raise Unavailable("down")

    cache = TtlCache(compute, ttl_s=10, clock=lambda: now[0])
    for _ in range(3):
        with pytest.raises(Unavailable):
            cache.get("k")
    assert len(calls) == 1
    now[0] = 11
    with pytest.raises(Unavailable):
        cache.get("k")
    assert len(calls) == 2


# --- aggregation -----------------------------------------------------------------------
def test_time_is_cut_into_at_most_300_buckets():
    assert aggregate.bins_per_bucket(5760) == 20 and -(-5760 // 20) <= aggregate.MAX_BUCKETS
    values = np.array([[1.0, 3.0, np.nan, np.nan, 5.0]])
    np.testing.assert_array_equal(aggregate.bucket_mean(values, 2), [[2.0, np.nan, 5.0]])


def test_fleet_counts_add_up_to_every_gpu(analysis, recording):
    fleet = analysis.fleet
    gpus = len(fleet.gpu_labels)
    assert gpus == 24 and fleet.util.shape == (24, len(fleet.times))
    np.testing.assert_allclose(fleet.busy + fleet.idle + fleet.util_unknown + fleet.unallocated, gpus)
    # Only the GPU that fell off the bus (gpu_error) stops reporting its utilization.
    lost = sum(t["kind"] == "gpu_error" for t in recording[1])
    assert fleet.util_unknown.max() == lost == 1
    unallocated = sum(t["kind"] == "unallocated_gpu" for t in recording[1])
    assert fleet.now["unallocated"] == unallocated
    assert fleet.burn_now > 0 and fleet.window_dollars > 0 and fleet.unpriced_gpus == 0


def test_a_window_ending_after_the_last_sample_draws_no_zero_fleet(analysis, app):
    """A live "last hour" ends after the store's newest sample: those minutes are unknown,
    never 0 GPUs at $0/h (the Fleet page read 0 busy, 0 idle, 0 unallocated "now" beside a
    burn rate of $123/h, and both charts fell to 0 at the end)."""
    window = analysis.frames.window
    with app.server.app_context():
        service = current_service()
        later = service.analysis(TimeRange(start=window.start, end=window.end + 120.0))
    fleet, whole = later.fleet, analysis.fleet
    assert fleet.now == whole.now and fleet.now["busy"] > 0
    assert fleet.reporting_now == whole.reporting_now and fleet.burn_now == whole.burn_now
    empty = ~np.isfinite(fleet.busy)
    assert empty[-1] and np.isnan(fleet.burn[empty]).all() and np.isnan(fleet.unallocated[empty]).all()
    state = figures.fleet_state(fleet, simulated=True)
    top = sum(np.asarray(trace.y, float)[-1] for trace in state.data)
    assert top == pytest.approx(whole.busy[-1] + whole.idle[-1] + whole.util_unknown[-1] + whole.unallocated[-1])
    assert [trace.name for trace in state.data] == [trace.name for trace in figures.fleet_state(whole, True).data]


def test_the_straggler_rank_has_the_longest_compute(analysis, recording):
    hit = next(t for t in recording[1] if t["kind"] == "straggler")
    detail = aggregate.job_detail(analysis.views, analysis.report, hit["namespace"], hit["training_job"])
    steps = detail.steps
    assert steps.ranks[int(np.argmax(steps.compute))] == str(hit["rank"])
    assert len(detail.gpu_labels) == len(steps.ranks)
    assert len(detail.times) <= aggregate.MAX_BUCKETS and detail.checkpoints
    assert [f.kind for f in detail.findings] == ["straggler"]


def test_the_job_table_has_every_job_with_its_rates(analysis):
    table = analysis.jobs
    assert len(table) == len(analysis.report.jobs)
    trained = table.dropna(subset=["tokens_per_s"])
    assert len(trained) and (trained["tokens_per_s"] > 0).all() and (table["dollars_per_hour"].dropna() > 0).all()


# --- figures ---------------------------------------------------------------------------
def test_figure_builders_draw_the_aggregates_and_say_when_data_is_simulated(analysis):
    fleet = analysis.fleet
    summary = aggregate.cost_summary(analysis.report)
    built = [figures.utilization_heatmap(fleet, True), figures.fleet_state(fleet, True),
             figures.burn_rate(fleet, True), figures.cost_by_namespace(summary, True),
             figures.cost_by_job(summary, True), figures.spot_savings(summary, True),
             figures.waste_by_cause(summary, True), figures.cost_per_billion_tokens(summary, True)]
    for fig in built:
        assert isinstance(fig, go.Figure) and fig.data
        assert figures.SIMULATED_NOTE in fig.layout.title.text
    assert figures.SIMULATED_NOTE not in figures.burn_rate(fleet, False).layout.title.text
    heat = built[0].data[0]
    assert np.asarray(heat.z).shape == (24, len(fleet.times))


def test_a_job_bar_carries_its_job_and_a_click_on_it_opens_the_job(analysis, pages):
    summary = aggregate.cost_summary(analysis.report)
    for fig in (figures.cost_by_job(summary, False), figures.cost_per_billion_tokens(summary, False)):
        bars = fig.data[0]
        assert ["/".join(key) for key in bars.customdata] == list(bars.y)
    assert figures.cost_by_job(summary, False).data[0].y[-1] == summary.by_job["job"].iloc[0]   # costliest on top
    href = pages["cost"].clicked_job_href
    click = {"points": [{"y": "ml/llm 7b", "customdata": ["ml", "llm 7b"]}]}
    assert href(click, "?range=1h&kind=straggler") == "/job/ml/llm%207b?range=1h"
    assert href(None, "") is None and href({"points": [{"y": "ml/x"}]}, "") is None


def _token_fleet(analysis, per_billion: dict[str, float]) -> aggregate.CostSummary:
    """The recording's cost summary with its jobs' $ per billion tokens set to `per_billion`
    (job -> $/B; the tokens follow from the job's cost); the other jobs counted none."""
    jobs = aggregate.cost_summary(analysis.report).by_job.copy()
    per = jobs["job"].map(per_billion)
    jobs["cost_per_billion_tokens"], jobs["tokens"] = per, jobs["cost_dollars"] / per * 1e9
    return replace(aggregate.cost_summary(analysis.report), by_job=jobs)


def test_cost_per_billion_tokens_spanning_four_decades_is_drawn_on_a_log_axis_with_each_value(analysis):
    """A CPU-trained job's $/B tokens 10^4 times a GPU job's: on a linear axis the GPU job
    is no bar at all. On a log axis half a decade past each end, every bar says its value,
    and its hover its basis."""
    summary = _token_fleet(analysis, {"ml-research/dlrm-1": 20.0, "recsys/code-lm-1": 200_000.0})
    fig = figures.cost_per_billion_tokens(summary, False)
    bars = fig.data[0]
    assert list(bars.y) == ["ml-research/dlrm-1", "recsys/code-lm-1"]       # the dearest on top
    assert list(bars.text) == ["$20.00", "$200,000.00"] and bars.textposition == "outside"
    axis = fig.layout.xaxis
    assert axis.type == "log" and list(axis.range) == pytest.approx([np.log10(20) - 0.5, np.log10(2e5) + 0.5])
    assert "log scale" in axis.title.text
    dlrm = summary.by_job.set_index("job").loc["ml-research/dlrm-1"]
    assert bars.hovertext[0] == (f"${dlrm['cost_dollars']:,.2f} over {dlrm['tokens'] / 1e9:,.4g} billion tokens "
                                 f"counted in {dlrm['gpu_hours']:,.2f} GPU-hours")
    assert "%{hovertext}" in bars.hovertemplate
    # Within two decades a linear axis from zero reads truly.
    near = figures.cost_per_billion_tokens(_token_fleet(analysis, {"ml-research/dlrm-1": 20.0,
                                                                    "recsys/code-lm-1": 1_000.0}), False)
    assert near.layout.xaxis.type is None and list(near.layout.xaxis.range) == [0, 1_200.0]


def test_the_cost_page_says_which_jobs_its_tokens_chart_leaves_out_and_why(analysis, pages):
    summary = _token_fleet(analysis, {"ml-research/dlrm-1": 20.0, "recsys/code-lm-1": 200_000.0})
    note = pages["cost"].tokens_note(summary)
    lines = [_text(li) for li in note.children]
    priced = len(summary.by_job)
    assert lines[0].startswith("Each bar: the job's cost in this window over the tokens its ranks counted")
    assert lines[1:] == [f"{priced - 2} priced jobs not drawn: they counted no tokens."]
    many = _token_fleet(analysis, {job: 10.0 + i for i, job in enumerate(summary.by_job["job"])})
    many = replace(many, by_job=pd.concat([many.by_job] * 4, ignore_index=True), unpriced_jobs=2)
    lines = [_text(li) for li in pages["cost"].tokens_note(many).children]
    assert lines[1:] == [f"{4 * priced - 15} jobs with a lower cost per billion tokens not drawn: "
                         "the chart shows the 15 highest.", "2 jobs not drawn: they have no price."]


def test_empty_inputs_give_a_figure_that_says_so(analysis):
    empty = RankSteps.none()
    fig = figures.rank_breakdown(empty, False)
    assert not fig.data and "no training telemetry" in fig.layout.annotations[0].text


# --- page callbacks as plain functions ---------------------------------------------------
def test_every_page_callback_renders(app, pages, recording):
    hit = next(t for t in recording[1] if t["kind"] == "straggler")
    with app.server.test_request_context():
        assert "Top findings" in _text(pages["fleet"].update("", 1)[0])
        assert "jobs-table" in str(pages["jobs"].update("?range=30m", 1))
        job = pages["job"].update({"namespace": hit["namespace"], "training_job": hit["training_job"]}, "", 1)[0]
        assert "straggler" in _text(job)
        assert "cost-waste" in str(pages["cost"].update("", 1))
        missing = pages["job"].update({"namespace": "nope", "training_job": "nope"}, "", 1)[0]
        assert "No job nope/nope" in _text(missing)


def test_the_findings_filters_come_from_the_url(app, pages, recording):
    with app.server.test_request_context():
        children, namespaces, *_ = pages["findings"].update("?kind=straggler", 1)
        rows = children[1].data
        assert {r["kind"] for r in rows} == {"straggler"}
        assert set(namespaces) == {t["namespace"] for t in recording[1] if t["namespace"]}
        children, *_ = pages["findings"].update("?severity=critical", 1)
        assert {r["severity"] for r in children[1].data} == {"critical"}
        children, namespaces, *_ = pages["findings"].update("?namespace=elsewhere", 1)
        assert "No findings match" in _text(children) and "elsewhere" in namespaces


def test_findings_filters_to_the_url_and_back():
    chosen = FindingFilters(kinds=("straggler", "idle_gpu"), namespaces=("ml",), severities=("critical",))
    search = chosen.in_query("?range=1h&severity=warning")
    assert search == "?range=1h&severity=critical&kind=straggler,idle_gpu&namespace=ml"
    assert FindingFilters.from_query(search) == chosen
    assert FindingFilters().in_query("?range=1h&kind=straggler&namespace=ml") == "?range=1h"
    assert FindingFilters.from_query("") == FindingFilters() and FindingFilters().in_query("") == ""
    # Repeated parameters (as Dash Pages hands them to a layout) and unknown values.
    assert FindingFilters.from_params({"kind": ["straggler", "idle_gpu,bogus"], "severity": "fatal,info"}) == \
        FindingFilters(kinds=("straggler", "idle_gpu"), severities=("info",))
    assert FindingFilters.from_query("?kind=straggler,,straggler&namespace=%20ml") == \
        FindingFilters(kinds=("straggler",), namespaces=("ml",))


def test_the_findings_controls_and_the_url_follow_each_other(app, pages):
    findings = pages["findings"]
    page = findings.layout(range="1h", kind="straggler,stalled", namespace="ml")
    assert _find(page, "findings-kind").value == ["straggler", "stalled"]
    assert _find(page, "findings-namespace").value == ["ml"] == _find(page, "findings-namespace").options
    assert _find(page, "findings-severity").value == []
    assert findings.filters_to_url(["straggler"], None, ["critical"], "?range=1h") == \
        "?range=1h&kind=straggler&severity=critical"
    assert findings.filters_to_url(["straggler"], [], [], "?range=1h&kind=straggler") is no_update


def test_an_empty_window_and_a_bad_range_are_explained(app, pages):
    with app.server.test_request_context():
        empty = pages["fleet"].update("?start=2000-01-01T00:00:00Z&end=2000-01-01T01:00:00Z", 1)[0]
        assert "No data in this window" in _text(empty)
        assert "Invalid time range" in _text(pages["cost"].update("?range=forever", 1))
        # Numbers no clock can hold are the URL's mistake, not a server error.
        for search, says in (("?start=1e300", "outside 1970-01-01 to 9999-12-31"), ("?start=nan", "outside"),
                             ("?range=99999999999y", "longer than 1000y")):
            assert says in _text(pages["fleet"].update(search, 1)[0]), search


def test_an_unreachable_prometheus_is_explained():
    url = f"http://127.0.0.1:{free_port()}"
    app = create_app(PrometheusSource(url, timeout_s=2))
    with app.server.test_request_context():
        message = _text(render("?range=1h", lambda a, s: "drawn"))
    assert "cannot reach Prometheus at " + url in message


def test_the_status_line_names_the_source_without_a_local_path(app, recording):
    with app.server.test_request_context():
        status = _text(status_line("")[0])
    assert "SIMULATED DATA" in status
    assert status.endswith(f"UTC · recording {os.path.basename(recording[0])}") and recording[0] not in status
    assert describe_source(PrometheusSource("http://prometheus:9090/")) == "Prometheus http://prometheus:9090"


# --- serving ---------------------------------------------------------------------------
def test_basic_auth_guards_every_route(recording):
    app = create_app(RecordingSource(recording[0]), basic_auth=("team", "s3cret"))
    client = app.server.test_client()
    assert client.get("/").status_code == 401
    assert client.get("/_dash-layout").status_code == 401
    bad = base64.b64encode(b"team:wrong").decode()
    assert client.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
    good = base64.b64encode(b"team:s3cret").decode()
    assert client.get("/", headers={"Authorization": f"Basic {good}"}).status_code == 200


def test_a_probe_needs_no_password_and_learns_only_that_the_app_is_up(recording):
    """Kubelet probes carry no credentials: /healthz answers them without a password and says
    nothing else, while every other route still asks; the chart's probes ask /healthz."""
    app = create_app(RecordingSource(recording[0]), basic_auth=("team", "s3cret"))
    client = app.server.test_client()
    health = client.get("/healthz")
    assert (health.status_code, health.data) == (200, b"ok\n")
    assert client.get("/").status_code == 401
    assert client.get("/healthz/../").status_code == 401
    with open(os.path.join(ROOT, "charts", "burnrate", "templates", "dashboard", "deployment.yaml")) as fh:
        probes = re.findall(r"(readiness|liveness)Probe:\s+httpGet:\s+path: (\S+)", fh.read())
    assert probes == [("readiness", "/healthz"), ("liveness", "/healthz")]


def test_every_namespace_s_cost_is_written_over_its_stack_however_small():
    """A $0.20 namespace beside a $200 one has no bar to see: its total is written over it."""
    by_namespace = pd.DataFrame({"namespace": ["ml", "ml", "demo"], "capacity_type": ["spot", "on-demand", "unknown"],
                                 "cost_dollars": [150.0, 50.0, 0.2]})
    summary = aggregate.CostSummary(by_namespace=by_namespace, by_job=pd.DataFrame(), waste_by_cause=pd.Series(dtype=float),
                                    spot_dollars=0.0, spot_on_demand_dollars=0.0, total_dollars=200.2, unpriced_jobs=0)
    fig = figures.cost_by_namespace(summary, False)
    [written] = [t for t in fig.data if t.type == "scatter"]
    assert dict(zip(written.x, written.text)) == {"demo": "$0.20", "ml": "$200.00"}
    assert written.mode == "text" and not written.showlegend
    # The tallest stack's total sits inside the axis, not cut off at its top.
    assert fig.layout.yaxis.range[1] >= 200.0 * 1.1 and written.cliponaxis is False


def test_the_app_only_reads(app):
    """No route writes: pages and assets are GET, and the one POST is Dash's callback
    endpoint, which computes figures from the analysis and changes nothing."""
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    methods = {rule.rule: rule.methods - {"HEAD", "OPTIONS"} for rule in app.server.url_map.iter_rules()}
    writers = {rule: m for rule, m in methods.items() if m - {"GET"}}
    assert writers == {app.config.requests_pathname_prefix + "_dash-update-component": {"POST"}}


def test_command_line_errors_are_one_line(tmp_path, capsys, recording):
    assert burnrate(["dashboard", "--recording", str(tmp_path)]) == 2
    assert "not a burnrate recording" in capsys.readouterr().err
    assert burnrate(["dashboard", "--recording", recording[0], "--listen", "nowhere"]) == 2
    assert "--listen wants HOST:PORT" in capsys.readouterr().err
    assert burnrate(["dashboard", "--recording", recording[0], "--basic-auth", "nopassword"]) == 2
    assert "USER:PASSWORD" in capsys.readouterr().err
    assert burnrate(["dashboard", "--recording", recording[0], "--detector-config", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read detector config" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert burnrate(["dashboard", "--recording", recording[0], "--listen", f"127.0.0.1:{port}"]) == 2
    out = capsys.readouterr()
    (line,) = out.err.splitlines()          # the port is checked before anything is printed
    assert f"cannot listen on 127.0.0.1:{port}" in line and "pass --listen" in line and not out.out
    secret = tmp_path / "auth"
    secret.write_text("team:s3cret\n")
    from burnrate.dashboard.auth import credentials
    assert credentials(str(secret)) == ("team", "s3cret")


def test_a_jobs_gpu_panels_show_only_the_time_it_held_them():
    """One GPU, held by job `first` for the first half of the window and by `second` after:
    each job's page shows the GPU's series only for its own half."""
    f = Fleet()
    f.node("node-a")
    f.gpu("node-a", 0, util=np.where(np.arange(f.n) < f.n // 2, 30.0, 90.0))
    half = np.arange(f.n) < f.n // 2
    f.alloc("node-a", 0, "first-0", "first", mask=half)
    f.alloc("node-a", 0, "second-0", "second", mask=~half)
    report = analyze(f.frames(), load_catalog())
    for job, mine, util in (("first", half, 30.0), ("second", ~half, 90.0)):
        detail = aggregate.job_detail(report.views, report, "ml", job, max_buckets=f.n)
        (shown,) = detail.gpu_series["util"]
        assert np.isfinite(shown).tolist() == mine.tolist()
        assert set(shown[mine]) == {util}


def test_mfu_is_drawn_only_where_the_job_stepped():
    """The agent keeps a rank's last MFU while it makes no step (here a third of the window, a
    restart's pause): the job's MFU line has nothing there, and its tokens/s read 0."""
    from tests.test_detectors import Fleet

    f = Fleet()
    f.node("node-a")
    f.gpu("node-a", 0)
    f.alloc("node-a", 0, "llm-0", "llm")
    paused = (np.arange(f.n) >= f.n // 3) & (np.arange(f.n) < 2 * f.n // 3)
    f.rank("llm", 0, "node-a", steps=np.where(paused, 0.0, 10.0), tokens=np.where(paused, 0.0, 40960.0), mfu=0.45)
    report = analyze(f.frames(), load_catalog())
    detail = aggregate.job_detail(report.views, report, "ml", "llm", max_buckets=f.n)
    assert np.isnan(detail.mfu[paused]).all() and set(detail.throughput[paused]) == {0.0}
    assert detail.mfu[~paused][1:] == pytest.approx(np.full((~paused).sum() - 1, 0.45))


def test_a_range_of_centuries_is_read_at_the_datas_own_span(app):
    """`/?range=99999d` once grew the dashboard to 24 GB: the window is cut to where the
    recording has data, so its resolution, and the figures', stay bounded."""
    from burnrate.analyzer.grid.resample import MAX_POINTS

    with app.server.app_context():
        service = current_service()
        wide = service.analysis(from_query("?range=99999d", service.default_range))
        whole = service.analysis(from_query("?range=all", service.default_range))
    assert wide.views.n == whole.views.n <= MAX_POINTS + 1
    assert len(wide.fleet.times) <= aggregate.MAX_BUCKETS
    assert wide.report.accounting.observed_gpu_hours == pytest.approx(whole.report.accounting.observed_gpu_hours)


def test_the_command_serves_with_a_production_server_that_holds_under_bad_clients(tmp_path, recording):
    """`burnrate dashboard` as deployed: waitress, not Flask's development server. A client
    that never finishes its request does not hold up others, an oversized callback body is
    refused before it is read, and every route asks for the password."""
    from tests.processes import dashboard
    secret = tmp_path / "auth"
    secret.write_text("team:s3cret\n")
    token = base64.b64encode(b"team:s3cret").decode()
    with dashboard(tmp_path, recording[0], "--basic-auth", str(secret)) as url:
        host, port = url.removeprefix("http://").split(":")
        stalled = []
        for _ in range(16):   # more than the server's threads
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")   # and never the blank line
            stalled.append(s)
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            started = time.monotonic()
            conn.request("GET", "/jobs", headers={"Authorization": f"Basic {token}"})
            answer = conn.getresponse()
            page = answer.read()
            assert answer.status == 200 and b"<title>" in page
            assert answer.getheader("Server") == "burnrate"
            assert time.monotonic() - started < 5
            conn.request("GET", "/cost")
            refused = conn.getresponse()
            refused.read()
            assert refused.status == 401 and refused.getheader("WWW-Authenticate", "").startswith("Basic")
            # Only the headers go out: a server that refuses the body unread may close the
            # connection while a client is still sending it (a reset, not an answer).
            conn.putrequest("POST", "/_dash-update-component")
            for name, value in (("Authorization", f"Basic {token}"), ("Content-Type", "application/json"),
                                ("Content-Length", str(2 << 20))):
                conn.putheader(name, value)
            conn.endheaders()
            too_big = conn.getresponse()
            too_big.read()
            assert too_big.status == 413
            conn.close()
        finally:
            for s in stalled:
                s.close()


# --- the ledger: where each GPU-hour a training job held went -----------------------------
def _ledgered(analysis):
    return [j for j in analysis.report.jobs if j.ledger is not None]


def _bars(fig: go.Figure) -> dict[str, float]:
    """The waterfall's bars as drawn: label -> value."""
    (wf,) = fig.data
    return dict(zip(wf.x, wf.y))


def test_the_waterfall_takes_each_cause_of_badput_out_of_the_jobs_cost(analysis):
    """allocated $ (the job's cost), less every cause of badput that is > 0, leaves the
    productive $, each bar at the job's rate, and the title says the goodput."""
    jobs = _ledgered(analysis)
    assert len(jobs) >= 5 and any(sum(1 for c in BADPUT if j.ledger.gpu_hours[c]) >= 3 for j in jobs)
    for job in jobs:
        fig = figures.ledger_waterfall(job, False)
        (wf,) = fig.data
        causes = [c for c in BADPUT if job.ledger.gpu_hours[c] > 0]
        assert list(wf.x) == ["allocated"] + [c.replace("_", " ") for c in causes] + ["productive"]
        assert list(wf.measure) == ["absolute"] + ["relative"] * len(causes) + ["total"]
        assert wf.y[0] == job.cost_dollars
        for cause, value in zip(causes, wf.y[1:-1]):
            assert value == pytest.approx(-job.ledger_dollars(job.ledger.gpu_hours[cause]))
        assert wf.y[-1] == pytest.approx(job.ledger_dollars(job.ledger.gpu_hours["productive"]))
        # What Plotly draws as the total: the cost less the badput, which is the productive $ to a cent.
        assert sum(wf.y[:-1]) == pytest.approx(wf.y[-1], abs=0.01)
        assert wf.text[0] == f"${job.cost_dollars:,.2f}" and wf.text[-1] == f"${wf.y[-1]:,.2f}"
        assert f"goodput {job.goodput:.0%}" in fig.layout.title.text
        assert fig.layout.yaxis.tickprefix == "$"


def _two_runs(job, lost_progress: float | None = 0.25) -> Ledger:
    """A hand-built ledger of `job`: a run that stepped to step 500 and died, a restart, and a
    second run that resumed from step 400, its categories adding up to the job's GPU-hours."""
    t0 = float(job.ledger.runs[0].first_step)
    hours = dict.fromkeys(NAMES, 0.0)
    hours.update(startup=0.1, restart=0.3, lost_progress=lost_progress, data_wait=0.2, sync_wait=0.15)
    hours["productive"] = job.gpu_hours - sum(v or 0.0 for v in hours.values())
    runs = [RunLedger(t0 - 300, t0, t0 + 1200, 0, 500, {}), RunLedger(t0 + 1500, t0 + 1620, t0 + 2400, 400, 900, {})]
    why = "the next run did not report the step it resumed from"
    basis = {} if lost_progress is not None else {"lost_progress": why}
    return Ledger(hours, basis, runs)


def test_a_category_that_cannot_be_measured_is_not_a_bar_but_named_with_why(analysis, pages):
    job = next(j for j in _ledgered(analysis) if j.training_job == "dlrm-1")
    ledger = _two_runs(job, lost_progress=None)
    job = replace(job, ledger=ledger, ledger_basis=ledger.basis)
    panel = pages["job"].ledger_panel(job, False)
    bars = _bars(_find(panel, "job-waterfall").figure)
    assert "lost progress" not in bars and {"startup", "restart", "data wait"} <= set(bars)
    assert sum(list(bars.values())[:-1]) == pytest.approx(bars["productive"], abs=0.01)
    note = _text(_find(panel, "job-ledger-note"))
    assert note.startswith("lost progress")
    assert "not measured: the next run did not report the step it resumed from" in note
    # A measured category that leaves something out keeps its bar and says what.
    unheld = "its GPUs were not held for 33 GPU-seconds of its runs' start-up"
    held = replace(_two_runs(job), basis={"startup": unheld})
    panel = pages["job"].ledger_panel(replace(job, ledger=held, ledger_basis=held.basis), False)
    assert _bars(_find(panel, "job-waterfall").figure)["startup"] == pytest.approx(-0.1 * job.cost_dollars / job.gpu_hours,
                                                                                  abs=0.01)
    note = _text(_find(panel, "job-ledger-note"))
    assert note.startswith("startup") and unheld in note and "not measured" not in note
    # Unpriced: the same waterfall in GPU-hours, and the axis says so.
    unpriced = figures.ledger_waterfall(replace(job, cost_dollars=None), False)
    hours = _bars(unpriced)
    assert hours["allocated"] == job.gpu_hours and hours["restart"] == -0.3
    assert hours["productive"] == pytest.approx(ledger.gpu_hours["productive"])
    assert "no price" in unpriced.layout.yaxis.title.text and "GPU-hours" in unpriced.layout.yaxis.title.text
    assert f"{job.gpu_hours:,.2f} GPU-h went" in unpriced.layout.title.text


def test_a_job_without_a_ledger_says_why_instead_of_an_empty_figure(app, pages):
    with app.server.test_request_context():
        page = html.Div(pages["job"].update({"namespace": "notebooks", "training_job": "jupyter-frank-1"}, "", 1)[0])
    assert _find(page, "job-waterfall") is None
    assert _text(_find(page, "job-ledger-none")) == \
        "No GPU-hour ledger for this job: a ledger is kept for training jobs; this is interactive."
    with app.server.test_request_context():
        page = html.Div(pages["job"].update({"namespace": "ml-research", "training_job": "dlrm-1"}, "", 1)[0])
    assert _find(page, "job-waterfall") is not None and _find(page, "job-ledger-none") is None


def test_restarts_are_marked_from_one_runs_last_step_to_the_next_ones_start(analysis):
    """A hand-built two-run ledger: the job's over-time figure shades its restart through
    every panel, from the first run's last step to the second run's process start."""
    report = analysis.report
    job = next(j for j in report.jobs if j.training_job == "dlrm-1")
    ledger = _two_runs(job)
    report = replace(report, jobs=[replace(j, ledger=ledger) if j is job else j for j in report.jobs])
    detail = aggregate.job_detail(analysis.views, report, job.namespace, job.training_job)
    first, second = ledger.runs
    assert detail.restarts == [aggregate.Restart(first.last_step, second.process_start, 400)]
    fig = figures.job_timeline(detail, False)
    (band,) = [s for s in fig.layout.shapes if s.type == "rect"]
    assert pd.Timestamp(band.x0) == pd.Timestamp(first.last_step, unit="s").round("ms")
    assert pd.Timestamp(band.x1) == pd.Timestamp(second.process_start, unit="s").round("ms")
    assert (band.yref, band.y0, band.y1) == ("paper", 0, 1)
    (label,) = [a for a in fig.layout.annotations if a.text.startswith("restart")]
    assert label.text == "restart, resumed from step 400" and pd.Timestamp(label.x) == pd.Timestamp(band.x0)
    # A job of one run has none.
    plain = aggregate.job_detail(analysis.views, analysis.report, job.namespace, job.training_job)
    assert plain.restarts == [] and not [s for s in figures.job_timeline(plain, False).layout.shapes
                                         if s.type == "rect"]


def test_namespace_goodput_is_its_training_jobs_hours_weighted_goodput(analysis):
    jobs = _ledgered(analysis)
    frame = aggregate.namespace_goodput(analysis.report)
    assert set(frame["namespace"]) == {j.namespace for j in jobs}
    fig = figures.namespace_goodput(frame, False)
    drawn = dict(zip(fig.data[0].y, fig.data[0].x))
    badput = {t.name: dict(zip(t.y, t.x)) for t in fig.data[1:]}
    weighted_differs = False
    for namespace in frame["namespace"]:
        mine = [j for j in jobs if j.namespace == namespace]
        weighted = sum(j.goodput * j.gpu_hours for j in mine) / sum(j.gpu_hours for j in mine)
        weighted_differs |= abs(weighted - np.mean([j.goodput for j in mine])) > 0.01
        assert drawn[namespace] == pytest.approx(weighted)
        for cause in BADPUT:
            dollars = sum(j.ledger_dollars(j.ledger.gpu_hours[cause]) for j in mine)
            assert badput.get(cause.replace("_", " "), {}).get(namespace, 0.0) == pytest.approx(dollars, abs=1e-4)
    assert weighted_differs      # the recording's namespaces tell a weighted mean from a plain one


def test_the_fleets_badput_over_time_adds_up_to_the_jobs_badput(analysis):
    jobs = _ledgered(analysis)
    for priced in (True, False):
        report = analysis.report if priced else replace(
            analysis.report, jobs=[replace(j, cost_dollars=None) if j.training_job == "dlrm-1" else j
                                   for j in analysis.report.jobs])
        timeline = aggregate.badput_timeline(report, analysis.views)
        fig = figures.badput_over_time(timeline, False)
        drawn = {t.name: float((np.asarray(t.y) * timeline.hours).sum()) for t in fig.data}

        def measure(j, hours):
            return j.ledger_dollars(hours) if priced else hours

        expected = {c.replace("_", " "): sum(measure(j, j.ledger.gpu_hours[c]) for j in jobs) for c in BADPUT}
        assert set(drawn) == {c for c, v in expected.items() if v > 0}
        for cause, total in drawn.items():
            assert total == pytest.approx(expected[cause], rel=1e-3, abs=1e-3), cause
        assert sum(drawn.values()) == pytest.approx(sum(expected.values()), rel=1e-4)
        title = fig.layout.yaxis.title.text
        assert title.startswith("badput $ per hour") if priced else title.startswith("badput GPU-hours per hour")


# --- what a person reads first ------------------------------------------------------------
def test_findings_are_listed_costliest_first_with_evidence_in_units(app, pages):
    """A $57 warning is above a $0.07 critical; evidence reads "data wait share: 76.9%", not
    "data_wait_share=0.7693" or "2.149e+04"."""
    with app.server.test_request_context():
        children, *_ = pages["findings"].update("", 1)
    table = _find(html.Div(children), "findings-table")
    dollars = [r["wasted_dollars"] or 0.0 for r in table.data]
    assert dollars == sorted(dollars, reverse=True) and dollars[0] > 0
    assert {r["severity"] for r in table.data} >= {"critical", "warning"}
    for row in table.data:
        assert not re.search(r"\de[+-]\d|\w=", row["evidence"]), row["evidence"]
    starving = next(r["evidence"] for r in table.data if r["kind"] == "dataloader_starvation")
    assert re.match(r"data wait share: \d{1,2}(\.\d)?%; data wait seconds: [\d,]+ s;", starving)
    money = next(c for c in table.columns if c["id"] == "wasted_dollars")
    assert (money["type"], money["format"].to_plotly_json()["specifier"]) == ("numeric", "$,.2f")


def test_evidence_values_read_with_their_units():
    value = aggregate.evidence_value
    assert value("data_wait_seconds", 21490.4) == "21,490 s"
    assert value("data_wait_share", 0.7693) == "76.9%" and value("mfu", 0.06381) == "6.38%"
    assert value("mean_util_pct", 0.06528) == "0.0653%" and value("sm_clock_mhz", 1380.0) == "1,380 MHz"
    assert value("slowdown", 1.3612) == "1.36×" and value("stalled_minutes", 233.8) == "234 min"
    assert value("gross_wasted_gpu_hours", 9.291) == "9.29 GPU-h" and value("hours", 5.996) == "6 h"
    assert value("loss_after", float("nan")) == "nan" and value("ranks", 4) == "4"
    assert value("xid_events", {"79": 1}) == "{79: 1}" and value("signals", ["loss_spike", "non_finite"]) == \
        "loss_spike, non_finite"
    assert aggregate.evidence_label("peer_median_sm_clock_mhz") == "peer median sm clock"
    # An episode's GPUs are indices on their node: "gpus: 0" read as no GPU.
    assert f'{aggregate.evidence_label("gpus")}: {value("gpus", [0, 3])}' == "GPU index: 0, 3"


def test_a_jobs_rate_is_not_drawn_where_it_counted_nothing(analysis):
    """Before a job's first counted step and after its last there is no tokens/s: NaN, a gap
    in the line, not a drop to 0."""
    report, views = analysis.report, analysis.views
    detail = aggregate.job_detail(views, report, "ml-research", "dlrm-1")
    rank = views.rank
    rows = views.job_rows(rank)[("ml-research", "dlrm-1")]
    k = aggregate.bins_per_bucket(views.n)
    counted = aggregate.bucket_sum(np.isfinite(rank.values["tokens"][rows]), k).sum(axis=0) > 0
    assert not counted.all()
    assert np.isnan(detail.throughput[~counted]).all() and (detail.throughput[counted] > 0).all()
    drawn = next(t for t in figures.job_timeline(detail, False).data if t.name == "tokens/s")
    assert np.isnan(np.asarray(drawn.y, float)[~counted]).all()


def test_every_panel_of_a_job_shows_its_time_and_amounts_from_zero(analysis):
    detail = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    fig = figures.job_timeline(detail, False)
    xaxes = [fig.layout[name] for name in fig.layout if name.startswith("xaxis")]
    assert len(xaxes) == 7 and all(axis.showticklabels for axis in xaxes)
    titles = [a.text for a in fig.layout.annotations][:4]
    assert titles == ["GPU util %", "memory used MiB", "power W", "NVLink MB/s"]
    for row in range(1, 5):   # the GPU panels: their left axes
        axis = fig.layout["yaxis" if row == 1 else f"yaxis{2 * row - 1}"]
        assert (axis.rangemode, axis.tickformat) == ("tozero", "~s")


def _x_range(fig: go.Figure) -> list[pd.Timestamp]:
    """The one x range every panel of a job's figure shares."""
    ranges = {tuple(pd.Timestamp(v) for v in fig.layout[name].range) for name in fig.layout
              if name.startswith("xaxis")}
    assert len(ranges) == 1, ranges
    return list(ranges.pop())


def _lived_only(detail: aggregate.JobDetail, alive: slice) -> aggregate.JobDetail:
    """The detail as if the job had lived only in the buckets `alive`: NaN outside them, no findings."""
    def cut(values: np.ndarray) -> np.ndarray:
        out = np.full_like(values, np.nan)
        out[..., alive] = values[..., alive]
        return out
    return replace(detail, gpu_series={k: cut(v) for k, v in detail.gpu_series.items()}, mfu=cut(detail.mfu),
                   throughput=cut(detail.throughput), loss=cut(detail.loss), grad_norm=cut(detail.grad_norm),
                   findings=[], restarts=[])


@pytest.mark.parametrize("alive, margin_s", [(slice(100, 200), 75.0), (slice(100, 102), 15.0)],
                         ids=["5% of its life", "at least one step"])
def test_a_short_jobs_panels_open_on_its_life_with_a_margin(analysis, alive, margin_s):
    """A job that lived 100 (or 2) of the hour's 15 s buckets: its panels open on its first to
    last sample, widened by 5% of that (75 s) each side, or one step (15 s) where 5% is less."""
    detail = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    times = pd.DatetimeIndex(detail.times)
    assert (times[1] - times[0]).total_seconds() == 15.0 and len(times) == 240
    fig = figures.job_timeline(_lived_only(detail, alive), False)
    margin = pd.Timedelta(seconds=margin_s)
    assert _x_range(fig) == [times[alive.start] - margin, times[alive.stop - 1] + pd.Timedelta(seconds=15) + margin]


def test_the_job_page_keeps_a_range_the_url_names_and_else_opens_on_the_job(app, pages, analysis):
    window = analysis.frames.window
    seen = {}
    for search in ("", "?range=1h", f"?start={window.start:.0f}&end={window.end:.0f}"):
        with app.server.test_request_context():
            page = html.Div(pages["job"].update({"namespace": "ml-research", "training_job": "dlrm-1"}, search, 1)[0])
        seen[search] = _x_range(_find(page, "job-timeline").figure)
    whole = [pd.Timestamp(t, unit="s") for t in (window.start, window.end)]
    assert seen["?range=1h"] == seen[f"?start={window.start:.0f}&end={window.end:.0f}"] == whole
    detail = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    assert seen[""] == _x_range(figures.job_timeline(detail, False)) != whole
    # The job lived the whole window: 5% of it more each side.
    life = (whole[1] - whole[0]).total_seconds()
    assert (whole[0] - seen[""][0]).total_seconds() == pytest.approx(0.05 * life, abs=16)


def test_a_job_without_findings_says_so_in_its_findings_panel(analysis):
    detail = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    assert detail.findings
    quiet = replace(detail, findings=[])
    for d, said in ((detail, False), (quiet, True)):
        fig = figures.job_timeline(d, False)
        notes = [a for a in fig.layout.annotations if a.text == figures.NO_FINDINGS]
        # The findings panel is the last row: its left y axis is the second to last.
        last_y = sorted((int(n[5:] or 1) for n in fig.layout if n.startswith("yaxis")))[-2]
        assert len(notes) == said
        assert (fig.layout[f"yaxis{last_y}"].visible is False) == said
        if said:
            assert (notes[0].xref, notes[0].yref, notes[0].x, notes[0].y) == \
                (f"x{last_y // 2 + 1} domain", f"y{last_y} domain", 0.5, 0.5)


def _panel_notes(fig) -> list[tuple[str, bool, bool]]:
    """Each note said in a panel, with whether that panel's y axes (left, right) are hidden."""
    out = []
    for note in fig.layout.annotations:
        if note.yref and note.yref.endswith(" domain"):
            left = int(note.yref[1:-7] or 1)
            out.append((note.text, fig.layout[f"yaxis{left}"].visible is False,
                        fig.layout[f"yaxis{left + 1}"].visible is False))
    return out


def test_training_panels_without_figures_say_why_on_no_axis(analysis):
    """An empty panel's axis defaulted to 0-400%, as if it had MFU figures to show."""
    detail = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    assert np.isfinite(detail.mfu).any() and np.isfinite(detail.loss).any() and detail.findings
    assert _panel_notes(figures.job_timeline(detail, False)) == []
    nan = np.full(len(detail.times), np.nan)
    untold = replace(detail, mfu=nan, throughput=nan, loss=nan, grad_norm=nan)
    assert _panel_notes(figures.job_timeline(untold, False)) == [
        (f"no MFU or {detail.throughput_unit} reported by this job's ranks", True, True),
        ("no loss or grad norm reported by this job's ranks", True, True)]
    # One series of a pair missing (a job that counts no tokens): its axis is not drawn, and the
    # title says which is missing; the other's is.
    fig = figures.job_timeline(replace(detail, throughput=nan), False)
    mfu_row = [a.text for a in fig.layout.annotations if a.text.startswith("MFU")]
    assert mfu_row == [f"MFU (no {detail.throughput_unit} reported)"]
    axes = {t.yaxis for t in fig.data if t.name in ("MFU", detail.throughput_unit)}
    left, right = sorted(axes, key=lambda a: int(a[1:]))
    assert fig.layout["yaxis" + right[1:]].visible is False and fig.layout["yaxis" + left[1:]].visible is not False
    # The page's first paint: the training figures and findings are to come, not missing.
    assert _panel_notes(figures.job_timeline(detail, False, pending="follows")) == [("follows", True, True)] * 3


def test_gpu_panels_without_figures_say_why_on_no_axis(analysis):
    """A store without a GPU field (NVLink on PCIe GPUs, an exporter's trimmed field list) drew
    an empty panel on a 0-4 axis; it says so instead, and the panels with figures draw them."""
    detail = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    assert set(detail.gpu_series) == {"util", "memory", "power", "nvlink"}
    assert all(np.isfinite(v).any() for v in detail.gpu_series.values())
    nan = np.full_like(detail.gpu_series["nvlink"], np.nan)
    untold = replace(detail, gpu_series={**detail.gpu_series, "power": nan, "nvlink": nan})
    fig = figures.job_timeline(untold, False)
    assert _panel_notes(fig) == [("no power draw reported for this job's GPUs", True, True),
                                 ("no NVLink traffic reported for this job's GPUs", True, True)]
    assert [a.text for a in fig.layout.annotations if a.yref == "y5 domain"] == \
        ["no power draw reported for this job's GPUs"]      # power is the third row: axes y5 and y6
    gpu_rows = [t for t in fig.data if t.yaxis in ("y", "y3", "y5", "y7") and t.y is not None and None not in t.y]
    drawn = {t.yaxis for t in gpu_rows if np.isfinite(np.asarray(t.y, float)).any()}
    assert drawn == {"y", "y3"}


def test_the_pages_read_what_the_analysis_and_the_job_page_use_and_nothing_more(recording):
    """The pages asked for every GPU field the agent exports, each one more query over every
    GPU of the window, where they draw four beside what the analysis reads."""
    from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS
    from burnrate.dashboard.data import PAGE_COLUMNS

    asked = []

    class Asked(RecordingSource):
        def frames(self, window=None, columns=None, *args, **kwargs):
            asked.append(columns)
            return super().frames(window, columns, *args, **kwargs)

    app = create_app(Asked(recording[0]), refresh_s=3600)
    with app.server.app_context():
        service = current_service()
        analysis = service.analysis(from_query("", service.default_range))
    assert asked == [PAGE_COLUMNS]
    assert set(PAGE_COLUMNS["gpu"]) == set(ANALYSIS_COLUMNS["gpu"]) | set(aggregate.GPU_SERIES.values())
    assert {t: c for t, c in PAGE_COLUMNS.items() if t != "gpu"} == {t: c for t, c in ANALYSIS_COLUMNS.items() if t != "gpu"}
    detail = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    assert set(detail.gpu_series) == set(aggregate.GPU_SERIES)
    assert all(np.isfinite(series).any() for series in detail.gpu_series.values())


def test_the_range_picker_says_custom_range_briefly(app):
    picker = _find(app.layout, "app-range")
    assert [o["label"] for o in picker.options if o["value"] == "custom"] == ["custom range"]


def test_every_finding_kind_has_its_own_colour():
    from burnrate.analyzer.detectors.findings import KINDS
    from burnrate.dashboard.figures import KIND_COLORS

    assert set(KIND_COLORS) == set(KINDS)
    assert len(set(KIND_COLORS.values())) == len(KINDS)


def test_the_loss_panel_marks_where_the_model_blew_up(analysis, recording):
    """Where the ranks reported a loss that is not finite the panel draws nothing: a band says
    why, over the buckets the ledger's `diverged` comes from (diverging.non_finite)."""
    _, truth = recording
    hit = next(t for t in truth if t["kind"] == "diverging")
    job = (hit["namespace"], hit["training_job"])
    detail = aggregate.job_detail(analysis.views, analysis.report, *job)
    ledger = next(j.ledger for j in analysis.report.jobs if (j.namespace, j.training_job) == job)
    assert detail.blown.any() and ledger.gpu_hours["diverged"] > 0
    # No loss is drawn in the marked buckets; before the first of them, one is.
    first = int(np.argmax(detail.blown))
    assert not np.isfinite(detail.loss[detail.blown]).any() and np.isfinite(detail.loss[:first]).any()
    fig = figures.job_timeline(detail, False)
    bands = [s for s in fig.layout.shapes if s.type == "rect" and s.yref.endswith("domain")]
    assert len(bands) == len(np.flatnonzero(np.diff(np.r_[False, detail.blown, False]))) // 2
    assert pd.Timestamp(bands[0].x0) == pd.Timestamp(detail.times[first])
    assert [a.text for a in fig.layout.annotations if a.text == "loss or grad norm not finite"]
    # A job whose model never blew up has no band.
    calm = aggregate.job_detail(analysis.views, analysis.report, "ml-research", "dlrm-1")
    assert not calm.blown.any()
    assert not [s for s in figures.job_timeline(calm, False).layout.shapes if s.type == "rect"
                and s.yref.endswith("domain")]
