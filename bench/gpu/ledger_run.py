"""A training job's ledger on this machine's first GPU, against what its processes did.

With `attribution="kubelet"` the job's pod holds the GPU from before its trainer starts until
the end, as in Kubernetes: a stand-in kubelet (tests/kubelet_standin.py) tells a real `burnrate
agent --backend nvml --attribution kubelet --record` so. With "local" no pod exists: the agent
holds the GPU for the rank whose monitor speaks to it (`--attribution local`), from the
monitor's first message. The reference trainer (gpt2-124m, bf16, torch.compile)
saves every EVERY steps, crashes before step CRASH and, PAUSE_S later, is resumed from its
last checkpoint to STEPS. `burnrate analyze --recording` then prices the job, and each category
is set beside the trainer's own records (its --telemetry-jsonl) and the launches' stamps.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from contextlib import nullcontext
from typing import Callable

# Without the Kubernetes API the agent names a pod's job after the pod: one name for both.
NAMESPACE, POD = "ml", "gpt2-ledger"
JOB = POD
STEPS, EVERY, CRASH = 1200, 400, 1001
RESUMED = (CRASH - 1) // EVERY * EVERY
PAUSE_S = 20.0          # crash to resume: the pod keeps its GPU meanwhile, as while its container restarts
INTERVAL_S = 1.0        # the agent's sampling interval: each edge is known to one sample


def measure(root: str, keep: Callable[[str, str | bytes], None], attribution: str = "kubelet") -> list[str]:
    from tests.conftest import free_port
    from tests.kubelet_standin import serving

    pod = attribution == "kubelet"
    keep_as = keep if pod else (lambda name, data: keep(name.replace("ledger-", "ledger-local-", 1), data))
    kubelet_or_none = serving() if pod else nullcontext()
    with tempfile.TemporaryDirectory(prefix="burnrate-gpu-ledger-") as tmp, kubelet_or_none as kubelet:
        sock, recording, port = os.path.join(tmp, "t.sock"), os.path.join(tmp, "recording"), free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        jsonl = os.path.join(tmp, "trainer.jsonl")
        stamps: dict[str, float] = {}
        with open(os.path.join(tmp, "agent.log"), "wb") as log:
            where = ["--kubelet-socket", kubelet.socket, "--refresh", "0.5"] if pod else []
            agent = subprocess.Popen(
                [sys.executable, "-m", "burnrate", "agent", "--backend", "nvml", "--attribution", attribution,
                 *where, "--interval", f"{INTERVAL_S:g}",
                 "--record", recording, "--listen", f"127.0.0.1:{port}", "--telemetry-socket", sock],
                cwd=root, stdout=log, stderr=subprocess.STDOUT)
            try:
                uuid = _wait(lambda: next(iter(_labels(metrics, "DCGM_FI_DEV_GPU_UTIL", "UUID")), None))
                if pod:
                    kubelet.hold(NAMESPACE, POD, [uuid])
                    _wait(lambda: POD in _labels(metrics, "DCGM_FI_DEV_GPU_UTIL", "pod"))
                    stamps["held"] = time.time()
                env = {**os.environ, "BURNRATE_TELEMETRY_SOCKET": sock, "BURNRATE_TRAINING_JOB": JOB,
                       "POD_NAME": POD, "POD_NAMESPACE": NAMESPACE, "CUDA_VISIBLE_DEVICES": uuid, "TMPDIR": tmp}
                for run, extra in (("run1", ("--fault", f"crash:at={CRASH}")), ("run2", ("--resume",))):
                    if run == "run2":
                        time.sleep(PAUSE_S)
                    stamps[f"{run}-start"] = time.time()
                    done = subprocess.run(
                        [sys.executable, "-m", "burnrate", "train", "--nproc", "1", "--device", "cuda", "--model",
                         "gpt2-124m", "--batch-size", "16", "--steps", str(STEPS), "--checkpoint-dir",
                         os.path.join(tmp, "ck"), "--checkpoint-every-steps", str(EVERY), "--telemetry-jsonl", jsonl,
                         *extra], cwd=root, env=env, capture_output=True, text=True, timeout=300)
                    stamps[f"{run}-exit"] = time.time()
                    keep_as(f"ledger-{run}.log", done.stdout + done.stderr)
                time.sleep(2 * INTERVAL_S)      # the last reports sampled and recorded
            finally:
                agent.terminate()
                agent.wait(timeout=30)
        analyzed = subprocess.run([sys.executable, "-m", "burnrate", "analyze", "--recording", recording,
                                   "--format", "json"], cwd=root, capture_output=True, text=True, timeout=300)
        if analyzed.returncode != 0:
            return [f"`burnrate analyze` failed: {(analyzed.stderr.strip().splitlines() or ['?'])[-1]}"]
        with open(jsonl) as fh:
            text = fh.read()
        keep_as("ledger-trainer.jsonl", text)
        keep_as("ledger-times.txt", "".join(f"{name} {t:.6f}\n" for name, t in stamps.items()))
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w:gz") as tar:
            tar.add(recording, arcname="recording")
        keep_as("ledger-recording.tgz", packed.getvalue())
    (job,) = [j for j in json.loads(analyzed.stdout)["jobs"] if j["training_job"] == JOB]
    return rows(job, [json.loads(line) for line in text.splitlines()], stamps)


def rows(job: dict, records: list[dict], stamps: dict[str, float]) -> list[str]:
    """Each category in GPU-seconds beside what the trainer's records and the stamps give."""
    one = [r for r in records if r["resumed_from"] == 0]
    two = [r for r in records if r["resumed_from"] == RESUMED]
    first1, first2 = one[0], two[0]
    last1 = max(r["time"] for r in one if r["steps"])
    truth = {
        # No pod (local attribution): run 1 from its process's start, as run 2.
        "startup": (first1["time"] - first1["step_s"] - stamps.get("held", first1["start_time"]),
                    first2["time"] - first2["step_s"] - first2["start_time"]),
        "restart": first2["start_time"] - last1,
        "lost_progress": sum(r["step_s"] for r in one if r["step"] > RESUMED),
        "checkpoint": sum(r["checkpoint_s"] for r in records),
    }
    held_from = "the pod's hold" if "held" in stamps else "its process start"
    basis = {
        "startup": f"run 1: {held_from} to its first step's start; run 2: its process start to its first step's start",
        "restart": "run 1's last report to run 2's process start",
        "lost_progress": f"the step time of run 1's steps after {RESUMED}, computed again",
        "checkpoint": "the saves the monitor timed",
    }
    got = {name: (v["gpu_hours"] * 3600 if v else None) for name, v in job["ledger"].items()}
    runs = [{name: h * 3600 for name, h in r["ledger"].items() if h is not None} for r in job["runs"]]
    lines = [f"Job: {job['gpu_hours'] * 3600:,.1f} GPU-seconds held, ${job['cost_dollars']:,.4f}, goodput "
             f"{job['goodput']:.1%}, {len(job['runs'])} runs (resumed from {[r['resumed_from'] for r in job['runs']]}); "
             f"ledger_basis {job['ledger_basis'] or '{}'}; first step of run 1: {first1['step_s']:.1f} s "
             f"(torch.compile), of run 2: {first2['step_s']:.1f} s", "",
             "| category | analyzer (s) | the processes (s) | basis |", "|---|---:|---:|---|"]
    for name, value in got.items():
        if name == "startup":
            shown = " + ".join(f"{r.get('startup', 0.0):.1f}" for r in runs)
            lines.append(f"| startup | {shown} | {truth['startup'][0]:.1f} + {truth['startup'][1]:.1f} | "
                         f"{basis['startup']} |")
        elif name in truth:
            lines.append(f"| {name} | {value:.1f} | {truth[name]:.1f} | {basis[name]} |")
        else:
            lines.append(f"| {name} | {'null' if value is None else f'{value:.1f}'} | | |")
    return lines


def _labels(url: str, family: str, label: str) -> list[str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    key = f'{label}="'
    return [line.split(key, 1)[1].split('"', 1)[0] for line in text.splitlines()
            if line.startswith(family + "{") and key in line]


def _wait(found: Callable[[], object], timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = found()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("the agent did not serve the GPU held by the pod in time")
        time.sleep(0.25)
