"""Fleet mode against the per-GPU path, side by side in one run, on real stores.

1. Per-GPU path vs fleet mode on one Prometheus, and `burnrate analyze --prometheus URL` with
   no flag as a user types it (it picks its way from the store: analyzer.fleet.choice; the
   row says which, and the command's own steps, clusters and retention checks included, are
   timed): a simulated fleet (`burnrate simulate`, 15 s)
   back-filled with promtool (the series the analysis reads, and the GPU-second counters the
   agent would have exposed: its own counting replayed over the samples), the shipped roll-ups
   evaluated over it by `promtool tsdb create-blocks-from rules`; kept in the cache directory.
   After each analysis the store alone answers the same question, each job's GPU-hours and
   idle GPU-hours (bench/store_floor.py), and each analysis is printed as a ratio to it.
2. Fleet mode alone at fleet scale on VictoriaMetrics: a week of roll-up series for N GPUs
   (what the ruler would have written), imported directly; no per-GPU series are stored, so
   this measures reading and flagging the roll-ups, not the drill-down (measured in part 1).
3. Fleet mode at N GPUs × 7 days at full 15 s resolution on VictoriaMetrics: a training fleet
   from the contract's generator (bench/contract_week.py), every GPU's series and the roll-ups
   vmalert replays over them, checked against the fleet's truth (the planted faults found,
   the jobs' GPU-hours). The per-GPU path is not run on it (part 1 measures it on a day).

Each analysis runs in a fresh process, so its peak RSS is its own; the store's CPU seconds
are read from /proc before and after.

    .venv/bin/python bench/fleet_mode.py [--gpus 1024] [--hours 24] [--fleet-gpus 10000] [--fleet-days 7]
                                         [--week-gpus 1024]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import resource
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fleets import END, GPUS_PER_NODE, WRITERS, cached_fleet, digest  # noqa: E402  bench/ is on sys.path when run as a script
from tests.conftest import free_port  # noqa: E402  the repository root, inserted above
from tests.rollup_stores import rollup_rules  # noqa: E402
import store_floor  # noqa: E402  bench/

EVAL_S = 60.0
STEP_S = 15.0  # the simulated fleet's sample interval
# The analyzer's time over the store's answering the same question alone (bench/store_floor.py).
# The command as a user types it: `burnrate analyze --prometheus URL --since 24h`.
NO_FLAG = "no flag"
FLOOR_TARGETS = {"per-GPU": 2.0, "fleet": 1.5, NO_FLAG: 1.5}
# The analyzer's target is 4 GB; an analysis that needs more than this fails rather than swap.
CHILD_MEMORY_GB = 16.0
PER_GPU_MAX_POINTS = 400_000_000


def measure(url: str, start: float, end: float, fleet: bool | str, interval: float | None) -> dict[str, float]:
    """Runs in the child: one analysis, timed; `fleet` NO_FLAG runs the command's own path."""
    from burnrate.analyzer.fleet.mode import analyze_fleet
    from burnrate.analyzer.grid.frames import Window
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze, render_json
    from burnrate.analyzer.sources import PrometheusSource
    from burnrate.analyzer.sources.promhttp import Limits
    from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS

    # The per-GPU read of a day of 1,024 GPUs holds more points than the read's default bound
    # (--max-points 100,000,000) lets one read hold; it is measured past it, as a user who
    # raises the flag would read it.
    source = PrometheusSource(url, min_step_s=15.0, timeout_s=600.0,
                              limits=Limits(points=PER_GPU_MAX_POINTS) if fleet is False else Limits())
    window = Window(start, end)
    began, cpu = time.monotonic(), _cpu_s()
    if fleet == NO_FLAG:
        report = as_typed(url, window)
    elif fleet:
        report = analyze_fleet(source, window, load_catalog(), interval_s=interval)
    else:
        # As `burnrate analyze --per-gpu` runs it: the grids take the frames' columns (release_frames).
        report = analyze(source.frames(window, ANALYSIS_COLUMNS), load_catalog(), release_frames=True)
    render_json(report)
    accounting = report.accounting
    basis = next((n for n in report.notes if n.startswith("fleet mode:")), "")
    return {"total_s": time.monotonic() - began, "findings": len(report.findings), "jobs": len(report.jobs),
            "gpu_hours": sum(j.gpu_hours for j in report.jobs),
            "job_gpu_hours": {f"{j.namespace}/{j.training_job}": j.gpu_hours for j in report.jobs},
            "idle_gpu_hours": accounting.idle_gpu_hours if accounting is not None else None,
            "drilled": basis.split(" nodes read per GPU")[0].removeprefix("fleet mode: ") if basis else "all",
            "found": sorted({f"{f.kind}:{f.training_job}" for f in report.findings}),
            "read": next((n for n in report.notes if n.startswith("read ")), ""),
            "peak_rss_gb": _peak_rss_gb(), "cpu_s": _cpu_s() - cpu}


