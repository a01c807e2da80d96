"""`burnrate agent` as a user runs it: --once, clear one-line errors, clean shutdown."""
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request

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
