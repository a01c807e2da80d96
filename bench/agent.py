"""Agent benchmark: 8 simulated GPUs, 64 ranks sending telemetry at 10 messages/s each.

Runs the real `burnrate agent` process (1 s collection interval) and measures, side by
side, an idle phase (no telemetry) and two loaded phases: scrape latency p50/p99 (plain
and gzip), collection time, the agent's RSS and CPU share of one core. The idle and the
first loaded phase are scraped every second, an upper bound; the last one at the
interval the ServiceMonitor deploys (15 s), which is what a node pays in production.

    .venv/bin/python bench/agent.py [--seconds 30] [--scrape-interval 15] [--backend nvml]

With `--backend nvml` the agent reads the machine's real GPUs through NVML instead, and the
table adds the collection time per GPU.

CPU is split by thread: the main thread (the sampler), the telemetry reader (its kernel
name, READER_THREAD), and the rest (the HTTP server, which renders on the first scrape
after each snapshot).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psutil

from burnrate.agent.telemetry.inbox import READER_THREAD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDLE = "idle"
LOADED = "64 ranks x 10/s"                       # scraped every second: an upper bound
LOADED_DEPLOYED = "64 ranks x 10/s, deployed scrape"
TARGETS = {"scrape p99 (ms)": 5.0, "RSS (MB)": 80.0, "CPU (% of one core)": 0.5}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def senders(path: str, ranks: int, rate_hz: float, stop: threading.Event) -> None:
    socks = [socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(ranks)]
    step = 0
    next_at = time.monotonic()
    while not stop.is_set():
        step += 1
        for rank, sock in enumerate(socks):
            msg = {"v": 1, "training_job": f"job-{rank // 8}", "namespace": "ml", "pod": f"pod-{rank}",
                   "rank": rank % 8, "world_size": 8, "local_rank": rank % 8, "step": step, "time": time.time(),
                   "steps": 1, "step_s": 0.1, "data_wait_s": 0.004, "compute_s": 0.09, "samples": 8,
                   "tokens": 8192, "flops": 6e12, "loss": 2.5, "grad_norm": 1.0, "mfu": 0.4}
            try:
                sock.sendto(json.dumps(msg).encode(), path)
            except OSError:
                pass
        next_at += 1.0 / rate_hz
        stop.wait(max(0.0, next_at - time.monotonic()))
    for sock in socks:
        sock.close()


def scrape_ms(url: str, gzip: bool) -> float:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip else {})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()
    return (time.perf_counter() - start) * 1000


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def thread_cpu(proc: psutil.Process) -> tuple[float, float]:
    """CPU seconds of the agent's main thread (the sampler) and of its telemetry reader, from
    the scheduler's nanoseconds: clock ticks (10 ms) are 0.05% of a core over 20 s."""
    main = reader = 0.0
    for t in proc.threads():
        if t.id == proc.pid:
            main = _cpu_s(proc.pid, t.id)
        elif _task_file(proc.pid, t.id, "comm").strip() == READER_THREAD:
            reader = _cpu_s(proc.pid, t.id)
    return main, reader


def process_cpu_s(pid: int) -> float:
    """The whole process's CPU seconds, ended threads included, in nanoseconds as the threads'
    figures are: clock_getcpuclockid(3)'s clock for `pid` (Linux's (~pid << 3) | CPUCLOCK_SCHED),
    so the other threads' share is never a difference of ticks and nanoseconds."""
    return time.clock_gettime(((~pid) << 3) | 2)


def _cpu_s(pid: int, tid: int) -> float:
    return int((_task_file(pid, tid, "schedstat").split() or ["0"])[0]) / 1e9


