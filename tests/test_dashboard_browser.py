"""A real headless Chromium loads every page of the dashboard serving a simulated
recording: the pages render, the browser logs no errors, the Findings page lists
the injected faults and keeps its filters in the URL, and links to a job's page
navigate inside the app. Screenshots go to $BURNRATE_SCREENSHOTS when set
(docs/screenshots holds the committed ones: `BURNRATE_SCREENSHOTS=docs/screenshots
.venv/bin/python -m pytest tests/test_dashboard_browser.py` makes them again)."""
from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

import pytest

from tests.conftest import require
from tests.test_dashboard import make_recording

pytestmark = pytest.mark.slow

pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402

from burnrate.dashboard.testing import WIDTH, chromium, screenshot, serve, wait, wait_drawn  # noqa: E402

# The recording's directory name is what the status line shows (and the screenshots).
RECORDING_NAME = "example-fleet"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from burnrate.analyzer.sources import RecordingSource
    from burnrate.dashboard.app import create_app

    root = str(tmp_path_factory.mktemp("dash") / RECORDING_NAME)
    truth = make_recording(root)
    with serve(create_app(RecordingSource(root), refresh_s=3600)) as base:
        yield base, truth, root


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    require("chromium"), require("chromedriver")
    with chromium(str(tmp_path_factory.mktemp("chromium"))) as driver:
        yield driver


def _load(driver, url: str, ready_css: str) -> None:
    driver.get(url)
    wait_drawn(driver, ready_css)


def _errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _straggler_job(truth: list[dict]) -> tuple[str, str]:
    hit = next(t for t in truth if t["kind"] == "straggler")
    return hit["namespace"], hit["training_job"]


def _column(driver, table: str, column: str) -> list[str]:
    # One script call reads every cell at once: a table re-rendered between element
    # look-ups would otherwise leave stale references behind.
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(cell => cell.innerText.trim());",
        f"#{table} td[data-dash-column={column}]")


def _chosen(driver, dropdown: str) -> list[str]:
    """The values a multi-select dropdown shows as selected."""
    return [item.text for item in driver.find_elements(By.CSS_SELECTOR, f"#{dropdown}-value .dash-dropdown-value-item")]


def test_every_page_renders_without_browser_errors(served, browser):
    base, truth, root = served
    namespace, job = _straggler_job(truth)
    pages = {
        "fleet": ("/", "#fleet-heatmap"),
        "jobs": ("/jobs", "#jobs-table"),
        "job": (f"/job/{namespace}/{job}", "#job-timeline"),
        "findings": ("/findings", "#findings-table"),
        "cost": ("/cost", "#cost-waste"),
    }
    for name, (path, ready) in pages.items():
        _load(browser, base + path, ready)
        wait(browser, 30).until(EC.text_to_be_present_in_element((By.ID, "app-status"), RECORDING_NAME))
        assert _errors(browser) == [], f"browser errors on {path}"
        assert browser.find_element(By.ID, "app-simulated").text == "SIMULATED DATA"
        status = browser.find_element(By.ID, "app-status").text
        assert f"UTC · recording {RECORDING_NAME}" in status and root not in status
        screenshot(browser, name)


def test_the_cost_page_shows_where_every_gpu_hour_went(served, browser):
    """The accounting identity as the analysis computed it, figure for figure."""
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze
    from burnrate.analyzer.sources import RecordingSource
    base, _, root = served
    _load(browser, base + "/cost", "#cost-accounting-observed")
    acc = analyze(RecordingSource(root).frames(), load_catalog(None)).accounting
    shown = {name: float(browser.find_element(By.CSS_SELECTOR, f"#cost-accounting-{name} td.br-num")
                         .text.replace(",", "")) for name in ("observed", "allocated", "unallocated", "busy", "idle")}
    assert shown["observed"] == pytest.approx(acc.observed_gpu_hours, abs=0.05) and shown["observed"] > 0
    assert shown["allocated"] == pytest.approx(acc.allocated_gpu_hours, abs=0.05)
    assert shown["observed"] == pytest.approx(shown["allocated"] + shown["unallocated"], abs=0.11)
    assert shown["allocated"] == pytest.approx(shown["busy"] + shown["idle"], abs=0.11)
    assert browser.find_element(By.ID, "cost-coverage").text == "samples cover 100.0% of the GPUs' time"


