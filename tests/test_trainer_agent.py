"""Telemetry from a real 2-rank `burnrate train` reaches a real `burnrate agent` over its socket."""
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import PYTHON, ROOT
from tests.processes import agent

pytestmark = pytest.mark.slow


def series(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            rank = line.split('rank="')[1].split('"')[0]
            out[rank] = float(line.rsplit(" ", 1)[1])
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_trainer_telemetry_reaches_the_agent(tmp_path):
    """Every step arrives; the straggler's compute, taken past both ranks' warm-up (the first
    steps' one-off costs are the same on both ranks and would hide the ratio), is twice the
    other's. On failure the trainer's output and the agent's log are shown."""
    steps = 40
    with agent(tmp_path, "--interval", "0.2") as (url, sock, _):
        env = {**os.environ, "BURNRATE_TELEMETRY_SOCKET": sock, "BURNRATE_TRAINING_JOB": "e2e",
               "TMPDIR": os.path.dirname(sock)}   # what a launcher killed on failure leaves stays in tmp_path
        trainer = subprocess.Popen([PYTHON, "-m", "burnrate", "train", "--nproc", "2", "--steps", str(steps),
                                    "--fault", "straggler:rank=1,factor=2", "--report-every-steps", "2"],
                                   cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        warm = None
        while trainer.poll() is None:
            text = scrape(url)
            done = series(text, "burnrate_train_steps_total")
            if warm is None and len(done) == 2 and min(done.values()) >= 6:
                warm = series(text, "burnrate_train_compute_seconds_total"), done
            time.sleep(0.05)
        output = trainer.stdout.read()
        why = lambda: output[-3000:] + "\n--- agent ---\n" + (tmp_path / "agent.log").read_text()[-3000:]  # noqa: E731
        assert trainer.returncode == 0, why()
        # One datagram that is not JSON: the rejection counter must show it, so that its
        # reading for the trainer's own reports below is a reading, not an absent series.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
            raw.sendto(b"not json", sock)
        # The last reports land in the snapshot after the trainer exits: wait for it.
        deadline = time.monotonic() + 10
        while True:
            text = scrape(url)
            arrived = series(text, "burnrate_train_steps_total") == {"0": steps, "1": steps}
            if arrived and "burnrate_agent_telemetry_rejected_total{" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert series(text, "burnrate_train_steps_total") == {"0": steps, "1": steps}, why()
    assert warm is not None, "the agent never showed both ranks past step 6 while they trained\n" + why()
    (compute_then, steps_then), compute = warm, series(text, "burnrate_train_compute_seconds_total")
    own = {rank: (compute[rank] - compute_then[rank]) / (steps - steps_then[rank]) for rank in ("0", "1")}
    assert own["1"] >= 1.5 * own["0"], own              # the straggler, as the analyzer will see it
    assert set(series(text, "burnrate_train_world_size").values()) == {2.0}
    rejected = {line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("burnrate_agent_telemetry_rejected_total{")}
    assert rejected == {"malformed": 1.0}      # ours alone: none of the trainer's reports
