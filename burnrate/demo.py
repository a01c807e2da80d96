"""`burnrate demo`: the whole of burnrate on one machine, with nothing else installed.

A simulated fleet (labelled simulated) fills the fleet view; on top of it the real
agent (NVML where a GPU answers, else simulated GPUs driven by the ranks) records a
real CPU training run of the reference trainer, in three jobs with injected faults:
a straggler rank, a starving loader, and a run that diverges. The dashboard serves
the recording while it grows; at the end the analyzer names what went wrong.

The live jobs last seconds, not hours, so their analysis compresses time: every
detector threshold given in minutes is read as seconds (a straggler must persist
20 s instead of 20 min). The simulated fleet is analyzed with the real defaults.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import webbrowser
from contextlib import ExitStack

from .cli import UserError

# (job, fault flags, share of the duration)
JOBS = (
    ("llm-pretrain", ("--fault", "straggler:rank=1,factor=3"), 0.40),
    ("llm-finetune", ("--fault", "starve:delay=0.08", "--num-workers", "1"), 0.35),
    ("llm-unstable", ("--fault", "diverge:at=40"), 0.25),
)
NAMESPACE = "demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=120.0, metavar="S",
                   help="seconds of live training (default 120; 60 is enough to see every fault)")
    p.add_argument("--port", type=int, default=8050, help="dashboard port (default 8050)")
    p.add_argument("--agent-port", type=int, default=9400, help="agent /metrics port (default 9400)")
    p.add_argument("--no-browser", action="store_true", help="do not open the dashboard in a browser")
    p.add_argument("--dir", help="where the recording goes (default: a new temporary directory)")


def _check_port(port: int, flag: str) -> None:
    with socket.socket() as s:
        # as the servers do: a port left in TIME_WAIT by an earlier run is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise UserError(f"port {port} is in use (another demo or dcgm-exporter?): pass {flag} PORT") from None


def _spawn(stack: ExitStack, argv: list[str], log: str, env: dict | None = None) -> subprocess.Popen:
    out = open(log, "ab")
    stack.callback(out.close)
    # Own process group, so that stopping it stops the ranks the launcher started too.
    proc = subprocess.Popen([sys.executable, "-m", "burnrate", *argv], stdout=out, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    stack.callback(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _steps(agent_url: str, job: str) -> int:
    try:
        with urllib.request.urlopen(agent_url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return 0
    return max((int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                if line.startswith("burnrate_train_steps_total{") and f'training_job="{job}"' in line), default=0)


def live_config(config):
    """Every `*_minutes` threshold of every detector read as seconds. MFU is not judged
    for CPU runs: there it is measured against an estimated peak, not a GPU's."""
    def scale(sub):
        return dataclasses.replace(sub, **{f.name: getattr(sub, f.name) / 60.0
                                           for f in dataclasses.fields(sub) if f.name.endswith("_minutes")})
    config = dataclasses.replace(config, **{f.name: scale(getattr(config, f.name))
                                            for f in dataclasses.fields(config)})
    return dataclasses.replace(config, low_mfu=dataclasses.replace(config.low_mfu, floor=0.0, critical_floor=0.0))


def run(args: argparse.Namespace) -> int:
    if args.duration < 30:
        raise UserError("--duration must be at least 30 seconds for the faults to show")
    _check_port(args.port, "--port")
    _check_port(args.agent_port, "--agent-port")
    from analyzer.detectors import DetectorConfig
    from analyzer.frames import Window
    from analyzer.pricing import load_catalog
    from analyzer.report import analyze, render_table
    from analyzer.simulate import Spec, simulate
    from analyzer.sources.recording import RecordingSource

    work = args.dir or tempfile.mkdtemp(prefix="burnrate-demo-")
    recording = os.path.join(work, "recording")
    sock = os.path.join(work, "telemetry.sock")
    start = time.time()
    print(f"burnrate demo: writing to {work}")
    simulate(recording, Spec(nodes=4, gpus_per_node=8, hours=2.0, end=start))
    print("  simulated fleet: 4 nodes x 8 GPUs, 2 h (labelled simulated)")

    agent_url = f"http://127.0.0.1:{args.agent_port}/metrics"
    with ExitStack() as stack:
        _spawn(stack, ["agent", "--gpus", "2", "--listen", f"127.0.0.1:{args.agent_port}", "--node", "demo-node",
                       "--telemetry-socket", sock, "--record", recording, "--forget-after", "5"],
               os.path.join(work, "agent.log"))
        dashboard_url = f"http://127.0.0.1:{args.port}/"
        _spawn(stack, ["dashboard", "--recording", recording, "--listen", f"127.0.0.1:{args.port}"],
               os.path.join(work, "dashboard.log"))
        print(f"  agent:     {agent_url}\n  dashboard: {dashboard_url}\n")
        # Only with a screen: without one, webbrowser may start a console browser that takes the terminal.
        if not args.no_browser and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                                    or sys.platform == "darwin"):
            webbrowser.open(dashboard_url)
        env = {**os.environ, "BURNRATE_TELEMETRY_SOCKET": sock, "POD_NAMESPACE": NAMESPACE}
        live_start = time.time()
        for job, flags, share in JOBS:
            env.update(BURNRATE_TRAINING_JOB=job, POD_NAME=f"{job}-0")
            trainer = _spawn(stack, ["train", "--nproc", "2", "--steps", "1000000", "--job-name", job,
                                     "--report-every-s", "0.5", *flags], os.path.join(work, f"{job}.log"), env)
            until = time.time() + args.duration * share
            while time.time() < until and trainer.poll() is None:
                time.sleep(min(5.0, max(0.0, until - time.time())))
                print(f"  [{time.time() - live_start:5.0f}s/{args.duration:.0f}s] {job} ({' '.join(flags)}): "
                      f"step {_steps(agent_url, job)}", flush=True)
            _stop(trainer)
        time.sleep(2.0)  # the agent's last samples
    end = time.time()

    catalog = load_catalog(None)
    source = RecordingSource(recording)
    live = analyze(source.frames(Window(live_start, end)), catalog, live_config(DetectorConfig()))
    fleet = analyze(source.frames(Window(start - 2 * 3600, start)), catalog)
    print("\n=== live training on this machine (time-compressed thresholds) ===\n")
    print(render_table(live))
    print("=== simulated fleet ===\n")
    print(render_table(fleet))
    print(f"recording: {recording}\nreplay: burnrate dashboard --recording {recording}")
    return 0