def test_findings_page_lists_the_injected_faults(served, browser):
    base, truth, _ = served
    _load(browser, base + "/findings", "#findings-table")
    assert {t["kind"] for t in truth} <= set(_column(browser, "findings-table", "kind"))
    assert _errors(browser) == []


def test_a_filtered_findings_url_opens_the_same_view(served, browser):
    base, truth, _ = served
    _load(browser, base + "/findings?range=1h&kind=straggler,stalled", "#findings-table td")
    assert _chosen(browser, "findings-kind") == ["straggler", "stalled"]
    assert _chosen(browser, "findings-severity") == []
    assert set(_column(browser, "findings-table", "kind")) == {"straggler", "stalled"}

    # A filter chosen on the page goes into the URL, next to the range and the other filters...
    browser.find_element(By.ID, "findings-severity").click()
    wait(browser, 10).until(EC.element_to_be_clickable(
        (By.XPATH, "//*[@role='option'][normalize-space()='critical']"))).click()
    wait(browser, 30).until(EC.url_contains("severity=critical"))
    shared = browser.current_url
    assert urlsplit(shared).query == "range=1h&kind=straggler,stalled&severity=critical"
    wait(browser, 30).until(lambda d: set(_column(d, "findings-table", "severity")) == {"critical"})
    rows = sorted(zip(_column(browser, "findings-table", "kind"), _column(browser, "findings-table", "where")))

    # ...and that URL, opened afresh, shows the same controls and the same rows.
    _load(browser, shared, "#findings-table td")
    assert _chosen(browser, "findings-kind") == ["straggler", "stalled"]
    assert _chosen(browser, "findings-severity") == ["critical"]
    assert "last 1h" in browser.find_element(By.ID, "app-range").text
    assert sorted(zip(_column(browser, "findings-table", "kind"), _column(browser, "findings-table", "where"))) == rows
    assert _errors(browser) == []


def _click_job_link(table: str, column: str):
    def click(driver) -> None:
        driver.find_element(By.CSS_SELECTOR, f"#{table} td[data-dash-column={column}] a").click()
    return click


def _click_costliest_job_bar(driver) -> None:
    bars = driver.find_elements(By.CSS_SELECTOR, "#cost-jobs .bars .point path")
    ActionChains(driver).move_to_element(bars[-1]).click().perform()    # the top bar


@pytest.mark.parametrize("path, ready, click", [
    ("/", "#fleet-findings td", _click_job_link("fleet-findings", "training_job")),
    ("/jobs", "#jobs-table td", _click_job_link("jobs-table", "job")),
    ("/findings", "#findings-table td", _click_job_link("findings-table", "training_job")),
    ("/cost", "#cost-jobs", _click_costliest_job_bar),
], ids=["fleet", "jobs", "findings", "cost"])
def test_links_to_a_job_navigate_without_reloading_the_document(served, browser, path, ready, click):
    base, _, _ = served
    _load(browser, f"{base}{path}?range=1h", ready)
    browser.execute_script("window.__marker = 'same document'")
    click(browser)
    wait(browser, 30).until(EC.url_contains("/job/"))
    wait_drawn(browser, "#job-timeline")
    assert browser.execute_script("return window.__marker") == "same document"
    url = urlsplit(browser.current_url)
    assert url.query == "range=1h"
    _, namespace, job = unquote(url.path).strip("/").split("/")
    assert browser.find_element(By.CSS_SELECTOR, "#_pages_content h2").text == f"{namespace}/{job}"
    assert _errors(browser) == []


