"""A training loop that hangs reads as a hang, not as a process gone, everywhere it is read.

A user's own loop (the README's five lines, with `burnrate.monitor`) steps, then blocks for
good, as a rank stuck in a collective does; it reports to a real `burnrate agent`, which
records, with its ranks forgotten after 3 s of silence. The GPU stays with the hung process
(local attribution: the process still runs). While the loop is hung its monitor's keep-alives
keep the rank: the agent still exports it, its steps and last step unchanged, long after it
would have forgotten a silent one, and the time it was last heard moves on with them;
`burnrate analyze` over the recording books the hang as
`stalled`, as its `stalled` finding calls it, and nothing as `no_process`. Once the process is
killed the keep-alives stop, the time it was last heard stays, and the agent forgets the rank.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import PYTHON, ROOT
from tests.processes import agent

pytestmark = pytest.mark.slow

JOB, INTERVAL_S, FORGET_AFTER_S, KEEPALIVE_S = "hung-loop", 0.5, 3.0, 0.5
HANG_AT, HANG_S = 40, 8.0
LOOP = f"""
import time
from burnrate.monitor import Monitor
with Monitor(seq_len=8, every_s=0.25, keepalive_s={KEEPALIVE_S}) as mon:
    for step in range(10**9):
        if step == {HANG_AT}:
            print("hung", flush=True)
            while True:             # stuck, as in a collective that never completes
                time.sleep(0.1)
        with mon.compute():
            time.sleep(0.05)
        mon.step(samples=2)
"""
# Thresholds in minutes read as seconds, as the demo's: a stall is 5 usual steps, or 1 s.
THRESHOLDS = "stalled: {interval_factor: 5.0, floor_minutes: 0.0167}\n"
# The analysis' finest grid step: a recording's edges are known to it, not to the agent's interval
# (a sample at 0.02 s past a bin's start, the window closing 0.46 s into the last bin, held
# nothing of that bin: 1.46 s short of the hang, on a loaded machine where the agent sampled
# every second).
GRID_S = 1.0


def exported(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + "{") and f'training_job="{JOB}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(condition, timeout: float, why) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(why())
        time.sleep(0.1)


def test_a_hung_loop_stays_a_live_rank_and_its_hang_is_stalled_time(tmp_path):
    recording = tmp_path / "recording"
    (tmp_path / "thresholds.yaml").write_text(THRESHOLDS)
    env = {**os.environ, "BURNRATE_TRAINING_JOB": JOB, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    with agent(tmp_path, "--interval", str(INTERVAL_S), "--forget-after", str(FORGET_AFTER_S),
               "--record", str(recording)) as (url, sock, _):
        began = time.time()
        loop = subprocess.Popen([PYTHON, "-c", LOOP], cwd=ROOT, env={**env, "BURNRATE_TELEMETRY_SOCKET": sock},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            def why() -> str:
                return "--- agent ---\n" + (tmp_path / "agent.log").read_text()[-3000:]

            assert loop.stdout.readline().strip() == "hung", loop.stdout.read()[-3000:]
            hung_at = time.time()
            wait_for(lambda: exported(url, "burnrate_train_steps_total") == HANG_AT, 10, why)
            last_step = exported(url, "burnrate_train_last_step_timestamp_seconds")
            time.sleep(HANG_S)
            # Silent for HANG_S, more than twice the agent's forget-after: kept, and unchanged.
            assert exported(url, "burnrate_train_steps_total") == HANG_AT, why()
            assert exported(url, "burnrate_train_last_step_timestamp_seconds") == last_step <= hung_at
            end = time.time()
            # ...while the time the agent last heard the rank moves with the keep-alives.
            heard = exported(url, "burnrate_train_last_report_timestamp_seconds")
            assert end - KEEPALIVE_S - 2 * INTERVAL_S - 0.5 <= heard <= end, (heard, end)
            time.sleep(2 * INTERVAL_S)      # the samples up to `end` are written
            analyzed = subprocess.run([PYTHON, "-m", "burnrate", "analyze", "--recording", str(recording),
                                       "--start", repr(began - 5), "--end", repr(end), "--detector-config", str(tmp_path / "thresholds.yaml"),
                                       "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert analyzed.returncode == 0, analyzed.stderr[-3000:]
        finally:
            loop.send_signal(signal.SIGKILL)
            loop.wait()
            loop.stdout.close()
        killed = time.time()
        time.sleep(3 * INTERVAL_S)
        # Dead, the process sends nothing more: the time it was last heard stays where it died...
        assert exported(url, "burnrate_train_last_report_timestamp_seconds") <= killed, why()
        # ...and it is forgotten after forget-after.
        wait_for(lambda: exported(url, "burnrate_train_steps_total") is None, FORGET_AFTER_S + 5, why)
    doc = json.loads(analyzed.stdout)
    (job,) = [j for j in doc["jobs"] if j["training_job"] == JOB]
    ledger = {name: figure["gpu_hours"] * 3600 for name, figure in job["ledger"].items() if figure is not None}
    hang_s = end - last_step
    # The hang, to a grid step either side (its last step and the window's end), and one usual step.
    assert ledger["stalled"] == pytest.approx(hang_s, abs=2 * GRID_S + 0.1), (ledger, hang_s)
    assert ledger["no_process"] == 0.0, ledger
    (stalled,) = [f for f in doc["findings"] if f["kind"] == "stalled" and f["training_job"] == JOB]
    # Both to a sample at each end; the document rounds to 1e-4 GPU-hours (0.36 s).
    assert stalled["wasted_gpu_hours"] * 3600 == pytest.approx(ledger["stalled"], abs=2 * INTERVAL_S + 0.36), stalled
