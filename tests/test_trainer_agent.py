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


def test_trainer_telemetry_reaches_the_agent(tmp_path):
    with agent(tmp_path, "--interval", "0.5") as (url, sock, _):
        env = {**os.environ, "BURNRATE_TELEMETRY_SOCKET": sock, "BURNRATE_TRAINING_JOB": "e2e"}
        done = subprocess.run([PYTHON, "-m", "burnrate", "train", "--nproc", "2", "--steps", "12",
                               "--fault", "straggler:rank=1,factor=2", "--report-every-steps", "2"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        # One datagram that is not JSON: the rejection counter must show it, so that its
        # reading for the trainer's own reports below is a reading, not an absent series.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
            raw.sendto(b"not json", sock)
        # The last reports land in the snapshot after the trainer exits: wait for it.
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
                text = resp.read().decode()
            done = series(text, "burnrate_train_steps_total") == {"0": 12.0, "1": 12.0}
            if done and "burnrate_agent_telemetry_rejected_total{" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert series(text, "burnrate_train_steps_total") == {"0": 12.0, "1": 12.0}
    compute = series(text, "burnrate_train_compute_seconds_total")
    assert compute["1"] >= 1.5 * compute["0"]          # the straggler, as the analyzer will see it
    assert set(series(text, "burnrate_train_world_size").values()) == {2.0}
    rejected = {line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("burnrate_agent_telemetry_rejected_total{")}
    assert rejected == {"malformed": 1.0}      # ours alone: none of the trainer's reports