def test_the_range_picker_puts_the_range_in_the_url(served, browser):
    base, _, _ = served
    _load(browser, base + "/findings?range=1h", "#findings-table")
    assert "last 1h" in browser.find_element(By.ID, "app-range").text
    browser.find_element(By.CSS_SELECTOR, "#app-nav a[href^='/cost']").click()
    wait(browser, 30).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#cost-waste")))
    assert browser.current_url.endswith("/cost?range=1h")
    assert _errors(browser) == []


def test_a_range_without_a_preset_stays_in_the_url(served, browser):
    base, _, _ = served
    _load(browser, base + "/jobs?range=30m", "#jobs-table")
    wait(browser, 30).until(EC.text_to_be_present_in_element((By.ID, "app-range"), "custom"))
    assert urlsplit(browser.current_url).query == "range=30m"
    assert _errors(browser) == []


AXES_AND_DATA = """
const box = document.getElementById(arguments[0]);
const gd = box.classList.contains('js-plotly-plot') ? box : box.querySelector('.js-plotly-plot');
const L = gd._fullLayout, xs = [];
for (const t of gd._fullData) for (const [i, x] of Array.from(t.x || []).entries())
    if (x !== null && (t.type === 'heatmap' || (t.y && t.y[i] !== null && t.y[i] === t.y[i]))) xs.push(L.xaxis.d2l(x));
return {
    axes: Object.keys(L).filter(k => /^xaxis\\d*$/.test(k)).map(k => [k, L[k].type, L[k].range.map(v => L[k].r2l(v))]),
    first: Math.min(...xs), last: Math.max(...xs),
};
"""


def assert_time_axes(browser, graph: str, window_ms: float, where: str, widest: float = 1.05) -> dict:
    """Every x axis of the graph is a date axis whose range, as the user sees it, holds all of
    the graph's data and is no wider than `widest` times the window (Plotly pads by a little);
    returns what was seen."""
    seen = browser.execute_script(AXES_AND_DATA, graph)
    assert seen["axes"], f"{where}: no x axes drawn"
    for name, kind, (start, end) in seen["axes"]:
        assert kind == "date", (where, graph, name)
        assert start <= seen["first"] and end >= seen["last"], (where, graph, name)
        assert end - start <= window_ms * widest, (where, graph, name)
    assert seen["last"] > seen["first"], (where, graph)
    return seen


STACKED_BARS = """
const gd = document.getElementById(arguments[0]).querySelector('.js-plotly-plot');
const totals = {}, written = {};
for (const t of gd._fullData) for (const [i, x] of Array.from(t.x).entries()) {
  if (t.type === 'bar') totals[x] = (totals[x] || 0) + t.y[i];
  else if (t.mode === 'text') written[x] = t.text[i];
}
return {totals: totals, written: written, range: gd._fullLayout.yaxis.range};
"""


def test_the_cost_pages_namespace_bars_are_the_jobs_dollars(served, browser):
    """Each namespace's stacked bar, as drawn, is the sum of its jobs' dollars, and the
    y axis the user sees runs from zero past the tallest bar."""
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze
    from burnrate.analyzer.sources import RecordingSource
    base, _, root = served
    _load(browser, base + "/cost", "#cost-namespace")
    expected: dict[str, float] = {}
    for job in analyze(RecordingSource(root).frames(), load_catalog(None)).jobs:
        expected[job.namespace] = expected.get(job.namespace, 0.0) + (job.cost_dollars or 0.0)
    seen = browser.execute_script(STACKED_BARS, "cost-namespace")
    assert seen["totals"].keys() == expected.keys()
    for namespace, dollars in expected.items():
        assert seen["totals"][namespace] == pytest.approx(dollars, abs=0.02), namespace
        assert seen["written"][namespace] == f"${dollars:,.2f}", namespace    # over the stack, however small
    low, high = seen["range"]
    assert low <= 0 < max(expected.values()) <= high


