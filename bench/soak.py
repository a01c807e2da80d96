"""Agent soak: does `burnrate agent` hold its memory over hours of job turnover?

Runs the real agent (8 simulated GPUs, 1 s collection, --forget-after 30) with 64 trainer
ranks sending 10 messages/s each through the trainers' own sender (TelemetrySink), their
job names changing every 20 s, so that ranks, holders and series are forgotten and made
anew all along; /metrics is scraped every second. The agent's RSS (from /proc) and its
series count are sampled over time. Passes when RSS after the warm-up stays within 2 MiB.

    .venv/bin/python bench/soak.py [--minutes 60] [--warmup-minutes 5] [--tracemalloc]

--tracemalloc runs the agent under tracemalloc (slower) and adds Python's own count of
the memory it holds, and the allocation sites that grew most after the warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from agent import free_port, metric  # bench/ is on sys.path when run as a script

from burnrate.exporter.telemetry import TelemetrySink

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPUS, RANKS, RATE_HZ, TURNOVER_S, FORGET_AFTER_S = 8, 64, 10.0, 20.0, 30.0
FLAT_MIB = 2.0
MiB = 2**20


def trainers(path: str, stop: threading.Event, dropped: list[int]) -> None:
    """64 ranks in jobs of 8, each job renamed every TURNOVER_S."""
    sinks = [TelemetrySink(path) for _ in range(RANKS)]
    start = next_at = time.monotonic()
    step = 0
    while not stop.is_set():
        step += 1
        generation = int((time.monotonic() - start) // TURNOVER_S)
        for rank, sink in enumerate(sinks):
            sink.send({"v": 1, "training_job": f"job-{rank // 8}-{generation}", "namespace": "ml",
                       "pod": f"trainer-{rank // 8}-{generation}-{rank % 8}", "rank": rank % 8, "world_size": 8,
                       "local_rank": rank % 8, "step": step, "time": time.time(), "steps": 1, "step_s": 0.1,
                       "data_wait_s": 0.004, "compute_s": 0.09, "samples": 8, "tokens": 8192, "flops": 6e12,
                       "loss": 2.5, "grad_norm": 1.0, "mfu": 0.4})
        next_at += 1.0 / RATE_HZ
        stop.wait(max(0.0, next_at - time.monotonic()))
    dropped[0] = sum(sink.dropped for sink in sinks)
    for sink in sinks:
        sink.close()


def scraper(url: str, stop: threading.Event, scrapes: list[tuple[float, float, int]]) -> None:
    """One scrape a second: (when, latency ms, series)."""
    next_at = time.monotonic()
    while not stop.is_set():
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
        latency = (time.perf_counter() - start) * 1000
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        scrapes.append((time.monotonic(), latency, series))
        next_at += 1.0
        stop.wait(max(0.0, next_at - time.monotonic()))


def wait_until_serving(url: str, agent: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except OSError:
            if agent.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"soak: the agent did not start serving {url} (exit status {agent.poll()})")
            time.sleep(0.2)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per minute."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def traced_agent(report: str, every_s: float, argv: list[str]) -> int:
    """The agent in this process under tracemalloc: its traced memory every `every_s` to
    `report` as JSON lines and, at exit, the sites that grew most since SIGUSR1 (the end of
    the warm-up)."""
    import tracemalloc
    from burnrate.cli import main

    tracemalloc.start(10)
    baseline: list[tracemalloc.Snapshot] = []
    signal.signal(signal.SIGUSR1, lambda *_: baseline.append(tracemalloc.take_snapshot()))
    out = open(report, "a", encoding="utf-8")

    def watch() -> None:
        while True:
            out.write(json.dumps({"at": time.time(), "traced": tracemalloc.get_traced_memory()[0]}) + "\n")
            out.flush()
            time.sleep(every_s)

    threading.Thread(target=watch, daemon=True).start()
    code = main(argv)
    if baseline:
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        grown = tracemalloc.take_snapshot().filter_traces(ignore).compare_to(
            baseline[0].filter_traces(ignore), "traceback")
        for stat in grown[:8]:
            frames = [f"{f.filename.replace(ROOT + os.sep, '')}:{f.lineno}" for f in stat.traceback][-4:]
            out.write(json.dumps({"site": " < ".join(reversed(frames)), "grown": stat.size_diff,
                                  "count": stat.count_diff}) + "\n")
    out.close()
    return code


def main() -> int:
    if sys.argv[1:2] == ["--traced-agent"]:
        report, every, *argv = sys.argv[2:]
        return traced_agent(report, float(every), argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the soak (default 60)")
    parser.add_argument("--warmup-minutes", type=float, default=5.0,
                        help="left out of the flatness check and the slope (default 5)")
    parser.add_argument("--sample-every", type=float, default=10.0, metavar="S", help="RSS sampling (default 10 s)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="run the agent under tracemalloc and report what it holds and where it grew")
    args = parser.parse_args()
    if args.warmup_minutes >= args.minutes:
        parser.error("--warmup-minutes must be shorter than --minutes")
    tmp = tempfile.mkdtemp(prefix="burnrate-soak-")
    sock, port, traced = os.path.join(tmp, "telemetry.sock"), free_port(), os.path.join(tmp, "traced.jsonl")
    agent_args = ["agent", "--backend", "simulated", "--gpus", str(GPUS), "--interval", "1",
                  "--forget-after", str(FORGET_AFTER_S), "--listen", f"127.0.0.1:{port}", "--telemetry-socket", sock]
    command = [sys.executable, "-m", "burnrate", *agent_args] if not args.tracemalloc else [
        sys.executable, os.path.abspath(__file__), "--traced-agent", traced, str(args.sample_every), *agent_args]
    agent = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    stop = threading.Event()
    scrapes: list[tuple[float, float, int]] = []
    dropped = [0]
    threads = []
    load_before = os.getloadavg()
    try:
        wait_until_serving(url, agent)
        start, start_wall = time.monotonic(), time.time()
        threads = [threading.Thread(target=trainers, args=(sock, stop, dropped)),
                   threading.Thread(target=scraper, args=(url, stop, scrapes))]
        for thread in threads:
            thread.start()
        rss: list[tuple[float, float]] = []
        baseline_taken = not args.tracemalloc
        while (elapsed := time.monotonic() - start) < 60 * args.minutes:
            rss.append((elapsed, rss_mib(agent.pid)))
            if not baseline_taken and elapsed >= 60 * args.warmup_minutes:
                agent.send_signal(signal.SIGUSR1)
                baseline_taken = True
            time.sleep(args.sample_every)
        stop.set()
        for thread in threads:
            thread.join()
        with urllib.request.urlopen(url) as resp:
            text = resp.read().decode()
        received = metric(text, "burnrate_agent_telemetry_received_total")
        rejected = metric(text, "burnrate_agent_telemetry_rejected_total")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        agent.terminate()
        try:
            agent.wait(60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        try:
            with open(traced, encoding="utf-8") as fh:
                lines = [json.loads(line) for line in fh]
        except FileNotFoundError:
            lines = []
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    traced_mib = [(x["at"] - start_wall, x["traced"] / MiB) for x in lines if "at" in x]

    warmup = 60 * args.warmup_minutes
    after = [(t, m) for t, m in rss if t >= warmup]
    latencies = [ms for t, ms, _ in scrapes if t - start >= warmup]
    series = [n for t, _, n in scrapes if t - start >= warmup]
    spread = max(m for _, m in after) - min(m for _, m in after)
    print(f"burnrate agent soak: {args.minutes:g} min ({args.warmup_minutes:g} min warm-up), {GPUS} simulated GPUs, "
          f"{RANKS} ranks x {RATE_HZ:g} msg/s, job names changing every {TURNOVER_S:g} s, --forget-after "
          f"{FORGET_AFTER_S:g}, scraped every second{', under tracemalloc' if args.tracemalloc else ''}; "
          f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"{received:,.0f} datagrams received, {rejected:,.0f} rejected, {dropped[0]:,} dropped by the senders\n")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| RSS at the end of warm-up (MiB) | {after[0][1]:.1f} |")
    print(f"| RSS at the end (MiB) | {after[-1][1]:.1f} |")
    print(f"| RSS spread after warm-up (MiB) | {spread:.1f} |")
    print(f"| RSS slope after warm-up (MiB/min) | {slope_per_min(after):.3f} |")
    print(f"| series, min–max | {min(series):,}–{max(series):,} |")
    print(f"| scrape p50 (ms) | {statistics.median(latencies):.2f} |")
    print(f"| scrape p99 (ms) | {statistics.quantiles(latencies, n=100)[98]:.2f} |")
    ok = spread <= FLAT_MIB
    verdict = f"RSS after warm-up flat within {FLAT_MIB:g} MiB"
    traced_after = [m for t, m in traced_mib if warmup <= t <= rss[-1][0]]
    if traced_after:
        grown = traced_after[-1] - traced_after[0]
        print(f"| traced by tracemalloc, growth after warm-up (MiB) | {grown:.3f} |")
        # Under tracemalloc the RSS holds its tables and the warm-up's snapshot: what Python holds is the measure.
        ok, verdict = abs(grown) <= FLAT_MIB, f"traced memory after warm-up flat within {FLAT_MIB:g} MiB"
    print(f"\n{verdict}: {'yes' if ok else 'NO'}")
    print()
    print("| minute | RSS (MiB) | series | scrape p99 (ms) |" + (" traced (MiB) |" if traced_mib else ""))
    print("|---:|---:|---:|---:|" + ("---:|" if traced_mib else ""))
    marks = {0.0, warmup, rss[-1][0], *range(0, int(60 * args.minutes) + 1, 300)}
    for t, m in sorted({min(rss, key=lambda p: abs(p[0] - mark)) for mark in marks}):
        window = [(ms, n) for w, ms, n in scrapes if abs(w - start - t) <= 30]
        p99 = statistics.quantiles([ms for ms, _ in window], n=100)[98] if len(window) > 1 else float("nan")
        row = f"| {t / 60:.1f} | {m:.1f} | {window[-1][1] if window else 0:,} | {p99:.1f} |"
        if traced_mib:
            row += f" {min(traced_mib, key=lambda p: abs(p[0] - t))[1]:.2f} |"
        print(row)
    sites = [x for x in lines if "site" in x]
    if sites:
        print("\nAllocation sites that grew most after warm-up (tracemalloc):")
        for site in sites:
            print(f"  {site['grown'] / 1024:+9.1f} KiB {site['count']:+7d} blocks  {site['site']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
