"""Each page's first paint from a real Prometheus, in a real headless Chromium: it draws the
window read at the display's resolution while the full analysis runs, says that the analysis
is running (never "no findings"), then draws the full page once it is done, with the same
GPU-hours and dollars.

The full analysis of a small fleet takes a second, too short to look at: the source here is
the store's own PrometheusSource whose full read (the one without a display step) waits
until the test releases it, standing for the minutes a fleet's day takes."""
from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from urllib.parse import quote

import pytest

from tests.conftest import require
from tests.processes import prometheus
from tests.test_dashboard import SPEC, make_recording
from tests.test_prometheus_source import backfill

pytestmark = pytest.mark.slow

pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402

from burnrate.analyzer.sources import PrometheusSource  # noqa: E402
from burnrate.analyzer.sources.timeparse import format_time  # noqa: E402
from burnrate.dashboard.testing import chromium, screenshot, serve, stat_cards, wait, wait_drawn  # noqa: E402

GPUS = SPEC.nodes * SPEC.gpus_per_node
SEARCH = f"?start={format_time(SPEC.end - SPEC.hours * 3600)}&end={format_time(SPEC.end)}"


class HeldSource(PrometheusSource):
    """The full read waits for `release`; the overview's (with a step) goes straight to the store."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.release = threading.Event()

    def frames(self, window=None, columns=None, *args, step=None, **kwargs):
        if step is None:
            self.release.wait(120)
        return super().frames(window, columns, *args, step=step, **kwargs)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The small simulated fleet back-filled into a real Prometheus, shared by the pages' tests."""
    require("chromium"), require("chromedriver")
    root = tmp_path_factory.mktemp("first-paint")
    recording = str(root / "rec")
    make_recording(recording)
    with prometheus(root, storage=backfill(root, recording)) as prom:
        yield prom.url


@contextmanager
def opened(url: str, path: str, tmp_path):
    """A fresh app over the held source, and Chromium at `path` of it; the full read released at the end."""
    from burnrate.dashboard.app import create_app

    source = HeldSource(url)
    try:
        with serve(create_app(source, refresh_s=3600)) as base, chromium(str(tmp_path / "chromium")) as driver:
            driver.get(base + path + SEARCH)
            yield driver, source
    finally:
        source.release.set()


def _analysing(driver, page: str) -> str:
    progress = driver.find_element(By.ID, f"{page}-progress").text
    assert f"analysing the window's {GPUS} GPUs…" in progress and "s so far" in progress
    main = driver.find_element(By.TAG_NAME, "main").text
    assert "No findings" not in main and "no findings" not in main
    return main