def test_the_fleet_pages_time_axes_span_the_recording(served, browser):
    from burnrate.analyzer.sources import RecordingSource

    base, _, root = served
    window = RecordingSource(root).frames().window
    _load(browser, base + "/", "#fleet-heatmap")
    for graph in ("fleet-state", "fleet-burn", "fleet-heatmap"):
        assert_time_axes(browser, graph, (window.end - window.start) * 1000, "fleet")


def test_a_jobs_panels_span_its_own_time_with_or_without_findings(served, browser, tmp_path):
    """Every over-time panel of a job's page is a date axis over the job's own time: the
    x range a user sees is from the job's first sample to the end of its last (one 15 s step
    after it), 5% of that wider each side. A job without findings (here from a fleet without
    faults) once made the shared axis linear, squeezing every panel into a line at the right
    edge. A range the URL names is kept as it is."""
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze
    from burnrate.analyzer.sources import RecordingSource
    from burnrate.simulator.simulate import Spec, simulate
    from tests.processes import dashboard

    base, truth, _ = served
    healthy = str(tmp_path / "healthy")
    simulate(healthy, Spec(nodes=1, gpus_per_node=8, hours=1.0, seed=1, end=1_795_000_000.0, healthy_only=True))
    report = analyze(RecordingSource(healthy).frames(), load_catalog())
    quiet = next((j.namespace, j.training_job) for j in report.jobs
                 if not any(f.job == (j.namespace, j.training_job) for f in report.findings))
    window_ms = (report.window.end - report.window.start) * 1000
    with dashboard(tmp_path, healthy) as healthy_base:
        for url in (base + "/job/{}/{}".format(*_straggler_job(truth)), healthy_base + "/job/{}/{}".format(*quiet)):
            _load(browser, url, "#job-timeline")
            seen = assert_time_axes(browser, "job-timeline", window_ms, url, widest=1.12)
            first, last = seen["first"], seen["last"] + 15_000
            margin = 0.05 * (last - first)
            for _, _, (start, end) in seen["axes"]:
                assert (start, end) == pytest.approx((first - margin, last + margin), abs=1), url
        # The quiet job's findings panel says so where a user looks (a panel with no trace
        # was not drawn at all, its note with it).
        notes = browser.execute_script(
            "return [...document.querySelectorAll('#job-timeline .annotation-text')].map(e => e.textContent)")
        assert "No findings for this job" in notes
        start, end = report.window.start - 1800, report.window.end
        url = healthy_base + "/job/{}/{}?start={:.0f}&end={:.0f}".format(*quiet, start, end)
        _load(browser, url, "#job-timeline")
        seen = assert_time_axes(browser, "job-timeline", (end - start) * 1000, url)
        for _, _, shown in seen["axes"]:
            assert shown == pytest.approx([start * 1000, end * 1000], abs=1), url


