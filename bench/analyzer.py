"""Analyzer benchmark: end-to-end `analyze` on simulated fleets of 128 to 1,024 GPUs
× 7 days at 15 s (≈ 41 M samples per metric at the largest).

Recordings are generated once into a cache directory and reused. Each size runs
in a fresh process, so its peak RSS is its own: load the recording, detect, cost,
render the JSON document. A week is analyzed at the step Prometheus would answer
it with (55 s: at most 11,000 points per series); every 15 s sample is read and
reduced to it (analyzer.grid.resample).

    .venv/bin/python bench/analyzer.py [--sizes 128,256,512,1024] [--days 7] [--cache DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from fleets import cached_fleet  # bench/ is on sys.path when run as a script

TARGET_SECONDS = 10.0
TARGET_RSS_GB = 2.0


def measure(root: str, max_points: int | None) -> dict[str, float]:
    """Runs in the child: one end-to-end analysis, timed by phase."""
    if max_points:
        from burnrate.analyzer.grid import resample
        resample.MAX_POINTS = max_points
    from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.sources.recording_tables import complete_rows, segments
    from burnrate.analyzer.output.report import analyze, render_json
    from burnrate.analyzer.sources import RecordingSource

    began = time.monotonic()
    frames = RecordingSource(root).frames(columns=ANALYSIS_COLUMNS)
    loaded = time.monotonic()
    report = analyze(frames, load_catalog(), release_frames=True)    # as `burnrate analyze` does
    analyzed = time.monotonic()
    render_json(report)
    done = time.monotonic()
    samples = sum(complete_rows(s, {"t": "f8"}) for s in segments(root, "gpu"))
    return {"rows": float(samples), "step_s": frames.step_s, "load_s": loaded - began, "analyze_s": analyzed - loaded,
            "total_s": done - began, "findings": float(len(report.findings)),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,256,512,1024", help="GPU counts, comma-separated")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "burnrate-bench"),
                        help="where recordings are kept between runs, each under a digest of the code "
                        "that wrote it (bench/fleets.py): a changed simulator writes a new one")
    parser.add_argument("--max-points", type=int, help="points per series before a window is reduced "
                        "(default: Prometheus' 11,000; 100000 keeps a week at 15 s)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.max_points)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for gpus in sizes:
        root = cached_fleet(args.cache, gpus, args.days * 24)
        extra = ["--max-points", str(args.max_points)] if args.max_points else []
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", root, *extra],
                             capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append((gpus, result))
        print(f"{gpus} GPUs done: {result['total_s']:.1f} s", file=sys.stderr, flush=True)
    print(f"{'GPUs':>6} {'samples/metric':>15} {'step s':>7} {'load s':>8} {'analyze s':>10} {'total s':>8} "
          f"{'peak RSS GB':>12} {'findings':>9}")
    for gpus, r in rows:
        print(f"{gpus:>6} {r['rows']:>15,.0f} {r['step_s']:>7.0f} {r['load_s']:>8.1f} {r['analyze_s']:>10.1f} "
              f"{r['total_s']:>8.1f} {r['peak_rss_gb']:>12.2f} {r['findings']:>9.0f}")
    largest = rows[-1][1]
    met = largest["total_s"] <= TARGET_SECONDS and largest["peak_rss_gb"] <= TARGET_RSS_GB
    print(f"targets for {rows[-1][0]} GPUs: ≤ {TARGET_SECONDS:g} s and ≤ {TARGET_RSS_GB:g} GB: "
          f"{'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
