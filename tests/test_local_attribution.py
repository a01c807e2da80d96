"""Attribution without a kubelet: which rank holds which GPU, and for how long a silent one does.

Ranks are real processes here (a `sleep` child stands in for a trainer's rank), since the
question is whether the process that drove a GPU still runs."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from burnrate.agent.local import LocalHolders, running
from burnrate.agent.telemetry.inbox import TelemetryInbox
from burnrate.exporter.snapshot import GpuIdentity, GpuReading, RankKey, RankState
from burnrate.trainer.monitor import Monitor
from burnrate.trainer.telemetry import Identity
from tests.conftest import PYTHON, ROOT

NOW = 1_800_000_000.0


def gpu(index: int) -> GpuReading:
    return GpuReading(GpuIdentity(index, f"GPU-{index}", f"00000000:{index + 1:02x}:00.0", "NVIDIA H100 80GB HBM3"), up=True)


GPUS = (gpu(0), gpu(1))


def rank(r: int, *, silent_for: float, pid: int = 0) -> RankState:
    return RankState(RankKey("ml", f"w-{r}", "llm", r), {}, local_rank=r, last_seen=NOW - silent_for, pid=pid)


def held(*ranks: RankState, holders: LocalHolders | None = None) -> dict[str, str]:
    holders = holders or LocalHolders(held_for_s=5.0)
    return {a.gpu_uuid: a.pod.pod for a in holders(ranks, GPUS, now=NOW)}


@pytest.fixture
def child():
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_reporting_rank_holds_its_gpu_and_a_silent_one_without_a_process_lets_go():
    assert held(rank(0, silent_for=1.0), rank(1, silent_for=6.0)) == {"GPU-0": "w-0"}


def test_a_hung_rank_holds_its_gpu_while_its_process_runs(child):
    """A rank stuck in a collective sends nothing, and its GPU is still taken: TrainingStalled
    needs the job to hold GPUs, as a pod does whatever its loop does."""
    assert held(rank(0, silent_for=3600.0, pid=child.pid), rank(1, silent_for=3600.0)) == {"GPU-0": "w-0"}
    child.kill()
    child.wait()
    assert held(rank(0, silent_for=3600.0, pid=child.pid)) == {}


def test_a_hung_rank_the_telemetry_table_forgot_keeps_its_gpu_while_its_process_runs(child):
    """The table forgets a rank silent for 5 minutes; a stall takes 10 to be one. The GPU
    stays with the process that drove it, and goes when that process does."""
    holders = LocalHolders(held_for_s=5.0)
    assert held(rank(0, silent_for=1.0, pid=child.pid), holders=holders) == {"GPU-0": "w-0"}
    assert held(holders=holders) == {"GPU-0": "w-0"}
    assert held(holders=holders) == {"GPU-0": "w-0"}
    child.kill()
    child.wait()
    assert held(holders=holders) == {}
    # And does not come back.
    assert held(holders=holders) == {}


def test_a_rank_whose_process_ended_lets_go_at_once_and_one_the_agent_cannot_see_after_its_silence(child):
    """A rank's last message comes as its process exits. Where the kernel named the process,
    its GPU is free at the next collection: a hold of 5 s more was charged to every finished
    job, as `stalled` or `no_process` by where the samples fell. Where it named none, silence
    is all the agent goes by."""
    child.kill()
    child.wait()
    assert held(rank(0, silent_for=0.0, pid=child.pid)) == {}
    assert held(rank(0, silent_for=0.0), rank(1, silent_for=4.0)) == {"GPU-0": "w-0", "GPU-1": "w-1"}


def test_an_unreaped_rank_has_let_go(child):
    child.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while running(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    # Dead but not reaped: /proc still lists it, as a zombie.
    assert os.path.exists(f"/proc/{child.pid}")
    assert held(rank(0, silent_for=60.0, pid=child.pid)) == {}


@pytest.mark.parametrize("stat, alive", [
    (b"42 (python) S 1 42", True),
    (b"42 (a) R (b) R 1 42", True),       # the command name may hold ") "
    (b"42 (python) Z 1 42", False),
    (b"42 (python) X 1 42", False),
    (b"garbage", False),
])
def test_the_process_state_is_read_after_the_command_name(tmp_path, stat, alive):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_bytes(stat)
    assert running(42, proc=str(tmp_path)) is alive


def test_no_process_named_is_not_a_running_one(tmp_path):
    assert not running(0) and not running(-1)
    assert not running(42, proc=str(tmp_path))


def test_an_agent_attributing_locally_never_imports_grpc_or_protobuf(tmp_path):
    # The kubelet client's gRPC and protobuf cost an agent 20 MB, and 6.1 MB of mapped library
    # on an H200 (bench/RESULTS.md); a node without a kubelet never calls it.
    script = ("import sys\n"
              "from burnrate.cli import main\n"
              f"code = main(['agent', '--once', '--backend', 'simulated', '--gpus', '2', '--attribution', 'local',"
              f" '--telemetry-socket', {str(tmp_path / 'telemetry.sock')!r}])\n"
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'google'}), file=sys.stderr)\n"
              "sys.exit(code)\n")
    out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert 'DCGM_FI_DEV_GPU_UTIL{' in out.stdout
    assert out.stderr.splitlines()[-1] == "[]", out.stderr


def test_a_rank_holds_its_gpu_from_its_monitors_creation_before_any_step(tmp_path):
    """Before the first step the model loads, compiles and fetches its first batches. The monitor,
    created before them, says so at once, nothing counted, and keeps saying it: the agent holds
    the rank's GPU through that start-up, where it used to wait for the first step's report."""
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        mon = Monitor(seq_len=8, every_steps=1, socket_path=str(inbox.path), keepalive_s=0.2, start_step=40,
                      identity=Identity("llm", "ml", "w-0", 0, 0, 1))
        time.sleep(1.0)                                 # the first step compiles
        assert inbox.wait_idle(5)
        (state,) = inbox.ranks()
        allocated = {a.gpu_uuid: a.pod.pod for a in LocalHolders(held_for_s=0.5)(inbox.ranks(), GPUS)}
        mon.close()
    assert dict(inbox.rejected) == {}
    assert (state.values["steps"], state.values["global_step"], state.values["resumed_from"]) == (0, 40, 40)
    assert state.values["start_time"] == mon.start_time and "last_step_time" not in state.values
    assert allocated == {"GPU-0": "w-0"}                 # heard within the last half second, by keep-alives