def _task_file(pid: int, tid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/{name}") as file:
            return file.read()
    except OSError:  # the thread ended
        return ""


def phase(url: str, proc: psutil.Process, seconds: float, scrape_every: float) -> dict[str, float]:
    # CPU first, under one scrape every `scrape_every` seconds, then latency from a burst
    # of back-to-back scrapes.
    cpu0, (main0, reader0), t0 = process_cpu_s(proc.pid), thread_cpu(proc), time.monotonic()
    collect = []
    while time.monotonic() - t0 < seconds:
        with urllib.request.urlopen(url, timeout=5) as resp:
            collect.append(metric(resp.read().decode(), "burnrate_agent_collection_duration_seconds") * 1000)
        time.sleep(min(scrape_every, max(0.0, seconds - (time.monotonic() - t0))))
    cpu1, (main1, reader1), elapsed = process_cpu_s(proc.pid), thread_cpu(proc), time.monotonic() - t0
    busy = cpu1 - cpu0
    plain, packed = [], []
    for _ in range(300):
        plain.append(scrape_ms(url, False))
        packed.append(scrape_ms(url, True))
        time.sleep(0.01)
    q = statistics.quantiles
    return {
        "scrape p50 (ms)": statistics.median(plain),
        "scrape p99 (ms)": q(plain, n=100)[98],
        "gzip scrape p99 (ms)": q(packed, n=100)[98],
        "collection (ms)": statistics.median(collect),
        "RSS (MB)": proc.memory_info().rss / 1e6,
        "CPU (% of one core)": 100 * busy / elapsed,
        "  main thread": 100 * (main1 - main0) / elapsed,
        "  telemetry thread": 100 * (reader1 - reader0) / elapsed,
        "  other threads": 100 * (busy - (main1 - main0) - (reader1 - reader0)) / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--scrape-interval", type=float, default=15.0,
                        help="scrape interval of the last phase (default 15 s, the ServiceMonitor's)")
    parser.add_argument("--backend", choices=("simulated", "nvml"), default="simulated",
                        help="8 simulated GPUs (default), or the machine's own through NVML")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="burnrate-bench-")
    sock, port = os.path.join(tmp, "telemetry.sock"), free_port()
    gpus = ["--gpus", "8"] if args.backend == "simulated" else []
    agent = subprocess.Popen([sys.executable, "-m", "burnrate", "agent", "--backend", args.backend, *gpus,
                              "--interval", "1", "--listen", f"127.0.0.1:{port}", "--telemetry-socket", sock],
                             cwd=ROOT, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):
            try:
                scrape_ms(url, False)
                break
            except OSError:
                time.sleep(0.1)
        proc = psutil.Process(agent.pid)
        results = {IDLE: phase(url, proc, args.seconds, 1.0)}
        stop = threading.Event()
        thread = threading.Thread(target=senders, args=(sock, 64, 10.0, stop), daemon=True)
        thread.start()
        time.sleep(3)  # let every rank register
        results[LOADED] = phase(url, proc, args.seconds, 1.0)
        results[LOADED_DEPLOYED] = phase(url, proc, args.seconds, args.scrape_interval)
        stop.set()
        thread.join()
        with urllib.request.urlopen(url) as resp:
            text = resp.read().decode()
        received = metric(text, "burnrate_agent_telemetry_received_total")
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        gpu_count = text.count("burnrate_gpu_up{")
    finally:
        agent.terminate()
        agent.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)

    if gpu_count:
        for columns in results.values():
            columns["collection per GPU (ms)"] = columns["collection (ms)"] / gpu_count
    print(f"burnrate agent: {gpu_count} {'simulated' if args.backend == 'simulated' else 'NVML'} GPU(s), 1 s interval, {args.seconds:.0f} s per phase, "
          f"{os.cpu_count()} CPUs; {series} series; {received:.0f} telemetry messages received; "
          f"'{LOADED_DEPLOYED}' scrapes every {args.scrape_interval:g} s\n")
    columns = list(results)
    widths = [max(len(c), 6) for c in columns]
    print("| measure                | " + " | ".join(f"{c:>{w}}" for c, w in zip(columns, widths)) + " | target | ok |")
    print("|------------------------|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|-------:|----|")
    for name in results[LOADED]:
        target = TARGETS.get(name)
        cells = " | ".join(f"{results[c][name]:>{w}.2f}" for c, w in zip(columns, widths))
        ok = "" if target is None else ", ".join(
            "yes" if results[c][name] <= target else "NO" for c in (LOADED, LOADED_DEPLOYED))
        print(f"| {name:<22} | {cells} | {'' if target is None else f'{target:g}':>6} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
