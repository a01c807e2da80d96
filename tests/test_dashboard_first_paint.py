"""The Fleet page's first paint from a real Prometheus, in a real headless Chromium: it draws
the window read at the display's resolution while the full analysis runs, says that the
analysis is running (never "no findings"), then shows the findings once it is done, with the
same GPU-hours.

The full analysis of a small fleet takes a second, too short to look at: the source here is
the store's own PrometheusSource whose full read (the one without a display step) waits
until the test releases it, standing for the minutes a fleet's day takes."""
from __future__ import annotations

import re
import threading

import pytest

from tests.conftest import require
from tests.processes import prometheus
from tests.test_dashboard import SPEC, make_recording
from tests.test_prometheus_source import backfill

pytestmark = pytest.mark.slow

pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from burnrate.analyzer.sources import PrometheusSource  # noqa: E402
from burnrate.analyzer.sources.timeparse import format_time  # noqa: E402
from burnrate.dashboard.testing import chromium, serve, wait_drawn  # noqa: E402


class HeldSource(PrometheusSource):
    """The full read waits for `release`; the overview's (with a step) goes straight to the store."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.release = threading.Event()

    def frames(self, window=None, columns=None, *args, step=None, **kwargs):
        if step is None:
            self.release.wait(120)
        return super().frames(window, columns, *args, step=step, **kwargs)


def _gpu_hours(driver) -> float:
    text = driver.execute_script("return document.querySelector('.br-stats').innerText")
    return float(re.search(r"([\d,.]+) GPU-hours", text).group(1).replace(",", ""))


def test_the_fleet_page_draws_before_the_analysis_and_fills_in_after(tmp_path):
    require("chromium"), require("chromedriver")
    from burnrate.dashboard.app import create_app

    recording = str(tmp_path / "rec")
    make_recording(recording)
    gpus = SPEC.nodes * SPEC.gpus_per_node
    with prometheus(tmp_path, storage=backfill(tmp_path, recording)) as prom:
        source = HeldSource(prom.url)
        search = f"?start={format_time(SPEC.end - SPEC.hours * 3600)}&end={format_time(SPEC.end)}"
        try:
            with serve(create_app(source, refresh_s=3600)) as base, chromium(str(tmp_path / "chromium")) as driver:
                driver.get(base + "/" + search)
                wait_drawn(driver, "#fleet-heatmap", timeout_s=30)
                progress = driver.find_element(By.ID, "fleet-progress").text
                assert f"analysing the window's {gpus} GPUs…" in progress and "s so far" in progress
                # An hour over the heatmap's columns is finer than the scrape: its own 15 s.
                assert "the figures are utilization at 15-second means" in progress
                page = driver.find_element(By.TAG_NAME, "main").text
                assert "No findings" not in page and "Findings follow" in page
                assert f"GPU utilization ({gpus} GPUs)" in driver.find_element(By.ID, "fleet-heatmap").text
                assert not source.release.is_set()
                early = _gpu_hours(driver)

                source.release.set()
                WebDriverWait(driver, 60, poll_frequency=0.5).until(
                    lambda d: d.find_elements(By.CSS_SELECTOR, "#fleet-findings td"))
                assert driver.find_element(By.ID, "fleet-progress").text == ""
                assert "Findings follow" not in driver.find_element(By.TAG_NAME, "main").text
                assert early == pytest.approx(_gpu_hours(driver), abs=0.1)
                assert early == pytest.approx(gpus * SPEC.hours, rel=0.02)
        finally:
            source.release.set()