def _released(driver, source, page: str, done_css: str) -> None:
    assert not source.release.is_set()
    source.release.set()
    wait(driver, 60, poll_frequency=0.5).until(lambda d: d.find_elements(By.CSS_SELECTOR, done_css))
    wait(driver, 10, poll_frequency=0.5).until(
        lambda d: d.find_element(By.ID, f"{page}-progress").text == "")
    # neither drawing raised an error in the browser (a callback wired to a graph the early page lacks)
    assert [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


def _number(text: str) -> float:
    return float(re.sub(r"[$,]", "", text))


def _cells(driver, table: str, column: str) -> list[str]:
    return driver.execute_script(
        f"return [...document.querySelectorAll('#{table} td[data-dash-column={column}]')].map(c => c.innerText)")


def _gpu_hours(driver) -> float:
    text = driver.execute_script("return document.querySelector('.br-stats').innerText")
    return float(re.search(r"([\d,.]+) GPU-hours", text).group(1).replace(",", ""))


def test_the_fleet_page_draws_before_the_analysis_and_fills_in_after(store, tmp_path):
    with opened(store, "/", tmp_path) as (driver, source):
        wait_drawn(driver, "#fleet-heatmap", timeout_s=30)
        main = _analysing(driver, "fleet")
        # An hour over the heatmap's columns is finer than the scrape: its own 15 s.
        assert "the figures are utilization at 15-second means" in driver.find_element(By.ID, "fleet-progress").text
        assert "Findings follow" in main
        assert f"GPU utilization ({GPUS} GPUs)" in driver.find_element(By.ID, "fleet-heatmap").text
        early = _gpu_hours(driver)
        screenshot(driver, "first-paint-fleet")

        _released(driver, source, "fleet", "#fleet-findings td")
        assert "Findings follow" not in driver.find_element(By.TAG_NAME, "main").text
        assert early == pytest.approx(_gpu_hours(driver), abs=0.1)
        assert early == pytest.approx(GPUS * SPEC.hours, rel=0.02)


def _job_rows(driver) -> dict[str, tuple[float, float]]:
    """The Jobs table's rows: job -> (GPU-hours, cost)."""
    jobs, hours, costs = (_cells(driver, "jobs-table", c) for c in ("job", "gpu_hours", "cost_dollars"))
    return {job: (_number(h), _number(c)) for job, h, c in zip(jobs, hours, costs) if c}


def test_the_jobs_page_lists_hours_and_dollars_before_the_analysis(store, tmp_path):
    with opened(store, "/jobs", tmp_path) as (driver, source):
        wait(driver, 30, poll_frequency=0.2).until(lambda d: _cells(d, "jobs-table", "cost_dollars"))
        _analysing(driver, "jobs")
        assert "Until the window's analysis is done" in driver.find_element(By.ID, "jobs-hint").text
        early = _job_rows(driver)
        assert early and all(hours > 0 and cost > 0 for hours, cost in early.values())
        # Findings and waste need the detectors: blank, never a 0 that would read "none".
        assert set(_cells(driver, "jobs-table", "findings")) == {""}
        screenshot(driver, "first-paint-jobs")

        _released(driver, source, "jobs", "#jobs-table td[data-dash-column=findings]")
        wait(driver, 10, poll_frequency=0.5).until(
            lambda d: "Until the window's analysis" not in d.find_element(By.ID, "jobs-hint").text)
        full = _job_rows(driver)
        assert set(full) == set(early)
        for job, (hours, cost) in early.items():
            assert hours == pytest.approx(full[job][0], abs=0.1), job
            assert cost == pytest.approx(full[job][1], rel=0.01, abs=0.01), job
        assert any(_cells(driver, "jobs-table", "findings"))


def test_the_findings_page_says_the_analysis_runs_never_no_findings(store, tmp_path):
    with opened(store, "/findings", tmp_path) as (driver, source):
        wait(driver, 30, poll_frequency=0.2).until(lambda d: d.find_elements(By.ID, "findings-pending"))
        main = _analysing(driver, "findings")
        assert "Findings follow when the window's analysis is done." in main

        _released(driver, source, "findings", "#findings-table td")
        main = driver.find_element(By.TAG_NAME, "main").text
        assert "Findings follow" not in main
        assert re.search(r"\d+ of \d+ findings", driver.find_element(By.ID, "findings-summary").text)


def test_the_cost_page_draws_dollars_per_namespace_before_the_analysis(store, tmp_path):
    with opened(store, "/cost", tmp_path) as (driver, source):
        wait_drawn(driver, "#cost-namespace", timeout_s=30)
        main = _analysing(driver, "cost")
        assert "The showback follows when the window's analysis is done." in main
        assert stat_cards(driver)["wasted"][0] == "…"
        early = {label: _number(value) for label, (value, _) in stat_cards(driver).items()
                 if label in ("jobs' cost", "paid on spot", "fleet over the window")}
        assert early["jobs' cost"] > 0
        namespaces = driver.find_element(By.ID, "cost-namespace").text
        screenshot(driver, "first-paint-cost")

        _released(driver, source, "cost", "#cost-goodput")
        assert "showback follows" not in driver.find_element(By.TAG_NAME, "main").text
        full = stat_cards(driver)
        for label, value in early.items():
            assert value == pytest.approx(_number(full[label][0]), rel=0.01), label
        assert driver.find_element(By.ID, "cost-namespace").text == namespaces


def test_the_job_page_draws_its_timeline_before_the_analysis(store, tmp_path):
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.detectors import DetectorConfig
    from burnrate.analyzer.grid.frames import Window
    from burnrate.dashboard import overview

    window = Window(SPEC.end - SPEC.hours * 3600, SPEC.end)
    jobs = overview.read(PrometheusSource(store), window, load_catalog(), DetectorConfig()).jobs
    job = jobs.sort_values("cost_dollars", ascending=False).iloc[0]
    path = f"/job/{quote(job['namespace'], safe='')}/{quote(job['training_job'], safe='')}"
    with opened(store, path, tmp_path) as (driver, source):
        wait_drawn(driver, "#job-timeline", timeout_s=30)
        _analysing(driver, "job")
        assert "the timeline is the job's GPUs at 15-second means" in driver.find_element(By.ID, "job-pending").text
        early = stat_cards(driver)
        assert early["findings"][0] == "…"
        assert early["GPUs"][0] == f"{job['gpus']:g}"
        screenshot(driver, "first-paint-job")

        _released(driver, source, "job", "#job-ledger")
        full = stat_cards(driver)
        assert _number(early["cost so far"][0]) == pytest.approx(_number(full["cost so far"][0]), rel=0.01)
        assert full["findings"][0] != "…" and not driver.find_elements(By.ID, "job-pending")


class HeldOverview(HeldSource):
    """Every read waits: the first paint's (with a step) for `drawn`, the full one for `release`."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.drawn = threading.Event()

    def frames(self, window=None, columns=None, *args, step=None, **kwargs):
        if step is not None:
            self.drawn.wait(120)
        return super().frames(window, columns, *args, step=step, **kwargs)


def test_plotly_loads_while_the_first_read_runs_not_after_it(store, tmp_path):
    """A graph would load Plotly (4.8 MB) only once its page's callback answers: at fleet size
    that came after the first read, the last second of the first paint. The page starts it at
    once: while the first read still runs, Plotly is there and no graph is yet; then the
    graph draws with it."""
    from burnrate.dashboard.app import create_app

    source = HeldOverview(store)
    try:
        with serve(create_app(source, refresh_s=3600)) as base, chromium(str(tmp_path / "chromium")) as driver:
            driver.get(base + "/" + SEARCH)
            wait(driver, 30, 0.1).until(lambda d: d.execute_script("return typeof window.Plotly?.newPlot === 'function'"))
            assert not driver.find_elements(By.CSS_SELECTOR, "#fleet-heatmap .main-svg")
            source.drawn.set()
            wait_drawn(driver, "#fleet-heatmap", timeout_s=60)
            loads = driver.execute_script("return performance.getEntriesByType('resource')"
                                          ".filter(e => e.name.includes('plotly.min.js')).length")
            assert loads == 1       # the graph found it loaded: not fetched twice
    finally:
        source.drawn.set()
        source.release.set()


class CountedOverview(PrometheusSource):
    """Counts the reads at a display's step (the overview's)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.overview_reads = 0

    def frames(self, window=None, columns=None, *args, step=None, **kwargs):
        if step is not None:
            self.overview_reads += 1
        return super().frames(window, columns, *args, step=step, **kwargs)


