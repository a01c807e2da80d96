"""`burnrate agent --collectors` given something other than a counters file: one line,
never a hang (a FIFO blocks open() until a writer comes; /dev/zero never ends)."""
import os
import subprocess

import pytest

from tests.conftest import PYTHON, ROOT


def agent_once(tmp_path, *args):
    # A short timeout: the test fails, rather than waits, where the agent would hang.
    return subprocess.run([PYTHON, "-m", "burnrate", "agent", "--backend", "simulated", "--gpus", "1", "--once",
                           "--telemetry-socket", str(tmp_path / "t.sock"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_anything_but_a_regular_file_is_refused_in_one_line_without_waiting(tmp_path, kind):
    path = {"fifo": str(tmp_path / "counters.csv"), "dev-zero": "/dev/zero"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    proc = agent_once(tmp_path, "--collectors", path)
    assert proc.returncode == 2 and proc.stdout == ""
    says = {"fifo": "a FIFO", "dev-zero": "a character device"}[kind]
    assert proc.stderr.splitlines() == [
        f"burnrate agent: error: {path}: --collectors takes a counters file, not {says}"]


def test_a_file_far_larger_than_any_counters_file_is_refused_unread(tmp_path):
    big = tmp_path / "counters.csv"
    with open(big, "wb") as fh:
        fh.truncate(8 << 20)     # sparse: takes no room
    proc = agent_once(tmp_path, "--collectors", str(big))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"burnrate agent: error: {big}: over 1 MiB, too large for a counters file"]


def test_a_directory_is_one_line(tmp_path):
    proc = agent_once(tmp_path, "--collectors", str(tmp_path))
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"burnrate agent: error: {tmp_path}: cannot read the counters file") and "directory" in line
