"""A real headless Chromium loads every page of the dashboard serving a simulated
recording: the pages render, the browser logs no errors, and the Findings page
lists the injected faults. Screenshots go to $BURNRATE_SCREENSHOTS when set
(docs/screenshots holds the committed ones)."""
from __future__ import annotations

import os
import shutil
import threading

import pytest
from werkzeug.serving import make_server

from tests.conftest import free_port
from tests.test_dashboard import make_recording

pytestmark = pytest.mark.slow

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WIDTH = 1400


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from analyzer.sources import RecordingSource
    from dashboard.app import create_app

    root = str(tmp_path_factory.mktemp("dash") / "recording")
    truth = make_recording(root)
    app = create_app(RecordingSource(root), where=f"recording {root}", refresh_s=3600)
    port = free_port()
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", truth
    server.shutdown()
    thread.join(5)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are not installed (.ci/run installs them)")
        pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    # Never let Selenium Manager look for (or download) a browser or driver.
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
                f"--window-size={WIDTH},1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def _load(driver, url: str, ready_css: str) -> None:
    driver.get(url)
    WebDriverWait(driver, 30).until(EC.presence_of_element_located((By.CSS_SELECTOR, ready_css)))
    # Plotly draws after the element exists: wait until every graph on the page has its SVG.
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return [...document.querySelectorAll('.dash-graph')].every(g => g.querySelector('.main-svg'))"))


def _errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _screenshot(driver, name: str) -> None:
    out = os.environ.get("BURNRATE_SCREENSHOTS")
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(max(height, 800), 4000))
    driver.save_screenshot(os.path.join(out, f"{name}.png"))
    driver.set_window_size(WIDTH, 1000)


def _straggler_job(truth: list[dict]) -> tuple[str, str]:
    hit = next(t for t in truth if t["kind"] == "straggler")
    return hit["namespace"], hit["training_job"]


def test_every_page_renders_without_browser_errors(served, browser):
    base, truth = served
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
        assert _errors(browser) == [], f"browser errors on {path}"
        assert browser.find_element(By.ID, "app-simulated").text == "SIMULATED DATA"
        _screenshot(browser, name)


def test_findings_page_lists_the_injected_faults(served, browser):
    base, truth = served
    _load(browser, base + "/findings", "#findings-table")
    kinds = {cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#findings-table td[data-dash-column=kind]")}
    assert {t["kind"] for t in truth} <= kinds
    assert _errors(browser) == []


def test_the_range_picker_puts_the_range_in_the_url(served, browser):
    base, _ = served
    _load(browser, base + "/findings?range=1h", "#findings-table")
    assert "last 1h" in browser.find_element(By.ID, "app-range").text
    browser.find_element(By.CSS_SELECTOR, "#app-nav a[href^='/cost']").click()
    WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#cost-waste")))
    assert browser.current_url.endswith("/cost?range=1h")
    assert _errors(browser) == []
