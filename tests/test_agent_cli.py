"""`burnrate agent` as a user runs it: --once, clear one-line errors, clean shutdown."""
import os
import signal
import socket
import stat
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT
from tests.processes import agent


def burnrate(*args, timeout=60):
    return subprocess.run([PYTHON, "-m", "burnrate", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_once_prints_one_exposition(tmp_path):
    proc = burnrate("agent", "--backend", "simulated", "--gpus", "4", "--once",
                    "--telemetry-socket", str(tmp_path / "t.sock"))
    assert proc.returncode == 0, proc.stderr
    util = [line for line in proc.stdout.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert len(util) == 4
    assert "burnrate_node_info{" in proc.stdout


def test_once_drains_pending_telemetry(tmp_path):
    """Datagrams queued before the sample are in the exposition."""
    import threading
    import time

    from burnrate.exporter.telemetry import TelemetrySink

    sock = tmp_path / "t.sock"
    result = {}
    thread = threading.Thread(target=lambda: result.update(proc=burnrate(
        "agent", "--backend", "simulated", "--gpus", "2", "--once", "--telemetry-socket", str(sock))))
    thread.start()
    deadline = time.monotonic() + 20
    message = {"v": 1, "training_job": "j", "namespace": "ml", "pod": "p", "rank": 0, "world_size": 1,
               "step": 5, "time": time.time(), "steps": 5, "step_s": 1.0, "data_wait_s": 0.1,
               "compute_s": 0.8, "samples": 5, "tokens": 500, "flops": 1e9, "loss": 2.0, "grad_norm": 1.0,
               "mfu": 0.1}
    with TelemetrySink(sock) as sink:
        while time.monotonic() < deadline and not sink.send(message):
            time.sleep(0.005)
    thread.join(60)
    out = result["proc"].stdout
    assert 'burnrate_train_steps_total{Hostname=' in out
    assert 'training_job="j"} 5' in out


def test_bad_listen_is_one_line():
    proc = burnrate("agent", "--backend", "simulated", "--listen", "nowhere")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "burnrate agent: error: --listen wants HOST:PORT, got 'nowhere'"


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = burnrate("agent", "--backend", "simulated", "--listen", f"127.0.0.1:{port}",
                        "--telemetry-socket", str(tmp_path / "t.sock"))
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"burnrate agent: error: cannot listen on 127.0.0.1:{port}") and "Traceback" not in proc.stderr


def test_nvml_backend_without_a_gpu_is_one_line(tmp_path):
    proc = burnrate("agent", "--backend", "nvml", "--once", "--telemetry-socket", str(tmp_path / "t.sock"))
    if proc.returncode == 0:  # a machine with a GPU: the real reader answered
        assert "DCGM_FI_DEV_GPU_UTIL{" in proc.stdout
        return
    assert proc.returncode == 2 and "NVML is not available" in proc.stderr and "Traceback" not in proc.stderr


def test_sigterm_stops_cleanly(tmp_path):
    with agent(tmp_path) as (_, sock, proc):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert not (tmp_path / "telemetry.sock").exists()


def test_version_is_the_installed_distributions():
    from importlib.metadata import version
    done = burnrate("--version")
    assert done.returncode == 0 and done.stdout == f"burnrate {version('burnrate')}\n"


def _health(base: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()


def test_a_second_agent_on_the_same_socket_is_refused(tmp_path):
    """It used to take the socket over and delete it on exit, leaving the first agent
    answering /healthz 200 while it received nothing."""
    with agent(tmp_path) as (base, sock, _):
        second = burnrate("agent", "--backend", "simulated", "--gpus", "1", "--listen", "127.0.0.1:0",
                          "--telemetry-socket", sock, "--once")
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert second.stderr.strip().splitlines() == [
            f"burnrate agent: error: cannot open the telemetry socket {sock}: another agent is receiving on it "
            f"(it holds {sock}.lock) (pick another with --telemetry-socket PATH, or '' to disable)"]
        assert os.path.exists(sock) and _health(base) == (200, "ok")
        os.unlink(sock)         # removed under it, as the second agent used to on its way out
        assert _health(base) == (503, f"the telemetry socket {sock} was removed or replaced")


# Run as another user, an interpreter that user may run (the test's own may live under a
# private home); the system's has the standard library, all these processes need.
SYSTEM_PYTHON = "/usr/bin/python3"
# A process that opens every file in a directory for reading and holds a lock on each.
HOLD_EVERYTHING = ("import fcntl,os,sys\nheld=[]\n"
                   "for name in os.listdir(sys.argv[1]):\n"
                   "    fd=os.open(os.path.join(sys.argv[1],name),os.O_RDONLY)\n"
                   "    fcntl.flock(fd,fcntl.LOCK_EX|fcntl.LOCK_NB); held.append(fd)\n"
                   "print('held',len(held),flush=True); sys.stdin.read()\n")


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root, to run the pod's process as another user, and a system Python")
def test_no_process_that_can_read_the_socket_directory_keeps_the_agent_from_starting():
    """A pod mounts the socket's directory (read-only is enough to open its files, and
    reading is enough to hold a lock). It used to hold the agent's lock there, and every
    agent start then ended "another agent is receiving on it". Stood in: the pod is a
    process of user nobody, reading the directory as its mount would let it; the agent runs
    as the DaemonSet runs it, its lock in a directory of its own."""
    with tempfile.TemporaryDirectory(prefix="br-", dir="/tmp") as d:
        os.chmod(d, 0o755)
        shared, own = Path(d) / "burnrate", Path(d) / "burnrate-agent"
        shared.mkdir(mode=0o755)
        (shared / "telemetry.sock.lock").touch(mode=0o644)  # where agents before this one kept it
        pod = subprocess.Popen([SYSTEM_PYTHON, "-c", HOLD_EVERYTHING, str(shared)], user=65534, group=65534,
                               extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert pod.stdout.readline().strip() == "held 1"
            sock = str(shared / "telemetry.sock")
            started = burnrate("agent", "--backend", "simulated", "--gpus", "1", "--once",
                               "--telemetry-socket", sock, "--telemetry-lock", str(own / "telemetry.lock"))
            assert started.returncode == 0, started.stderr
            assert stat.S_IMODE(os.stat(own / "telemetry.lock").st_mode) == 0o600
            # The lock where it used to be: the pod keeps the agent out.
            kept_out = burnrate("agent", "--backend", "simulated", "--gpus", "1", "--once", "--telemetry-socket", sock)
            assert kept_out.returncode == 2 and "another agent is receiving on it" in kept_out.stderr
        finally:
            pod.stdin.close()
            pod.wait(timeout=10)
            pod.stdout.close()


def test_with_pods_a_lock_in_the_socket_directory_is_warned_of(tmp_path):
    sock = tmp_path / "shared" / "t.sock"
    proc = burnrate("agent", "--backend", "simulated", "--gpus", "1", "--once", "--telemetry-socket", str(sock),
                    "--attribution", "kubelet", "--kubelet-socket", str(tmp_path / "no-kubelet.sock"))
    assert proc.returncode == 0, proc.stderr
    assert (f"the telemetry lock {sock}.lock is in the socket's directory, which training pods mount: any of them "
            "can hold it and keep the agent from starting (--telemetry-lock PATH elsewhere)") in proc.stderr
    elsewhere = burnrate("agent", "--backend", "simulated", "--gpus", "1", "--once", "--telemetry-socket", str(sock),
                         "--attribution", "kubelet", "--kubelet-socket", str(tmp_path / "no-kubelet.sock"),
                         "--telemetry-lock", str(tmp_path / "own" / "t.lock"))
    assert elsewhere.returncode == 0 and "--telemetry-lock PATH elsewhere" not in elsewhere.stderr


def test_a_lock_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "t.lock").mkdir()
    proc = burnrate("agent", "--backend", "simulated", "--once", "--telemetry-socket", str(tmp_path / "t.sock"),
                    "--telemetry-lock", str(tmp_path / "t.lock"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"burnrate agent: error: cannot open the telemetry socket {tmp_path / 't.sock'}: cannot create its lock "
        f"{tmp_path / 't.lock'}: Is a directory (pick another with --telemetry-socket PATH, or '' to disable)"]
