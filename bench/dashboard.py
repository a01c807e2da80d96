"""Dashboard benchmark: server-side time to build each page for a simulated fleet
of 1,024 GPUs × 24 h at 15 s (target: ≤ 2 s per page, analysis cached).

The recording is generated once into a cache directory and reused. The analysis
(read + detectors + cost) is timed on its own: the app computes it once per range
and refreshes it in the background, so page renders share it. Each page is timed
as its callback runs it (layout, aggregation, figures) and as the JSON Dash sends.

    .venv/bin/python bench/dashboard.py [--gpus 1024] [--hours 24] [--cache DIR] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import plotly.io as pio

from fleets import cached_fleet  # bench/ is on sys.path when run as a script

TARGET_SECONDS = 2.0


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "burnrate-bench"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from analyzer.sources import RecordingSource
    from dashboard.app import create_app
    from dashboard.timerange import from_query
    from dashboard.ui import current_service, render

    root = cached_fleet(args.cache, args.gpus, args.hours)
    app = create_app(RecordingSource(root), where=root, ttl_s=3600)
    from dashboard.pages import cost, findings, fleet, job, jobs  # registered by create_app

    rows = []
    with app.server.app_context():
        service = current_service()
        began = time.perf_counter()
        analysis = service.analysis(from_query("", service.default_range))
        rows.append(("analysis (read, detect, cost; cached per range)", time.perf_counter() - began, None, None))
        top = analysis.jobs.sort_values("gpus", ascending=False).iloc[0]
        pages = {
            "fleet": lambda: render("", fleet.content),
            "jobs": lambda: render("", jobs.content),
            f"job ({top['namespace']}/{top['training_job']}, {top['gpus']:g} GPUs)":
                lambda: render("", lambda a, s: job.content(a, top["namespace"], top["training_job"])),
            "findings": lambda: render("", lambda a, s: findings.content(a, s, None, None, None)),
            "cost": lambda: render("", cost.content),
        }
        for name, build in pages.items():
            seconds, children = timed(build, args.repeat)
            json_began = time.perf_counter()
            payload = pio.json.to_json_plotly(children)
            rows.append((f"page: {name}", seconds, time.perf_counter() - json_began, len(payload)))

    print(f"\ndashboard, {args.gpus} GPUs × {args.hours:g} h at 15 s "
          f"({analysis.views.n} samples per series), median of {args.repeat}\n")
    print(f"| {'what':<58} | {'build s':>8} | {'JSON s':>7} | {'JSON KB':>8} | ok |")
    print(f"|{'-' * 60}|{'-' * 10}|{'-' * 9}|{'-' * 10}|----|")
    worst = 0.0
    for name, seconds, json_s, size in rows:
        page = json_s is not None
        total = seconds + (json_s or 0.0)
        if page:
            worst = max(worst, total)
        print(f"| {name:<58} | {seconds:8.3f} | {json_s if page else 0:7.3f} | "
              f"{(size or 0) / 1024:8.0f} | {('yes' if total <= TARGET_SECONDS else 'NO') if page else '':>2} |")
    print(f"\nslowest page {worst:.2f} s (target ≤ {TARGET_SECONDS:g} s)")
    return 0 if worst <= TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