def test_a_pages_html_starts_its_first_read(store):
    """The browser loads a page's scripts (a third of a second at fleet size) between asking
    for its HTML and its first callback: the read that callback waits on starts with the HTML,
    and the callback finds it. A script, a callback, a probe that takes any type or the health
    check reads nothing."""
    from burnrate.dashboard.app import create_app
    from burnrate.dashboard.timerange import from_query
    from burnrate.dashboard.ui import SERVICE_KEY

    source = CountedOverview(store)
    app = create_app(source, refresh_s=3600)
    service = app.server.extensions[SERVICE_KEY].of(None)
    key = from_query(SEARCH, service.default_range)
    client = app.server.test_client()
    for path, accept in (("/assets/style.css", "text/css,*/*;q=0.1"), ("/_dash-layout", "application/json"),
                         ("/", "*/*"), ("/healthz", "text/html")):
        assert client.get(path + SEARCH, headers={"Accept": accept}).status_code == 200
    time.sleep(0.5)
    assert source.overview_reads == 0 and not service.overviews.has(key)
    page = client.get("/jobs" + SEARCH, headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert page.status_code == 200 and b"_dash-config" in page.data
    deadline = time.monotonic() + 60
    while not service.overviews.has(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.overviews.has(key) and source.overview_reads == 1
    # The page's callback draws from it: no second read.
    assert len(service.overview(key).fleet.gpu_labels) == GPUS and source.overview_reads == 1
    # A URL whose range is malformed starts nothing (its page says what is wrong).
    client.get("/?start=yesterday-ish", headers={"Accept": "text/html"})
    time.sleep(0.2)
    assert source.overview_reads == 1


def test_a_page_asked_without_its_credentials_reads_nothing(store):
    from burnrate.dashboard.app import create_app

    source = CountedOverview(store)
    client = create_app(source, refresh_s=3600, basic_auth=("team", "secret")).server.test_client()
    assert client.get("/" + SEARCH, headers={"Accept": "text/html"}).status_code == 401
    time.sleep(0.5)
    assert source.overview_reads == 0
