"""The dashboard in a real headless Chromium, for its browser test and its load-time
benchmark: serve an app on a free local port, start Chromium, wait until a page is
drawn. Needs selenium (the `test` extra) and Debian's chromium and chromium-driver."""
from __future__ import annotations

import os
import shutil
import threading
from contextlib import contextmanager
from typing import Iterator

import dash
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait
from werkzeug.serving import WSGIRequestHandler, make_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1400, 1000

# When the page's main element is there and Plotly has drawn every graph (it draws
# after the element exists): the time since navigation began, in ms; else null.
_DRAWN_AT = """
    const drawn = document.querySelector(arguments[0])
        && [...document.querySelectorAll('.dash-graph')].every(g => g.querySelector('.main-svg'));
    return drawn ? performance.now() : null;
"""

# Each row's cell texts and the named attributes of the row.
_ROWS = """
    return [...document.querySelectorAll(arguments[0])].map(r => [
        [...r.querySelectorAll('td')].map(c => c.innerText.trim()),
        arguments[1].map(a => r.getAttribute(a))]);
"""

# The number cards (dashboard.ui.stat): label, value, the line under it.
_STATS = "return [...document.querySelectorAll('.br-stat')].map(s => [...s.children].map(c => c.textContent))"


def chromium_installed() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


class _Unlogged(WSGIRequestHandler):
    def log_request(self, *args: object) -> None:
        """A page load makes dozens of requests: not one line each."""


@contextmanager
def serve(app: dash.Dash) -> Iterator[str]:
    """The app served on a free local port, in a thread; yields its base URL."""
    server = make_server("127.0.0.1", 0, app.server, threaded=True, request_handler=_Unlogged)
    thread = threading.Thread(target=server.serve_forever, name="dashboard-under-test", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(5)


@contextmanager
def chromium(profile_dir: str) -> Iterator[webdriver.Chrome]:
    """Headless Chromium with a fresh profile in `profile_dir`, keeping the browser's console log."""
    # Never let Selenium Manager look for (or download) a browser or driver.
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={profile_dir}", f"--window-size={WIDTH},{HEIGHT}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: webdriver.Chrome, timeout_s: float = 30.0, poll_frequency: float = 0.5) -> WebDriverWait:
    """A wait that polls again, rather than fails, when Dash redraws an element between
    the condition finding it and reading it (a stale element)."""
    return WebDriverWait(driver, timeout_s, poll_frequency=poll_frequency,
                         ignored_exceptions=(StaleElementReferenceException,))


def table_rows(driver: webdriver.Chrome, row_css: str, attributes: tuple[str, ...] = ()) -> list:
    """[cell texts, attribute values] for each row `row_css`, read in one step, so a redraw
    cannot leave some of them read from the old table and some from the new."""
    return driver.execute_script(_ROWS, row_css, list(attributes))


def stat_cards(driver: webdriver.Chrome) -> dict[str, tuple[str, str]]:
    """The page's number cards: label -> (value, the line under it)."""
    return {label: (value, sub) for label, value, sub in driver.execute_script(_STATS)}


def wait_drawn(driver: webdriver.Chrome, ready_css: str, timeout_s: float = 30.0, poll_s: float = 0.5) -> float:
    """Wait until the element `ready_css` is on the page and every graph is drawn;
    returns the milliseconds from the start of the document's navigation (a full
    load; navigation inside the app keeps the document) to when that was seen."""
    return wait(driver, timeout_s, poll_s).until(lambda d: d.execute_script(_DRAWN_AT, ready_css))


def screenshot(driver: webdriver.Chrome, name: str) -> None:
    """The whole page as `name`.png in $BURNRATE_SCREENSHOTS, when that is set: what a user
    sees, to be looked at, beside the tests' assertions on it."""
    out = os.environ.get("BURNRATE_SCREENSHOTS")
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    # The window's height holds the browser's own bars too: the page's, plus theirs, shows all of it.
    height, bars = driver.execute_script("return [document.documentElement.scrollHeight, "
                                         "window.outerHeight - window.innerHeight]")
    driver.set_window_size(WIDTH, min(max(height, 800), 4000) + bars)
    driver.save_screenshot(os.path.join(out, f"{name}.png"))
    driver.set_window_size(WIDTH, HEIGHT)