def as_typed(url: str, window):
    """`burnrate analyze --prometheus URL --start --end --format json`, its steps as the command
    runs them (analyzer.cli.run), the window fixed where the back-filled day lies."""
    from burnrate.analyzer import cli
    from burnrate.analyzer.costing.cost import AdviceConfig
    from burnrate.analyzer.options import source_options

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--prometheus", url, "--start", repr(window.start), "--end", repr(window.end),
                              "--format", "json"])
    options = source_options(args)
    return cli.report_of(args, options, cli.one_source(args, options), options.catalog(), options.detectors(),
                         AdviceConfig(), cli.overrides_of(args))


def _cpu_s() -> float:
    """This process's CPU seconds, user and system, every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_gb() -> float:
    """This process's high-water mark (ru_maxrss would carry the parent's over exec)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 2**20


def run_child(url: str, start: float, end: float, fleet: bool | str, server: psutil.Process,
              interval: float | None = None) -> dict[str, float | str]:
    """One analysis in a fresh process whose address space is capped at CHILD_MEMORY_GB, so that
    one that does not fit fails alone (the row says so) instead of taking the machine with it."""
    before, began = sum(server.cpu_times()[:2]), time.monotonic()
    cap = int(CHILD_MEMORY_GB * 2**30)
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps([url, start, end, fleet, interval])],
                         capture_output=True, text=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    if out.returncode == 0:
        result: dict[str, float | str] = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        # The error's own words, without its module's path: why it failed is the row's point.
        result = {"total_s": time.monotonic() - began, "failed": last.split(": ", 1)[-1][:240],
                  "drilled": "all" if not fleet else "?"}
    result["store_cpu_s"] = sum(server.cpu_times()[:2]) - before
    return result


def wait(url: str, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the store exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url}: not ready")


def prometheus(root: Path, data: Path, rules: Path | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = root / f"prometheus-{port}.yml"
    config.write_text("global: {scrape_interval: 1m}\n" + (f"rule_files: [{str(rules)!r}]\n" if rules else ""))
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}", "--query.max-samples=200000000",
                             "--storage.tsdb.retention.time=100y"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait(url + "/-/ready", proc)
    finally:
        config.unlink()     # read at start; a cache's folder keeps only the store
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stored_fleet(cache: str, gpus: int, hours: float) -> Path:
    """The simulated fleet back-filled into Prometheus blocks with its roll-ups, kept in the
    cache between runs: what the analysis reads (`ANALYSIS_COLUMNS`) and the counters."""
    from burnrate.analyzer.sources.openmetrics import write_openmetrics
    from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS
    from tests.recorded_counters import write_gpu_time

    # ...and what turns it into blocks: the OpenMetrics writer, the columns read, the counters
    # and the roll-up rules evaluated over them
    made_by = digest(*WRITERS, "analyzer/sources/openmetrics.py", "analyzer/grid/views.py",
                     "tests/recorded_counters.py", "manifests/alerts/burnrate-rules.yaml")
    root = Path(cache) / f"prometheus-{gpus}gpus-{hours:g}h-{made_by}"
    data = root / "tsdb"
    if (root / "ready").exists():
        return data
    shutil.rmtree(data, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    text = root / "fleet.om"
    if not _complete(text):
        recording = cached_fleet(cache, gpus, hours)
        with open(text, "w", encoding="utf-8") as fh:
            write_openmetrics(recording, fh, columns=ANALYSIS_COLUMNS, end=False)
            write_gpu_time(recording, fh, 15.0)
            fh.write("# EOF\n")
        print(f"  wrote {text.stat().st_size / 2**30:.1f} GB of OpenMetrics in {time.monotonic() - began:.0f} s",
              file=sys.stderr)
    began = time.monotonic()
    # promtool reads the whole text once per block: one block for the whole fleet is one read.
    span = f"{2 * math.ceil(hours / 2) + 2:d}h"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", f"--max-block-duration={span}",
                    str(text), str(data)], check=True, capture_output=True)
    text.unlink()
    print(f"  back-filled in {time.monotonic() - began:.0f} s", file=sys.stderr)
    began = time.monotonic()
    rules = rollup_rules(root)
    proc, url = prometheus(root, data)
    try:
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--start={int(END - hours * 3600)}",
                        f"--end={int(END + 600)}", f"--url={url}", f"--output-dir={root / 'recorded'}",
                        f"--eval-interval={int(EVAL_S)}s", str(rules)], check=True, capture_output=True)
    finally:
        stop(proc)
    for block in os.listdir(root / "recorded"):
        shutil.move(str(root / "recorded" / block), data)
    print(f"  roll-ups evaluated in {time.monotonic() - began:.0f} s", file=sys.stderr)
    (root / "ready").touch()
    return data


