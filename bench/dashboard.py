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

`--prometheus` times cold starts from a real Prometheus instead: the fleet back-filled into
its blocks with its roll-ups (bench/fleet_mode.py, kept in the cache directory), and for every
page (Fleet, Jobs, Cost, Findings, and the page of the job on the most GPUs) `--repeat` headless
Chromium loads over the fleet's window, each from a fresh app with nothing cached, timed from
navigation to the first paint (the page drawn from the read at the display's resolution) and to
the page drawn from the range's analysis (fleet mode, as the store keeps the roll-ups).

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


@dataclass(frozen=True)
class ColdPage:
    name: str
    path: str                  # after the app's root; {job} is the job on the most GPUs
    early: str                 # CSS of what the page draws from the overview's read
    full: str                  # CSS of what it draws once the range's analysis is done
    complete: str = ""         # CSS of what it draws last, where that is not `full`


# `#<page>-progress:empty` once the early content is drawn: the line that said the analysis was running is gone.
COLD_PAGES = (ColdPage("fleet", "", "#fleet-heatmap", "#fleet-findings"),
              ColdPage("jobs", "jobs", "#jobs-table td", "#jobs-progress:empty"),
              # The showback's calendar days are analyses of their own, after the range's.
              ColdPage("cost", "cost", "#cost-pending", "#cost-waste", "#cost-showback-table"),
              ColdPage("findings", "findings", "#findings-pending", "#findings-table td"),
              ColdPage("job", "{job}", "#job-pending", "#job-ledger"))


def prometheus_first_paint(args: argparse.Namespace) -> int:
    """Per page, cold loads (a fresh app each): seconds to the first paint and to the page drawn
    from the range's analysis."""
    import fleet_mode
    import psutil
    from fleets import END
    from burnrate.analyzer.sources.timeparse import format_time

    data = fleet_mode.stored_fleet(args.cache, args.gpus, args.hours)
    proc, url = fleet_mode.prometheus(data.parent, data)
    search = f"?start={format_time(END - args.hours * 3600)}&end={format_time(END)}"
    times: dict[str, list[tuple[float, float, float]]] = {}
    job, way = None, "-"
    try:
        for page in COLD_PAGES:
            for _ in range(args.repeat):
                loaded = cold_load(url, page, search, job, psutil.Process(proc.pid), args.full_timeout)
                times.setdefault(page.name, []).append(loaded.seconds)
                job, way = job or loaded.job, way if way != "-" else loaded.way
    finally:
        fleet_mode.stop(proc)
    print(f"\nEvery page, cold, from Prometheus: {args.gpus} GPUs × {args.hours:g} h at 15 s, {args.repeat} loads "
          f"each in headless Chromium, a fresh app each (the job: {job[0]}/{job[1]}, the one on the most GPUs)\n")
    print("| page | first paint s, median | loads | the analysis drawn s, median | page complete s, median | ok |")
    print("|---|---:|---|---:|---:|---|")
    worst = 0.0
    for name, loads in times.items():
        first, full, complete = (statistics.median(load[i] for load in loads) for i in range(3))
        worst = max(worst, first)
        print(f"| {name} | {first:.1f} | {', '.join(f'{load[0]:.1f}' for load in loads)} | {full:.1f} | "
              f"{complete:.1f} | {'yes' if first <= FIRST_PAINT_SECONDS else 'NO'} |")
    print(f"\nfirst paint: the page drawn from the overview's read; the analysis drawn: its findings, ledger or "
          f"waste; complete: the Cost page's showback too, whose calendar days are analysed after the range "
          f"(target for the first paint ≤ {FIRST_PAINT_SECONDS:g} s)\nthe analysis read the store: {way}")
    return 0 if worst <= FIRST_PAINT_SECONDS else 1


@dataclass(frozen=True)
class ColdLoad:
    seconds: tuple[float, float, float]     # first paint, the analysis drawn, the page complete
    job: tuple[str, str]                    # the job on the most GPUs, from the load's analysis
    way: str                                # how the analysis read the store, as the header says


def cold_load(url: str, page: ColdPage, search: str, job: tuple[str, str] | None, store,
              full_timeout: float) -> ColdLoad:
    """One load of `page` from a fresh app with nothing cached, the analysis not started before it."""
    import psutil
    from burnrate.analyzer.sources import PrometheusSource
    from burnrate.dashboard.app import create_app
    from burnrate.dashboard.testing import chromium, serve, wait, wait_drawn
    from burnrate.dashboard.ui import job_href
    from selenium.common.exceptions import TimeoutException

    app = create_app(PrometheusSource(url, min_step_s=15.0, timeout_s=600.0), ttl_s=3600, refresh_s=3600)
    path = job_href(*job, search) if page.path == "{job}" else f"/{page.path}{search}"
    # The store's CPU and the whole machine's over the load: a load slowed by something else on
    # the machine shows as machine CPU beyond the store's and the app's.
    store_cpu, machine, app_cpu = sum(store.cpu_times()[:2]), psutil.cpu_times(), time.process_time()
    with serve(app) as base, tempfile.TemporaryDirectory() as profile, chromium(profile) as driver:
        driver.get(base + path)
        first = wait_drawn(driver, page.early, timeout_s=600, poll_s=0.05)
        try:
            full = wait_drawn(driver, page.full, timeout_s=full_timeout, poll_s=0.2)
            way = wait(driver, 30, 0.2).until(lambda d: d.find_elements("id", "app-way"))[0].text
        except TimeoutException:
            # What the page says instead: the analysis still running, or why it failed.
            said = driver.find_element("tag name", "main").text
            print(f"\n{page.name}: not drawn within {full_timeout:g} s; the page said: {said[:600]}")
            full, way = math.nan, "-"
        # The next load starts with nothing of this one's still running.
        complete = (wait_drawn(driver, page.complete, timeout_s=full_timeout, poll_s=0.2)
                    if page.complete and not math.isnan(full) else full)
        busy = sum(psutil.cpu_times()[:3]) - sum(machine[:3])
        print(f"  {page.name}: first paint {first / 1000:.1f} s, analysis drawn {full / 1000:.1f} s, complete "
              f"{complete / 1000:.1f} s; CPU s: store {sum(store.cpu_times()[:2]) - store_cpu:.1f}, app "
              f"{time.process_time() - app_cpu:.1f}, machine {busy:.1f}", file=sys.stderr, flush=True)
    return ColdLoad((first / 1000, full / 1000, complete / 1000), job or job_on_most_gpus(app, search), way)


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
