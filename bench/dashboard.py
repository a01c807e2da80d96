"""Dashboard benchmark: for a simulated fleet of 1,024 GPUs × 24 h at 15 s, the
server-side time to build each page (target: ≤ 2 s per page, analysis cached) and
what a user waits for in a browser: from navigation until the page is drawn.

The recording is generated once into a cache directory and reused. The analysis
(read + detectors + cost) is timed on its own: the app computes it once per range
and refreshes it in the background, so page renders share it. Each page is timed
as its callback runs it (layout, aggregation, figures) and as the JSON Dash sends.
Then the app is served locally and headless Chromium loads each page: the time from
the start of the navigation until the page's main table or graph is there and
Plotly has drawn every graph (callbacks, transfer and drawing included, analysis
already cached, browser cache warm). `--browser-gpus` gives that part a smaller
fleet of its own; `--no-browser` leaves it out.

`--prometheus` times a cold start from a real Prometheus instead: the fleet back-filled into
its blocks with its roll-ups (bench/fleet_mode.py, kept in the cache directory), a fresh app
with nothing cached, and one headless Chromium load of the Fleet page over the fleet's window,
timed from navigation to the first paint (the page drawn from the read at the display's
resolution) and to the full figures (the findings table, after the range's analysis: fleet
mode, as the store keeps the roll-ups; the header says which way it read). Then the page of the
job on the most GPUs, timed from navigation to its ledger drawn: in fleet mode its nodes read
per GPU over its life.

    .venv/bin/python bench/dashboard.py [--gpus 1024] [--hours 24] [--cache DIR] [--repeat 3]
        [--browser-gpus N] [--no-browser] [--prometheus]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import plotly.io as pio

from fleets import cached_fleet  # bench/ is on sys.path when run as a script

TARGET_SECONDS = 2.0
FIRST_PAINT_SECONDS = 3.0


@dataclass(frozen=True)
class Page:
    name: str
    path: str
    ready: str                          # CSS of the page's main table or graph
    build: Callable[[], object]         # what its callback renders


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def analyzed_app(cache: str, gpus: int, hours: float):
    """An app over the cached fleet, its default range analyzed; returns (app, analysis, seconds)."""
    from burnrate.analyzer.sources import RecordingSource
    from burnrate.dashboard.app import create_app
    from burnrate.dashboard.timerange import from_query
    from burnrate.dashboard.ui import current_service

    app = create_app(RecordingSource(cached_fleet(cache, gpus, hours)), ttl_s=3600)
    with app.server.app_context():
        service = current_service()
        began = time.perf_counter()
        analysis = service.analysis(from_query("", service.default_range))
        return app, analysis, time.perf_counter() - began


def pages_of(analysis) -> list[Page]:
    from burnrate.dashboard.filters import FindingFilters
    from burnrate.dashboard.pages import cost, findings, fleet, job, jobs  # registered by create_app
    from burnrate.dashboard.ui import job_href, render

    top = analysis.jobs.sort_values("gpus", ascending=False).iloc[0]
    namespace, training_job = top["namespace"], top["training_job"]
    return [
        Page("fleet", "/", "#fleet-heatmap", lambda: render("", fleet.content)),
        Page("jobs", "/jobs", "#jobs-table td", lambda: render("", jobs.content)),
        Page(f"job ({namespace}/{training_job}, {top['gpus']:g} GPUs)", job_href(namespace, training_job, ""),
             "#job-timeline", lambda: render("", lambda a, s: job.content(a, namespace, training_job))),
        Page("findings", "/findings", "#findings-table td",
             lambda: render("", lambda a, s: findings.content(a, s, FindingFilters()))),
        Page("cost", "/cost", "#cost-waste", lambda: render("", cost.content)),
    ]


def server_side(app, pages: list[Page], repeat: int) -> list[tuple[str, float, float, int]]:
    """Per page: median build seconds, JSON seconds, JSON bytes."""
    rows = []
    with app.server.app_context():
        for page in pages:
            seconds, children = timed(page.build, repeat)
            began = time.perf_counter()
            payload = pio.json.to_json_plotly(children)
            rows.append((page.name, seconds, time.perf_counter() - began, len(payload)))
    return rows


def in_browser(app, pages: list[Page], repeat: int) -> list[tuple[str, float, float]]:
    """Per page: median ms from navigation to the load event and to the page drawn."""
    from burnrate.dashboard.testing import chromium, serve, wait_drawn

    load_event = "return performance.getEntriesByType('navigation')[0].loadEventEnd"
    rows = []
    with serve(app) as base, tempfile.TemporaryDirectory() as profile, chromium(profile) as driver:
        for page in pages:
            loaded, drawn = [], []
            for attempt in range(repeat + 1):       # the first fills the browser's cache: not counted
                driver.get(base + page.path)
                drawn_ms = wait_drawn(driver, page.ready, timeout_s=120, poll_s=0.02)
                if attempt:
                    loaded.append(driver.execute_script(load_event))
                    drawn.append(drawn_ms)
            rows.append((page.name, statistics.median(loaded), statistics.median(drawn)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "burnrate-bench"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--browser-gpus", type=int, metavar="N",
                        help="a smaller fleet for the browser part (default: the same fleet)")
    parser.add_argument("--no-browser", action="store_true", help="leave out the browser part")
    parser.add_argument("--full-timeout", type=float, default=1200.0, metavar="S",
                        help="with --prometheus: how long to wait for the full analysis's findings")
    parser.add_argument("--prometheus", action="store_true",
                        help="a cold start from a real Prometheus: first paint vs full analysis")
    args = parser.parse_args()
    if args.prometheus:
        return prometheus_first_paint(args)

    app, analysis, analysis_s = analyzed_app(args.cache, args.gpus, args.hours)
    pages = pages_of(analysis)
    built = server_side(app, pages, args.repeat)

    print(f"\ndashboard, {args.gpus} GPUs × {args.hours:g} h at 15 s "
          f"({analysis.views.n} samples per series), median of {args.repeat}\n")
    print(f"| {'what':<58} | {'build s':>8} | {'JSON s':>7} | {'JSON KB':>8} |  ok |")
    print(f"|{'-' * 60}|{'-' * 10}|{'-' * 9}|{'-' * 10}|-----|")
    print(f"| {'analysis (read, detect, cost; cached per range)':<58} | {analysis_s:8.3f} | {'':>7} | {'':>8} |     |")
    worst = 0.0
    for name, seconds, json_s, size in built:
        total = seconds + json_s
        worst = max(worst, total)
        print(f"| {'page: ' + name:<58} | {seconds:8.3f} | {json_s:7.3f} | {size / 1024:8.0f} | "
              f"{'yes' if total <= TARGET_SECONDS else 'NO':>3} |")
    print(f"\nslowest page {worst:.2f} s (target ≤ {TARGET_SECONDS:g} s)")

    if not args.no_browser:
        browser_report(app, pages, args)
    return 0 if worst <= TARGET_SECONDS else 1


def browser_report(app, pages: list[Page], args: argparse.Namespace) -> None:
    from burnrate.dashboard.testing import chromium_installed

    if not chromium_installed():
        print("\nbrowser part left out: chromium and chromium-driver are not installed")
        return
    gpus = args.gpus
    if args.browser_gpus and args.browser_gpus != args.gpus:
        gpus = args.browser_gpus
        app, analysis, _ = analyzed_app(args.cache, gpus, args.hours)
        pages = pages_of(analysis)
    rows = in_browser(app, pages, args.repeat)
    smaller = f" (a smaller fleet than the {args.gpus} GPUs above)" if gpus != args.gpus else ""
    print(f"\nin headless Chromium, {gpus} GPUs × {args.hours:g} h{smaller}: ms from navigation until the "
          f"load event and until the page is drawn\n(analysis cached, browser cache warm), median of {args.repeat}\n")
    print(f"| {'page':<58} | {'load event ms':>13} | {'drawn ms':>8} |")
    print(f"|{'-' * 60}|{'-' * 15}|{'-' * 10}|")
    for name, loaded, drawn in rows:
        print(f"| {name:<58} | {loaded:13.0f} | {drawn:8.0f} |")
    print(f"\nslowest page in the browser {max(r[2] for r in rows) / 1000:.2f} s")


def prometheus_first_paint(args: argparse.Namespace) -> int:
    """Per cold load of the Fleet page: ms to the first paint and to the findings drawn."""
    import fleet_mode
    from fleets import END
    from burnrate.analyzer.sources import PrometheusSource
    from burnrate.analyzer.sources.timeparse import format_time
    from burnrate.dashboard.app import create_app
    from burnrate.dashboard.testing import chromium, serve, wait, wait_drawn
    from burnrate.dashboard.ui import job_href
    from selenium.common.exceptions import TimeoutException

    data = fleet_mode.stored_fleet(args.cache, args.gpus, args.hours)
    proc, url = fleet_mode.prometheus(data.parent, data)
    search = f"?start={format_time(END - args.hours * 3600)}&end={format_time(END)}"
    rows = []
    try:
        for _ in range(args.repeat):
            # A fresh app each time: nothing cached, the analysis not started before the visit.
            app = create_app(PrometheusSource(url, min_step_s=15.0, timeout_s=600.0), ttl_s=3600, refresh_s=3600)
            with serve(app) as base, tempfile.TemporaryDirectory() as profile, chromium(profile) as driver:
                driver.get(base + "/" + search)
                first = wait_drawn(driver, "#fleet-heatmap", timeout_s=600, poll_s=0.05)
                progress = driver.find_element("id", "fleet-progress").text
                print(f"  first paint {first / 1000:.1f} s", file=sys.stderr, flush=True)
                try:
                    full = wait_drawn(driver, "#fleet-findings", timeout_s=args.full_timeout, poll_s=0.2)
                    way = wait(driver, 30, 0.2).until(lambda d: d.find_elements("id", "app-way"))[0].text
                except TimeoutException:
                    # What the page says instead: the analysis still running, or why it failed.
                    main = driver.find_element("tag name", "main").text
                    print(f"\nno findings within {args.full_timeout:g} s; the page said: {main[:600]}")
                    full, way = math.nan, "-"
                print(f"  findings {full / 1000:.1f} s ({way})", file=sys.stderr, flush=True)
                job = job_on_most_gpus(app, search)
                driver.get(base + job_href(*job, search))
                opened = wait_drawn(driver, "#job-ledger", timeout_s=args.full_timeout, poll_s=0.1)
                rows.append((first, full, opened))
    finally:
        fleet_mode.stop(proc)
    first, full, opened = (statistics.median(r[i] for r in rows) for i in range(3))
    print(f"\nFleet page, cold, from Prometheus: {args.gpus} GPUs × {args.hours:g} h at 15 s, "
          f"median of {args.repeat} loads in headless Chromium\n")
    print(f"| {'what':<60} | {'s from navigation':>17} |")
    print(f"|{'-' * 62}|{'-' * 19}|")
    print(f"| {'Fleet page, first paint (display-resolution read)':<60} | {first / 1000:17.1f} |")
    print(f"| {'Fleet page, findings drawn (the range analysed)':<60} | {full / 1000:17.1f} |")
    print(f"| {f'then the page of {job[0]}/{job[1]}, its ledger drawn':<60} | {opened / 1000:17.1f} |")
    print(f"\nwhile the analysis ran the page said: {progress}\nthe analysis read the store: {way}")
    return 0 if first / 1000 <= FIRST_PAINT_SECONDS else 1


def job_on_most_gpus(app, search: str) -> tuple[str, str]:
    """The job the range's analysis lists on the most GPUs (the page's own cache: no read)."""
    from burnrate.dashboard.timerange import from_query
    from burnrate.dashboard.ui import current_service

    with app.server.app_context():
        service = current_service(search)
        jobs = service.analysis(from_query(search, service.default_range)).jobs
    top = jobs.sort_values("gpus", ascending=False).iloc[0]
    return top["namespace"], top["training_job"]


if __name__ == "__main__":
    sys.exit(main())