def _complete(text: Path) -> bool:
    """A text written to its end by an earlier run."""
    if not text.exists() or text.stat().st_size < 6:
        return False
    with open(text, "rb") as fh:
        fh.seek(-6, os.SEEK_END)
        return fh.read() == b"# EOF\n"


def per_gpu_vs_fleet(root: Path, cache: str, gpus: int, hours: float) -> list[tuple[str, dict]]:
    data = stored_fleet(cache, gpus, hours)
    proc, url = prometheus(root, data, rollup_rules(root))
    try:
        server = psutil.Process(proc.pid)
        window = (END - hours * 3600.0 - 60.0, END + 60.0)
        rows = []
        # Alternately: each analysis, then the store alone on the same question.
        for path, fleet in ((f"per-GPU (--max-points {PER_GPU_MAX_POINTS:,})", False), ("fleet", True),
                            (NO_FLAG, NO_FLAG)):
            row = run_child(url, *window, fleet, server)
            row["store"] = store_alone(url, *window)
            rows.append((path, row))
        return rows
    finally:
        stop(proc)


def store_alone(url: str, start: float, end: float) -> dict[str, float | dict]:
    """The per-job GPU-hours and idle GPU-hours as the store answers them (bench/store_floor.py):
    both queries' wall seconds together, and their answers."""
    seconds, answers = 0.0, {}
    for name, query in store_floor.queries(end - start, STEP_S).items():
        took, answers[name] = store_floor.ask(url, query, end)
        seconds += took
    return {"seconds": seconds, **answers}


def rollup_lines(gpus: int, days: float, end: float, seed: int = 0):
    """A week of the roll-ups the ruler writes for `gpus` GPUs on 8-GPU nodes: jobs of 8 to 64
    GPUs that run for the whole window, a few of them starving or idle, as JSON import lines."""
    rng = np.random.default_rng(seed)
    times = np.arange(end - days * 86400.0, end + 1, EVAL_S)
    stamps = "[" + ",".join(str(int(t * 1000)) for t in times) + "]"

    def line(name: str, labels: dict[str, str], value: float) -> str:
        values = "[" + ",".join([f"{value:.6g}"] * len(times)) + "]"
        return f'{{"metric": {json.dumps({"__name__": name, **labels})}, "values": {values}, "timestamps": {stamps}}}\n'

    model = "NVIDIA H100 80GB HBM3"
    nodes = gpus // GPUS_PER_NODE
    node = 0
    job = 0
    from burnrate.analyzer.fleet import rollups as R
    while node < nodes:
        size = int(min(rng.choice([1, 1, 2, 4, 8]), nodes - node))
        name = {"namespace": f"team-{job % 20}", "training_job": f"run-{job}"}
        fault = rng.random()
        for n in range(size):
            host = {"Hostname": f"node-{node + n:05d}", "modelName": model}
            yield line(R.JOB_ALLOCATED, {**name, **host}, 8.0)
            yield line(R.JOB_IDLE, {**name, **host}, 8.0 if fault < 0.02 else 0.0)
            yield line(R.NODE_OBSERVED, host, 8.0)
            yield line(R.REPORTING, {"Hostname": host["Hostname"]}, 8.0)
        yield line(R.JOB_SHARE, name, 8.0 * size)
        for metric, value in ((R.STEPS, 2.0), (R.STEP_SECONDS, 16.0 * size), (R.TOKENS, 2e6 * size),
                              (R.MFU, 0.42), (R.LOSS, 2.1), (R.GRAD_NORM, 0.9), (R.STRAGGLE, 1.03)):
            yield line(metric, name, value)
        yield line(R.DATA_WAIT, name, (0.3 if 0.02 <= fault < 0.04 else 0.01) * 16.0 * size)
        node += size
        job += 1