def test_a_short_recording_reads_in_its_own_scale(browser, tmp_path):
    """Three minutes of one GPU (tests/data/h200-ledger, recorded on an H200): the job's time
    ticks are 15 s apart and each panel's read 15:04:00, 15:04:15, ..., not "15:04" four times
    over; the fleet's cost over the window reads in cents and its GPU-hours in three digits,
    not "$0" and "0.0"."""
    import tarfile

    from tests.processes import dashboard
    from tests.test_gpu_ledger import LOCAL

    with tarfile.open(LOCAL / "recording.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    with dashboard(tmp_path, str(tmp_path / "rec")) as base:
        _load(browser, base + "/job/default/ledger-gpu", "#job-timeline")
        panels = browser.execute_script(
            "const g = document.getElementById('job-timeline');"
            "return Array.from(g.querySelectorAll('.xaxislayer-above')).map("
            "a => Array.from(a.querySelectorAll('.xtick text')).map(t => t.textContent));")
        gpus = browser.execute_script(
            "return Array.from(document.querySelectorAll('.br-stat')).find("
            "c => c.querySelector('.br-stat-label').textContent == 'GPUs').textContent;")
        _load(browser, base + "/", "#fleet-heatmap")
        cards = browser.execute_script(
            "return Object.fromEntries(Array.from(document.querySelectorAll('.br-stat')).map("
            "c => [c.querySelector('.br-stat-label').textContent, c.textContent]));")
    assert gpus == "GPUs1spot or on-demand: unknown"      # a node that did not say which: said so in full
    over = cards["over the window"]
    assert re.search(r"\$0\.[1-9]\d", over) and re.search(r"; 0\.0[1-9]\d\d GPU-hours", over), cards
    upper = [ticks for ticks in panels[:-1] if ticks]
    assert upper and all(len(set(ticks)) == len(ticks) >= 4 for ticks in upper), panels
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", tick) for ticks in upper for tick in ticks), panels


def test_now_on_the_fleet_page_says_which_gpus_it_counts(browser, tmp_path):
    """The demo's recording: a fleet that stops at T, then one node sampled every second.
    "Now" counts the GPUs reporting now and says how many stopped and when, instead of
    reading as a fleet that lost them."""
    from burnrate.analyzer.sources.timeparse import format_time
    from burnrate.simulator.simulate import Spec, simulate
    from tests.processes import dashboard
    from tests.snapshots import record_live_node

    end = 15 * 119_666_666.0         # on the 15 s grid: the fleet's last sample
    root = str(tmp_path / "mixed")
    simulate(root, Spec(nodes=2, gpus_per_node=4, hours=1.0, seed=1, end=end))
    record_live_node(root, end, 60, 1.0)
    with dashboard(tmp_path, root) as base:
        _load(browser, base + "/", "#fleet-heatmap")
        stats = browser.execute_script(
            "return Object.fromEntries(Array.from(document.querySelectorAll('.br-stat')).map(s => ["
            "s.querySelector('.br-stat-label').textContent.trim(),"
            "[s.querySelector('.br-stat-value').textContent.trim(), s.querySelector('.br-stat-sub').textContent.trim()]]));")
    assert stats["GPUs busy now"] == ["2", f"of 2 GPUs reporting; 8 more stopped reporting at {format_time(end + 15)}"]
    assert stats["burn rate now"][1] == "the 2 reporting"


HOSTILE_JOBS = ("x](https://evil.example/phish)[y", '<a href="https://evil.example/a">click</a>',
                "![i](https://evil.example/i.png)")
OFF_SITE = """
return Array.from(document.querySelectorAll('a, img, image'))
    .map(e => e.getAttribute('href') || e.getAttribute('xlink:href') || e.getAttribute('src') || '')
    .filter(h => h.includes('evil.example') && !h.startsWith('/job/'));    // the app's own job links stay
"""


def test_names_from_the_cluster_are_text_never_links(browser, tmp_path):
    """Job names come from pod labels anyone who can create a pod writes. As markdown
    in a table or as Plotly text in a chart, they show as the characters they are: no
    off-site link, no image fetched, on the Jobs page or the Cost page's charts."""
    from burnrate.simulator.simulate import Spec, simulate
    from tests.processes import dashboard
    from tests.snapshots import record_live_node

    end = 15 * 119_666_666.0
    root = str(tmp_path / "hostile")
    simulate(root, Spec(nodes=1, gpus_per_node=2, hours=0.5, seed=1, end=end, healthy_only=True))
    for i, name in enumerate(HOSTILE_JOBS):
        record_live_node(root, end + 60 * i, 60, 5.0, job=name)
    with dashboard(tmp_path, root) as base:
        _load(browser, base + "/jobs", "#jobs-table")
        assert browser.execute_script(OFF_SITE) == []
        assert set(HOSTILE_JOBS) <= set(_column(browser, "jobs-table", "job"))
        _load(browser, base + "/cost", "#cost-jobs")
        assert browser.execute_script(OFF_SITE) == []
        ticks = browser.execute_script(
            "return Array.from(document.querySelectorAll('#cost-jobs .ytick text')).map(t => t.textContent);")
        assert {f"demo/{name}" for name in HOSTILE_JOBS} <= set(ticks)     # the chart names namespace/job


WATERFALL = """
const g = document.getElementById('job-waterfall');
return {bars: Array.from(g.querySelectorAll('.trace.bars .bartext')).map(t => t.textContent),
        labels: Array.from(g.querySelectorAll('.xtick text')).map(t => t.textContent),
        title: g.querySelector('.gtitle').textContent};
"""


def test_a_training_jobs_page_opens_with_where_its_money_went(served, browser):
    """The waterfall a user reads at the top of a training job's page: the job's cost, less
    each cause of badput, leaves its productive dollars, as the analysis computed them."""
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze
    from burnrate.analyzer.sources import RecordingSource
    from burnrate.exporter.ledger import BADPUT
    base, truth, root = served
    namespace, name = _straggler_job(truth)
    job = next(j for j in analyze(RecordingSource(root).frames(), load_catalog(None)).jobs
               if (j.namespace, j.training_job) == (namespace, name))
    _load(browser, f"{base}/job/{namespace}/{name}", "#job-waterfall")
    seen = browser.execute_script(WATERFALL)
    causes = [c for c in BADPUT if job.ledger.gpu_hours[c] > 0]
    assert len(causes) >= 2
    assert seen["labels"] == ["allocated"] + [c.replace("_", " ") for c in causes] + ["productive"]
    assert seen["bars"] == [f"${job.cost_dollars:,.2f}"] + \
        [f"−${job.ledger_dollars(job.ledger.gpu_hours[c]):,.2f}" for c in causes] + \
        [f"${job.ledger_dollars(job.ledger.gpu_hours['productive']):,.2f}"]
    shown = [float(text.replace("−", "-").replace("$", "").replace(",", "")) for text in seen["bars"]]
    assert sum(shown[:-1]) == pytest.approx(shown[-1], abs=0.01 * len(shown))      # each rounded to a cent
    assert f"goodput {job.goodput:.0%}" in seen["title"]
    assert _errors(browser) == []


def test_wasted_dollars_read_with_two_decimals(served, browser):
    base, _, _ = served
    for path, table in (("/", "fleet-findings"), ("/findings", "findings-table")):
        _load(browser, base + path, f"#{table} td")
        shown = [cell for cell in _column(browser, table, "wasted_dollars") if cell]
        assert shown and all(re.fullmatch(r"\$\d{1,3}(,\d{3})*\.\d\d", cell) for cell in shown), shown


def test_the_cards_stay_in_one_row_at_1400_px_whatever_their_notes_say(served, browser):
    """A long note (GPUs that stopped reporting, with when) wraps inside its card; the six
    cards keep one row across the page."""
    base, _, _ = served
    _load(browser, base + "/", "#fleet-heatmap")
    assert browser.execute_script("return window.innerWidth") <= WIDTH
    browser.execute_script("document.querySelector('.br-stat-sub').innerText = "
                           "'of 64 GPUs reporting; 8 more stopped reporting at 2026-11-18T10:41:45Z'")
    tops, right, width = browser.execute_script(
        "const cards = Array.from(document.querySelectorAll('.br-stats .br-stat'));"
        "const row = document.querySelector('.br-stats').getBoundingClientRect();"
        "return [cards.map(c => c.getBoundingClientRect().top), "
        "Math.max(...cards.map(c => c.getBoundingClientRect().right)), row.right];")
    assert len(tops) == 6 and len(set(tops)) == 1 and right <= width + 0.5
