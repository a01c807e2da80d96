"""`burnrate demo`: the whole of burnrate on one machine, with nothing else installed.

A simulated fleet (labelled simulated) fills the fleet view, its history written first
and then on in real time, so that it reports beside the live jobs; on top of it the real
agent (NVML where a GPU answers, else simulated GPUs driven by the ranks) records a
real CPU training run of the reference trainer, in three jobs with injected faults:
a straggler rank, a starving loader, and a run that crashes, resumes from its last
checkpoint and then diverges. The dashboard serves the recording while it grows; at the
end the analyzer names what went wrong, and the crashed job's ledger says what the crash
cost (the steps computed again, the restart, the second start-up).

The live jobs last seconds, not hours, so their analysis compresses time: every
detector threshold given in minutes is read as seconds (a straggler must persist
20 s instead of 20 min). The summary, the dashboard and `burnrate analyze` all judge
the whole recording (the simulated fleet and the live jobs) over one window with those
thresholds, so that they show the same findings and dollars; the summary ends with the
`burnrate analyze` command that prints it again from the recording.
Each job's share of `--duration` counts from its first step: how long torch takes to
start varies several-fold with the machine's load, and would eat the evidence.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import webbrowser
from contextlib import ExitStack, suppress
from typing import Callable

from burnrate.exporter.errors import UserError
from burnrate.exporter.lifetime import end_with_parent
from burnrate.exporter.listen import ensure_free


@dataclasses.dataclass(frozen=True)
class Job:
    name: str
    flags: tuple[str, ...]
    share: float
    """Share of --duration it trains for, from its first step."""
    min_steps: int = 0
    """...and it is not stopped before the agent has seen this step: a fault set at a
    step must have happened, however fast or slow the machine steps."""
    crash_at: int = 0
    """Where set, a rank crashes before this step, and the job is launched again at once with
    --resume from its last checkpoint (every CHECKPOINT_EVERY steps)."""


# Late enough for a few seconds of healthy loss first: the detector counts a NaN loss
# only after a finite one, and a spike only against the loss before it.
DIVERGE_AT = 300
# The unstable job also crashes first, well before it diverges: the steps since its last
# checkpoint are computed again after the resume (lost progress in its ledger).
CHECKPOINT_EVERY = 100
CRASH_AT = 290
JOBS = (
    Job("llm-pretrain", ("--fault", "straggler:rank=1,factor=3"), 0.45),
    Job("llm-finetune", ("--fault", "starve:delay=0.08", "--num-workers", "1"), 0.35),
    # At this peak learning rate the x10^4 blow-up overflows to NaN within a few reports, as
    # a real divergence does; at the default peak the loss stays on a high finite plateau,
    # which is a spike against its own recent mean for one report only. It trains on a few
    # reports past the blow-up, so that the NaN has reached the agent.
    Job("llm-unstable", ("--fault", f"diverge:at={DIVERGE_AT}", "--lr", "3e-3"), 0.20, min_steps=DIVERGE_AT + 50,
        crash_at=CRASH_AT),
)
# Enough for the time-compressed detectors: the straggler job trains 18 s, and 4 blocks
# of 5 s need more than 15; the starving one 14 s, which its 10 s centered window turns
# into the 20 s run the detector needs.
MIN_DURATION_S = 40.0
NAMESPACE = "demo"
# The simulated fleet beside the live jobs, and the simulated GPUs of the agent where no GPU answers.
FLEET_NODES, FLEET_GPUS_PER_NODE = 4, 8
LIVE_GPUS = 2
THRESHOLDS = "live-thresholds.yaml"
POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
STARTUP_LIMIT_S = 120.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=120.0, metavar="S",
                   help=f"seconds of live training (default 120; {MIN_DURATION_S:.0f} is enough to see every fault)")
    p.add_argument("--port", type=int, default=8050, help="dashboard port (default 8050)")
    p.add_argument("--agent-port", type=int, default=9400, help="agent /metrics port (default 9400)")
    p.add_argument("--no-browser", action="store_true", help="do not open the dashboard in a browser")
    p.add_argument("--dir", help="where the recording goes (default: a new temporary directory)")


class _Children:
    """What the demo started, stopped together on the way out: the slowest sets the wait,
    not the sum of them (a trainer, the dashboard and the agent each slow on a busy machine)."""

    def __init__(self, stack: ExitStack) -> None:
        self.stack, self.running = stack, []
        stack.callback(lambda: _stop(*self.running))

    def spawn(self, argv: list[str], log: str, env: dict | None = None) -> subprocess.Popen:
        out = open(log, "ab")
        self.stack.callback(out.close)
        # Own process group, so that stopping it stops the ranks the launcher started too; and
        # a parent-death signal, so that nothing outlives a demo killed outright.
        proc = subprocess.Popen([sys.executable, "-m", "burnrate", *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True,
                                preexec_fn=functools.partial(end_with_parent, os.getpid()))
        self.running.append(proc)
        return proc


def _stop(*procs: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM to each one's process group at once, then SIGKILL to whatever outlives `timeout`."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in running:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _steps(agent_url: str, job: str) -> int:
    """The job's step number as the agent last heard it: counted on from the step a resumed
    run started at, where the steps counter of a rank forgotten between runs starts again at 0."""
    try:
        with urllib.request.urlopen(agent_url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return 0
    return max((int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                if line.startswith("burnrate_train_global_step{") and f'training_job="{job}"' in line), default=0)


def _train(children: _Children, job: Job, seconds: float, env: dict, work: str, agent_url: str,
           live_start: float) -> None:
    """Run one job until it has trained `seconds` from its first step and reached
    `job.min_steps`; one that never gets there is stopped after the startup limit and
    twice its time."""
    log = os.path.join(work, f"{job.name}.log")
    # Both launches of a crashed job are one job in one pod, as a restarted PyTorchJob's are.
    env = {**env, "BURNRATE_TRAINING_JOB": job.name, "POD_NAME": f"{job.name}-0"}
    argv = ["train", "--nproc", "2", "--steps", "1000000", "--job-name", job.name, "--report-every-s", "0.5",
            *job.flags]
    if job.crash_at:
        argv += ["--checkpoint-dir", os.path.join(work, f"{job.name}-checkpoints"),
                 "--checkpoint-every-steps", str(CHECKPOINT_EVERY)]
    flags = " ".join(job.flags + (("--fault", f"crash:at={job.crash_at}") if job.crash_at else ()))
    trainer = children.spawn(argv + (["--fault", f"crash:at={job.crash_at}"] if job.crash_at else []), log, env)
    resumed = not job.crash_at
    deadline = time.time() + STARTUP_LIMIT_S + 2 * seconds
    until, printed = None, 0.0
    while True:
        if trainer.poll() is not None:
            if resumed:
                print(f"  {job.name} exited with code {trainer.returncode}: see {log}", flush=True)
                break
            # The crash: launched again at once, from the last checkpoint.
            print(f"  [{time.time() - live_start:5.0f}s] {job.name}: crashed before step {job.crash_at} (exit code "
                  f"{trainer.returncode}); resuming from its last checkpoint", flush=True)
            trainer, resumed = children.spawn(argv + ["--resume"], log, env), True
        now, steps = time.time(), _steps(agent_url, job.name)
        if until is None and steps > 0:
            until = now + seconds
        if now >= deadline or (until is not None and now >= until and steps >= job.min_steps and resumed):
            break
        if now - printed >= PROGRESS_EVERY_S:
            printed = now
            print(f"  [{now - live_start:5.0f}s] {job.name} ({flags}): "
                  + (f"step {steps}" if until else "starting"), flush=True)
        time.sleep(POLL_S)
    _stop(trainer)


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
    if args.duration < MIN_DURATION_S:
        raise UserError(f"--duration must be at least {MIN_DURATION_S:.0f} seconds for the faults to show")
    ensure_free("127.0.0.1", args.port, "--port")
    ensure_free("127.0.0.1", args.agent_port, "--agent-port")
    from burnrate.analyzer.detectors import DetectorConfig
    from burnrate.analyzer.detectors.config_file import dump_detector_config
    from burnrate.analyzer.sources.timeparse import format_time
    from burnrate.simulator.simulate import Simulation, Spec

    # kill, timeout, systemd and container runtimes send SIGTERM, a closed terminal SIGHUP:
    # each stops the demo as Ctrl-C does, with everything it started. Ctrl-C itself too: a
    # shell that starts a command in the background hands it SIGINT ignored, and Python then
    # leaves it ignored.
    for stop_signal in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, _interrupt)
    work = args.dir or tempfile.mkdtemp(prefix="burnrate-demo-")
    recording = os.path.join(work, "recording")
    sock = os.path.join(work, "telemetry.sock")
    start = time.time()
    print(f"burnrate demo: writing to {work}")
    fleet = Spec(nodes=FLEET_NODES, gpus_per_node=FLEET_GPUS_PER_NODE, hours=2.0, end=start)
    simulation = Simulation(recording, fleet)
    simulation.write(fleet.samples)
    print(f"  simulated fleet: {FLEET_NODES} nodes x {FLEET_GPUS_PER_NODE} GPUs, 2 h (labelled simulated), "
          "reporting on beside the live jobs")
    # The dashboard judges the recording as the summary at the end does: thresholds in
    # minutes read as seconds, since the live jobs last seconds.
    thresholds = os.path.join(work, THRESHOLDS)
    with open(thresholds, "w", encoding="utf-8") as fh:
        fh.write(dump_detector_config(live_config(DetectorConfig())))

    try:
        agent_url = f"http://127.0.0.1:{args.agent_port}/metrics"
        with ExitStack() as stack:
            children = _Children(stack)
            stop_fleet = _follow(stack, simulation)
            children.spawn(["agent", "--gpus", str(LIVE_GPUS), "--listen", f"127.0.0.1:{args.agent_port}",
                            "--node", "demo-node", "--telemetry-socket", sock, "--record", recording,
                            "--forget-after", "5"],
                           os.path.join(work, "agent.log"))
            # It opens where the live jobs are: their findings, from just before they started. The
            # fleet's last two samples of history are in it: a GPU's samples stand for their
            # interval, and so count it as reporting, only where the window holds two of them.
            opens = fleet.start_end()[1] - fleet.step_s
            dashboard_url = f"http://127.0.0.1:{args.port}/findings?start={format_time(opens)}&namespace={NAMESPACE}"
            children.spawn(["dashboard", "--recording", recording, "--listen", f"127.0.0.1:{args.port}",
                            "--detector-config", thresholds], os.path.join(work, "dashboard.log"))
            print(f"  agent:     {agent_url}\n  dashboard: {dashboard_url}\n"
                  f"             (live jobs; thresholds in minutes read as seconds, see {thresholds})\n")
            # Only with a screen: without one, webbrowser may start a console browser that takes the terminal.
            if not args.no_browser and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                                        or sys.platform == "darwin"):
                webbrowser.open(dashboard_url)
            env = {**os.environ, "BURNRATE_TELEMETRY_SOCKET": sock, "POD_NAMESPACE": NAMESPACE}
            live_start = time.time()
            for job in JOBS:
                _train(children, job, args.duration * job.share, env, work, agent_url, live_start)
            time.sleep(3.0)  # the agent's last samples
            # The window ends while the agent still reports, a whole second inside its samples
            # and within the interval of the fleet's last: both are reporting at its end.
            stop_fleet()
            end = math.floor(time.time()) - 1
    except KeyboardInterrupt:
        # The children are stopped; what they recorded is kept.
        print(f"\nburnrate demo: stopped\n{_replay(recording, thresholds)}")
        return 130
    # Whole seconds, as the command prints them: from the fleet's first sample to the end of the live part.
    window = (fleet.start_end()[0], end)
    summarize(recording, thresholds, window, work, args.port)
    return 0


def _follow(stack: ExitStack, simulation) -> Callable[[], None]:
    """The simulated fleet written on in real time beside the live jobs, so that the whole
    fleet reports while they run; returns what stops it, also done on the way out."""
    stop = threading.Event()
    writer = threading.Thread(target=simulation.follow, args=(stop,), name="simulated-fleet", daemon=True)
    stack.callback(simulation.close)
    writer.start()

    def halt() -> None:
        stop.set()
        writer.join()
    stack.callback(halt)
    return halt


def summarize(recording: str, thresholds: str, window: tuple[float, float], work: str, port: int) -> None:
    """The analysis of the recording over `window` with the demo's thresholds, as the table
    `burnrate analyze` prints, then the crashed job's ledger, the figures the dashboard's
    Fleet page shows, and the commands that show them again; its JSON goes to analysis.json."""
    from burnrate.analyzer.costing.cost import jobs_dollars, wasted_dollars
    from burnrate.analyzer.detectors.config_file import load_detector_config
    from burnrate.analyzer.costing.pricing import load_catalog
    from burnrate.analyzer.output.report import analyze, render_json, render_table
    from burnrate.analyzer.sources.recording import RecordingSource
    from burnrate.analyzer.sources.timeparse import format_time, resolve_window
    from burnrate.analyzer.grid.views import ANALYSIS_COLUMNS

    start, end = format_time(window[0]), format_time(window[1])
    # The window as the command reads it back, so that the two cannot differ.
    frames = RecordingSource(recording).frames(resolve_window(start=start, end=end), ANALYSIS_COLUMNS)
    report = analyze(frames, load_catalog(None), load_detector_config(thresholds))
    with open(os.path.join(work, "analysis.json"), "w", encoding="utf-8") as fh:
        fh.write(render_json(report))
    print(f"\n=== the recording: simulated fleet and live jobs, {start} to {end}, thresholds in minutes "
          "read as seconds ===\n")
    print(render_table(report))
    for job in JOBS:
        if job.crash_at:
            print(ledger_summary(report, f"{NAMESPACE}/{job.name}"))
    print(f"\nin all: {len(report.findings)} findings, ${wasted_dollars(report.findings):,.2f} wasted, of "
          f"${jobs_dollars(report.jobs):,.2f} the jobs cost (the dashboard's Fleet and Jobs pages over this window)")
    command = _command()
    print(f"reproduce: {command} analyze --recording {recording} --detector-config {thresholds} "
          f"--start {start} --end {end}")
    print(_replay(recording, thresholds) + f"\n           then http://127.0.0.1:{port}/?start={start}&end={end}")


def ledger_summary(report, job: str, worst: int = 5) -> str:
    """Two lines: the job's runs, goodput and cost, then its largest badput categories in dollars."""
    from burnrate.exporter.ledger import BADPUT

    found = [j for j in report.jobs if f"{j.namespace}/{j.training_job}" == job and j.ledger is not None]
    if not found:
        return f"ledger of {job}: none (it sent no training telemetry while it held GPUs)"
    j = found[0]
    hours, runs = j.ledger.gpu_hours, j.ledger.runs

    def money(h: float) -> str:
        dollars = j.ledger_dollars(h)
        return f"{h * 3600:.1f} GPU-s" if dollars is None else f"${dollars:.4f}"

    resumes = ", ".join(f"resumed from step {r.resumed_from}" for r in runs[1:] if r.resumed_from is not None)
    head = f"ledger of {job}: {len(runs)} run{'s' if len(runs) != 1 else ''}" + (f" ({resumes})" if resumes else "")
    if j.goodput is not None:
        head += f", goodput {j.goodput:.1%} of {money(j.gpu_hours)}"
    bad = sorted((n for n in BADPUT if hours[n]), key=lambda n: -hours[n])[:worst]
    return head + "\n  largest badput: " + (", ".join(f"{n} {money(hours[n])}" for n in bad) or "none")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _command() -> str:
    """`burnrate`, runnable as printed: the venv's own when the venv is not activated."""
    command, beside = "burnrate", os.path.join(os.path.dirname(sys.executable), "burnrate")
    if shutil.which("burnrate") is None and os.path.exists(beside):
        relative = os.path.relpath(beside)
        command = beside if relative.startswith("..") else relative
    return command


def _replay(recording: str, thresholds: str) -> str:
    """Where the recording is and the command that opens it again with the demo's thresholds."""
    return (f"recording: {recording}\n"
            f"replay:    {_command()} dashboard --recording {recording} --detector-config {thresholds}")