@contextlib.contextmanager
def victoria(data: Path, root: Path | None = None):
    """VictoriaMetrics on `data`; yields its URL (and the process, for its CPU seconds)."""
    port = free_port()
    proc = subprocess.Popen(["victoria-metrics", f"-httpListenAddr=127.0.0.1:{port}",
                             f"-storageDataPath={data}", "-retentionPeriod=100y",
                             "-search.disableCache", "-search.latencyOffset=0s", "-search.maxPointsPerTimeseries=100000",
                             "-search.maxSamplesPerQuery=2000000000", "-search.maxUniqueTimeseries=10000000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait(url + "/health", proc)
        yield url, proc
    finally:
        stop(proc)


def fleet_at_scale(root: Path, gpus: int, days: float) -> list[tuple[str, dict]]:
    with victoria(root / "vmdata") as (url, proc):
        end = time.time() // 3600 * 3600 - 3600
        began = time.monotonic()
        batch: list[str] = []
        series = 0
        for text in rollup_lines(gpus, days, end):
            batch.append(text)
            if len(batch) >= 200:
                series += len(batch)
                _post(url, batch)
                batch = []
        series += len(batch)
        _post(url, batch)
        with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=600) as resp:
            resp.read()
        points = series * int(days * 86400 / EVAL_S + 1)
        print(f"  imported {series:,} roll-up series, {points:,} points, in {time.monotonic() - began:.0f} s",
              file=sys.stderr)
        server = psutil.Process(proc.pid)
        return [("fleet (roll-ups only)", run_child(url, end - days * 86400.0, end, True, server, EVAL_S))]


def week_at_full_resolution(root: Path, cache: str, gpus: int, days: float) -> list[tuple[str, dict]]:
    """A contract-generated training fleet at 15 s, raw series and roll-ups, on VictoriaMetrics."""
    from contract_week import stored_week

    def vm(data: Path):
        return _url_only(victoria(data))

    data, truth = stored_week(cache, gpus, days, rollup_rules(root), vm)
    with victoria(data) as (url, proc):
        row = run_child(url, truth["start"], truth["end"], True, psutil.Process(proc.pid), EVAL_S)
    row["truth"] = truth
    return [("fleet", row)]


@contextlib.contextmanager
def _url_only(store):
    with store as (url, _):
        yield url


def _post(url: str, lines: list[str]) -> None:
    if lines:
        request = urllib.request.Request(f"{url}/api/v1/import", data="".join(lines).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=600) as resp:
            resp.read()


def floor_table(rows: list[tuple[str, dict]]) -> None:
    """Each analysis beside the store answering its GPU-hours and idle GPU-hours alone."""
    if not rows:
        return
    print("\n| run | analyzer s / store s = ratio | target | met | job GPU-hours: analyzer, store, difference "
          "| largest job difference | jobs in one only | idle GPU-hours: analyzer, store, difference |")
    print("|---|---|---:|:---:|---|---:|---:|---|")
    for name, r in rows:
        store = r["store"]
        ratio = r["total_s"] / store["seconds"]
        target = FLOOR_TARGETS[name.split(" (")[0].split(",")[0]]
        hours = store_floor.difference(r["job_gpu_hours"], store["gpu_hours"])
        idle_store = sum(store["idle_gpu_hours"].values())
        idle = ("-" if r["idle_gpu_hours"] is None else
                f"{r['idle_gpu_hours']:,.1f}, {idle_store:,.1f}, {r['idle_gpu_hours'] - idle_store:+,.1f}")
        print(f"| {name} | {r['total_s']:.1f} / {store['seconds']:.2f} = {ratio:.1f}x | {target:g}x | "
              f"{'yes' if ratio <= target else 'no'} | {hours['analyzer']:,.1f}, {hours['store']:,.1f}, "
              f"{hours['analyzer'] - hours['store']:+,.1f} | {hours['largest_job']:.2f} | "
              f"{hours['only_analyzer']:.0f}, {hours['only_store']:.0f} | {idle} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024, help="GPUs of the per-GPU vs fleet comparison")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--fleet-gpus", type=int, default=10000, help="GPUs of the fleet-scale run (0: skip)")
    parser.add_argument("--fleet-days", type=float, default=7.0)
    parser.add_argument("--week-gpus", type=int, default=1024,
                        help="GPUs of the week of raw series at 15 s (0: skip)")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "burnrate-bench"),
                        help="where simulated recordings are kept between runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="burnrate-bench-fleet-") as tmp:
        if args.gpus:
            part = Path(tmp) / "prometheus"
            part.mkdir()
            rows += [(f"{args.gpus} GPUs × {args.hours:g} h", "Prometheus", *row)
                     for row in per_gpu_vs_fleet(part, args.cache, args.gpus, args.hours)]
        if args.fleet_gpus:
            part = Path(tmp) / "victoria"
            part.mkdir()
            rows += [(f"{args.fleet_gpus} GPUs × {args.fleet_days:g} d", "VictoriaMetrics", *row)
                     for row in fleet_at_scale(part, args.fleet_gpus, args.fleet_days)]
        if args.week_gpus:
            part = Path(tmp) / "week"
            part.mkdir()
            rows += [(f"{args.week_gpus} GPUs × 7 d at 15 s", "VictoriaMetrics", *row)
                     for row in week_at_full_resolution(part, args.cache, args.week_gpus, 7.0)]
    print("| run | store | nodes read per GPU | total s | peak RSS GB | analyzer CPU s | store CPU s | findings | jobs "
          "| GPU-hours |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for fleet, store, path, r in rows:
        if "failed" in r:
            print(f"| {path}, {fleet} | {store} | {r['drilled']} | failed after {r['total_s']:.0f} s: {r['failed']} | "
                  f"> {CHILD_MEMORY_GB:g} (cap) | - | {r['store_cpu_s']:.1f} | - | - | - |")
            continue
        print(f"| {path}, {fleet} | {store} | {r['drilled']} | {r['total_s']:.1f} | {r['peak_rss_gb']:.2f} | "
              f"{r['cpu_s']:.1f} | {r['store_cpu_s']:.1f} | {r['findings']} | {r['jobs']} | {r['gpu_hours']:,.1f} |")
    floor_table([(f"{path}, {fleet}", r) for fleet, _, path, r in rows if "store" in r and "failed" not in r])
    for fleet, _, path, r in rows:
        if r.get("read"):
            print(f"\n{path}, {fleet}: {r['read']}")
    for fleet, _, path, r in rows:
        if "truth" in r and "found" in r:
            truth, found = r["truth"], set(r["found"])
            idle = sum(f"idle_gpu:{j}" in found for j in truth["idle"])
            starving = sum(f"dataloader_starvation:{j}" in found for j in truth["starving"])
            print(f"\n{fleet}, {path}: planted idle jobs found {idle} of {len(truth['idle'])}, starving jobs "
                  f"{starving} of {len(truth['starving'])}; {len(found)} findings in all; jobs "
                  f"{r['jobs']} of {truth['jobs']}; job GPU-hours {r['gpu_hours']:,.1f} against "
                  f"{truth['job_gpu_hours']:,.1f} held ({100 * (r['gpu_hours'] / truth['job_gpu_hours'] - 1):+.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
