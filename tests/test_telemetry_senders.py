"""Who may report as whom on the telemetry socket.

Real sockets and real sender processes: the kernel's SCM_CREDENTIALS name each sender's
pid. What no machine here has is a kubelet putting those processes into pod cgroups, so
the agent reads their cgroups from a stand-in /proc: a directory holding, for each real
sender pid, the `cgroup` file a pod's process has on a Kubernetes node (the formats of
the systemd and cgroupfs drivers, cgroup v2 and v1), and its `stat`, a link to the real
process's /proc/<pid>/stat (so its real start time). A wrong pid from the kernel would
find no entry there and show as an unidentified sender; a process with no entry stands
for one that exited before the agent looked, as short-lived processes do on a node. The
pod list is the real attributor's, read from a stand-in kubelet and API server
(tests/test_attribution.py's).
"""
from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from burnrate.agent.attribution.attributor import Attributor
from burnrate.agent.attribution.kube import PodInfo
from burnrate.agent.telemetry import CARDINALITY, Rejection, TelemetryInbox, validate
from burnrate.agent.telemetry.inbox import READER_THREAD
from burnrate.agent.telemetry.senders import IMPERSONATION, UNPLACED, UNVERIFIED, Senders, pod_uid
from tests.test_attribution import MIG_DEVICES, NODE, apiserver, kube_client, kubelet, socket_dir  # noqa: F401
from tests.test_telemetry import Clock, encode, message

UID_A = "6f1c2d0a-3b4e-4f5a-9c8d-1e2f3a4b5c6d"
UID_B = "0d9e8f7a-6b5c-4d3e-8f2a-1b0c9d8e7f6a"
UID_NEW = "11111111-2222-4333-8444-555555555555"
CONTAINER = "3f" * 32
PODS = {("team-a", "trainer-a-0"): PodInfo("team-a", "trainer-a-0", UID_A, "Running", "job-a"),
        ("team-b", "trainer-b-0"): PodInfo("team-b", "trainer-b-0", UID_B, "Running", "job-b")}


def systemd_v2(uid: str, qos: str = "burstable") -> str:
    return (f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{CONTAINER}.scope\n")


def cgroupfs_v1(uid: str) -> str:
    return "".join(f"{n}:{c}:/kubepods/besteffort/pod{uid}/{CONTAINER}\n"
                   for n, c in ((12, "memory"), (4, "cpu,cpuacct"), (1, "name=systemd")))


HOST_PROCESS = "0::/user.slice/user-1000.slice/session-3.scope\n"


class PodProcess:
    """A real process that sends, blocking, each payload the test hands it; its cgroup (in
    the stand-in /proc) says which pod it runs in."""

    def __init__(self, socket_path: Path, proc: Path, cgroup: str, user: int | None = None,
                 python: str = sys.executable) -> None:
        code = ("import socket,sys\ns=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n"
                "for line in sys.stdin:\n"
                "    try:\n        s.sendto(bytes.fromhex(line.strip()),sys.argv[1]); print('sent',flush=True)\n"
                "    except OSError as e:\n        print(type(e).__name__,flush=True)\n")
        self.process = subprocess.Popen([python, "-c", code, str(socket_path)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, user=user,
                                        group=user, extra_groups=None if user is None else [])
        self.cgroup = proc / str(self.process.pid) / "cgroup"
        enter(self.cgroup.parent, self.process.pid, cgroup)

    def send(self, *payloads: bytes) -> list[str]:
        answers = []
        for payload in payloads:
            self.process.stdin.write(payload.hex() + "\n")
            self.process.stdin.flush()
            answers.append(self.process.stdout.readline().strip())
        return answers

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=10)
        self.process.stdout.close()


def enter(entry: Path, pid: int, cgroup: str) -> None:
    """The stand-in /proc entry of real process `pid`, in the pod `cgroup` names."""
    entry.mkdir()
    (entry / "cgroup").write_text(cgroup)
    (entry / "stat").symlink_to(f"/proc/{pid}/stat")


def spawn_senders(socket_path: Path, payloads: list[list[bytes]], first_user: int | None = None) -> None:
    """Forks one short-lived process per list of payloads, each sending its own and exiting
    (switching first to user first_user + i, as a root pod's processes can), and waits for all."""
    code = ("import os,socket,sys\n"
            "path, first_user = sys.argv[1], int(sys.argv[2])\n"
            "for i, line in enumerate(sys.stdin):\n"
            "    child = os.fork()\n"
            "    if child == 0:\n"
            "        if first_user >= 0:\n"
            "            os.setgroups([]); os.setgid(first_user + i); os.setuid(first_user + i)\n"
            "        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            "        for payload in line.split():\n"
            "            s.sendto(bytes.fromhex(payload), path)\n"
            "        os._exit(0)\n"
            "    assert os.waitpid(child, 0)[1] == 0\n")
    stdin = "".join(" ".join(p.hex() for p in batch) + "\n" for batch in payloads)
    subprocess.run([sys.executable, "-c", code, str(socket_path), str(-1 if first_user is None else first_user)],
                   input=stdin, text=True, check=True, timeout=120)


@pytest.fixture
def node() -> Iterator[tuple[Path, Path]]:
    """(socket path, stand-in /proc), under a short /tmp path: a socket path has 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="br-", dir="/tmp") as d:
        (Path(d) / "proc").mkdir()
        yield Path(d) / "t.sock", Path(d) / "proc"


@pytest.fixture
def processes() -> Iterator[list[PodProcess]]:
    started: list[PodProcess] = []
    yield started
    for p in started:
        p.close()


def start(processes: list[PodProcess], node: tuple[Path, Path], cgroup: str, **how) -> PodProcess:
    process = PodProcess(*node, cgroup, **how)
    processes.append(process)
    return process


def by_pod(inbox: TelemetryInbox) -> dict[tuple[str, str], list[tuple[str, int]]]:
    held: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for r in inbox.ranks():
        held.setdefault((r.key.namespace, r.key.pod), []).append((r.key.training_job, r.key.rank))
    return held


def test_the_pod_uid_is_read_from_every_cgroup_layout() -> None:
    assert pod_uid(systemd_v2(UID_A)) == UID_A
    assert pod_uid(systemd_v2(UID_B, qos="besteffort")) == UID_B
    assert pod_uid(f"0::/kubepods.slice/kubepods-pod{UID_A.replace('-', '_')}.slice/x.scope\n") == UID_A
    assert pod_uid(cgroupfs_v1(UID_A)) == UID_A
    # Seen from inside a cgroup namespace the path is relative, and still names the pod.
    assert pod_uid(f"0::/../../kubepods-burstable-pod{UID_B.replace('-', '_')}.slice/cri-o-{CONTAINER}.scope\n") == UID_B
    # A static pod's UID is the hash of its manifest: 32 hex digits.
    assert pod_uid("0::/kubepods/burstable/pod6c8f3e1b0a9d4c7e8f2b1a0d9c8e7f6a/" + CONTAINER) == (
        "6c8f3e1b0a9d4c7e8f2b1a0d9c8e7f6a")
    for outside in (HOST_PROCESS, "0::/system.slice/containerd.service\n",
                    "0::/machine.slice/libpod-" + CONTAINER + ".scope\n", ""):
        assert pod_uid(outside) is None


def test_a_pod_reporting_as_another_pod_is_kept_under_its_own_name(node, processes) -> None:
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc, pods=lambda: PODS)) as inbox:
        attacker = start(processes, node, systemd_v2(UID_A))
        honest = start(processes, node, cgroupfs_v1(UID_B))
        forged = message(namespace="team-b", pod="trainer-b-0", training_job="job-b", rank=1, steps=1000)
        assert attacker.send(encode(forged)) == ["sent"]
        # A pod without the downward API sends `default` and its host name: corrected the same way.
        assert honest.send(encode(message(namespace="default", pod="node-7", training_job="job-b"))) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        assert by_pod(inbox) == {("team-a", "trainer-a-0"): [("job-b", 1)], ("team-b", "trainer-b-0"): [("job-b", 0)]}
        assert inbox.relabelled == 2
        assert dict(inbox.rejected) == {}


def test_nobody_outside_a_listed_pod_can_write_at_all(node, processes) -> None:
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc, pods=lambda: PODS)) as inbox:
        unlisted_pod = start(processes, node, systemd_v2(UID_NEW))
        host = start(processes, node, HOST_PROCESS)
        victim = encode(message(namespace="team-b", pod="trainer-b-0"))
        assert unlisted_pod.send(victim, encode(message(namespace="team-c", pod="new-0"))) == ["sent", "sent"]
        assert host.send(victim, encode(message(namespace="local", pod="bench", rank=3))) == ["sent", "sent"]
        assert inbox.wait_idle(timeout=10)
        # A pod the API has not listed yet, and a process outside every pod, have no namespace
        # the agent could check: naming a listed pod is impersonation, any other name unverified.
        assert by_pod(inbox) == {}
        assert dict(inbox.rejected) == {IMPERSONATION: 2, UNVERIFIED: 2}


def test_a_pid_is_never_filed_under_its_earlier_owner(node, processes) -> None:
    """trainer-b-0's process is seen at a pid. Then the process at that pid is gone when the
    agent looks: it stands for trainer-b-0 having exited and a short-lived process of pod A
    taking its pid, sending in team-b's name and exiting (its stand-in /proc entry removed)."""
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc, pods=lambda: PODS)) as inbox:
        trainer = start(processes, node, systemd_v2(UID_B))
        assert trainer.send(encode(message(namespace="team-b", pod="trainer-b-0", training_job="job-b",
                                           steps=3))) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        shutil.rmtree(trainer.cgroup.parent)
        forged = message(namespace="team-b", pod="trainer-b-0", training_job="job-b", steps=1000, loss=math.nan)
        assert trainer.send(encode(forged)) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        (rank,) = inbox.ranks()
        assert (rank.key.pod, rank.values["steps"], rank.values["loss"]) == ("trainer-b-0", 3, 2.5)
        assert dict(inbox.rejected) == {IMPERSONATION: 1}   # a listed pod's name, from no pod the agent sees
        # The pid's new owner, alive, of pod A: its own entry is read, and it is pod A.
        enter(trainer.cgroup.parent, trainer.process.pid, systemd_v2(UID_A))
        assert trainer.send(encode(forged)) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        assert {(r.key.pod, r.values["steps"]) for r in inbox.ranks()} == {("trainer-b-0", 3), ("trainer-a-0", 1000)}


def test_short_lived_processes_cannot_write_into_another_namespace(node, processes) -> None:
    """Children of pod A, each sending one datagram in team-b's name and exiting before the
    agent reads its /proc entry (they have none in the stand-in): the loss NaN would page
    team-b with TrainingDiverging."""
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc, pods=lambda: PODS)) as inbox:
        start(processes, node, systemd_v2(UID_A))  # their parent, in pod A
        ghosts = [[encode(message(namespace="team-b", pod=f"ghost-{i}", training_job="job-b", loss=math.nan))]
                  for i in range(50)]
        spawn_senders(path, ghosts)
        assert inbox.wait_idle(timeout=10)
        assert inbox.received == 50 and by_pod(inbox) == {}
        assert dict(inbox.rejected) == {UNVERIFIED: 50}


def test_outside_kubernetes_short_lived_senders_keep_their_names(node) -> None:
    """No pod list (the demo, a laptop): names are taken as sent, as the demo's trainers need."""
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc)) as inbox:
        spawn_senders(path, [[encode(message(namespace="local", pod=f"rank-{i}", rank=i))] for i in range(3)])
        assert inbox.wait_idle(timeout=10)
        assert by_pod(inbox) == {("local", f"rank-{i}"): [("llm-7b", i)] for i in range(3)}
        assert dict(inbox.rejected) == {}


def test_a_process_started_after_the_datagram_arrived_did_not_send_it(node, processes) -> None:
    """The process now at the kernel's pid is the sender only if it was running when the
    datagram was received; one started later has taken a freed pid."""
    path, proc = node
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    process = start(processes, node, systemd_v2(UID_B))
    senders = Senders(proc, pods=lambda: PODS)
    record = validate(encode(message(namespace="team-a", pod="trainer-a-0")))
    pid = process.process.pid
    assert senders.check(record, pid, 0, received=before - 1.0) == Rejection(UNVERIFIED, f"pid {pid} is in no listed pod")
    kept, key = senders.check(record, pid, 0, received=time.clock_gettime(time.CLOCK_BOOTTIME))
    assert ((kept.namespace, kept.pod), key) == (("team-b", "trainer-b-0"), f"pod:{UID_B}")


def test_a_flood_of_made_up_ranks_costs_only_its_sender(node, processes) -> None:
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc, pods=lambda: PODS)) as inbox:
        flood = start(processes, node, systemd_v2(UID_A))
        made_up = [encode(message(training_job=f"junk-{i % 16}", rank=i // 16, world_size=1000)) for i in range(5000)]
        assert set(flood.send(*made_up)) == {"sent"}
        ordinary = start(processes, node, systemd_v2(UID_B))
        assert ordinary.send(encode(message(namespace="team-b", pod="trainer-b-0", training_job="job-b"))) == ["sent"]
        assert inbox.wait_idle(timeout=30)
        held = by_pod(inbox)
        assert len(held[("team-a", "trainer-a-0")]) == 256
        assert held[("team-b", "trainer-b-0")] == [("job-b", 0)]
        assert inbox.rejected[CARDINALITY] == 5000 - 256
        # A rank the flooding pod already holds is still updated.
        assert flood.send(encode(message(training_job="junk-7", rank=0, world_size=1000, steps=5))) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        assert inbox.rejected[CARDINALITY] == 5000 - 256


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to switch users as a root pod's processes can")
@pytest.mark.parametrize("kubernetes", [True, False])
def test_a_pod_whose_processes_switch_users_cannot_take_the_node(node, processes, kubernetes) -> None:
    """A root pod's short-lived children, each switching to a user of its own, flood made-up
    ranks (each user used to get a budget of its own: 16 filled the node). Then a rank of
    another pod, new, must still be taken."""
    path, proc = node
    os.chmod(path.parent, 0o755)   # the children, once other users, must reach the socket
    senders = Senders(proc, pods=lambda: PODS) if kubernetes else Senders(proc)
    with TelemetryInbox(path, clock=Clock(), senders=senders) as inbox:
        start(processes, node, systemd_v2(UID_A))  # their parent, in pod A
        made_up = [[encode(message(training_job=f"junk-{child}-{i % 16}", rank=i // 16, world_size=1000))
                    for i in range(260)] for child in range(20)]
        spawn_senders(path, made_up, first_user=20000)
        newcomer = start(processes, node, systemd_v2(UID_B))
        assert newcomer.send(encode(message(namespace="team-b", pod="trainer-b-0", training_job="job-b"))) == ["sent"]
        assert inbox.wait_idle(timeout=30)
        held = by_pod(inbox)
        assert held.pop(("team-b", "trainer-b-0")) == [("job-b", 0)]
        if kubernetes:  # senders that cannot be placed in a pod hold nothing
            assert held == {} and dict(inbox.rejected) == {UNVERIFIED: 20 * 260}
        else:           # they share one budget, whatever users they switch to
            assert sum(map(len, held.values())) == 256 and dict(inbox.rejected) == {CARDINALITY: 20 * 260 - 256}


def test_the_real_attributors_pod_list_decides(node, processes, kubelet, apiserver) -> None:  # noqa: F811
    """Wired as `burnrate agent --attribution kubelet` wires it: the pods the API lists."""
    path, proc = node
    attributor = Attributor(NODE, kubelet.socket, kube_client(apiserver), mig_devices=lambda: MIG_DEVICES)
    senders = Senders(proc, pods=attributor.pods)
    with TelemetryInbox(path, clock=Clock(), senders=senders) as inbox:
        worker = start(processes, node, systemd_v2("0c7e9b1a-2f4d-4e8b-9a6c-3d5e7f9a1b2c"))
        claim = encode(message(namespace="default", pod="whatever", training_job="llm-7b"))
        assert worker.send(claim) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        # Before the first list no sender can be placed: nothing is kept.
        assert by_pod(inbox) == {} and dict(inbox.rejected) == {UNVERIFIED: 1}
        attributor.refresh()
        assert worker.send(claim) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        assert list(by_pod(inbox)) == [("ml", "llm-7b-worker-0")]
        assert inbox.relabelled == 1


def held(path: str) -> int:
    """How many descriptors of `path` this process holds."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            pass
    return count


def test_a_placed_sender_holds_its_pid_until_it_is_reaped() -> None:
    """On the real /proc: a placed process is held by a descriptor of its entry and
    recognised through it while it holds its pid (until it is reaped, so as a zombie too);
    once it is reaped the pid could be another's, and nothing is kept from it."""
    senders = Senders(pods=None)
    record = validate(encode(message(namespace="local", pod="rank-0")))
    process = subprocess.Popen(["sleep", "60"])
    try:
        pid = process.pid
        with open(f"/proc/{pid}/cgroup") as cgroup:
            in_pod = pod_uid(cgroup.read())
        placed = (record, f"pod:{in_pod}" if in_pod else "uid:0")
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert senders.check(record, pid, 0, now) == placed and held(f"/proc/{pid}") == 1
        assert senders.check(record, pid, 0, now) == placed and held(f"/proc/{pid}") == 1
        process.kill()
        while open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][0] != "Z":
            time.sleep(0.01)
        assert senders.check(record, pid, 0, now) == placed   # a zombie still holds its pid
        process.wait()
        assert senders.check(record, pid, 0, time.clock_gettime(time.CLOCK_BOOTTIME)) == (record, UNPLACED)
        assert held(f"/proc/{pid}") == 0
    finally:
        process.kill()
        process.wait()
        senders.close()


def test_the_inbox_lets_go_of_its_senders_when_it_closes(node, processes) -> None:
    path, proc = node
    inbox = TelemetryInbox(path, clock=Clock(), senders=Senders(proc))
    with inbox:
        trainer = start(processes, node, HOST_PROCESS)
        assert trainer.send(encode(message())) == ["sent"]
        assert inbox.wait_idle(timeout=10) and len(inbox.ranks()) == 1
        entry = str(trainer.cgroup.parent)
        assert held(entry) == 1
    assert held(entry) == 0


def test_the_telemetry_reader_is_named_for_the_kernel(node) -> None:
    """So that top -H, and bench/agent.py, can tell its CPU from the rest of the agent's."""
    path, _ = node
    with TelemetryInbox(path) as inbox:
        deadline = time.monotonic() + 10
        while (name := Path(f"/proc/self/task/{inbox._reader.native_id}/comm").read_text().strip()) != READER_THREAD:
            assert time.monotonic() < deadline, name   # it names itself as it starts
            time.sleep(0.01)


@pytest.mark.parametrize("pods, outcome", [
    (lambda: PODS, Rejection(UNVERIFIED, "the kernel named no sender")),   # Kubernetes: dropped
    (None, "kept"),                                                         # outside: taken as sent
])
def test_without_the_hosts_pid_namespace_a_warning_says_why(caplog, pods, outcome) -> None:
    senders = Senders("/nonexistent", pods=pods)
    record = validate(encode(message(namespace="team-b", pod="trainer-b-0")))
    expected = (record, "uid:1000") if outcome == "kept" else outcome
    assert senders.check(record, 0, 1000, 0.0) == expected
    assert senders.check(record, 0, 1000, 0.0) == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "hostPID: true" in warnings[0]


# The sender that runs as another user needs an interpreter that user may run (the test's
# own may live under a private home); the system's has only the standard library, all it needs.
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root, to send as another user, and a system Python")
def test_the_socket_mode_and_group_decide_who_may_send_outside_kubernetes(node, processes) -> None:
    path, proc = node
    os.chmod(path.parent, 0o755)
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc), mode=0o660, group=0) as inbox:
        outsider = start(processes, node, HOST_PROCESS, user=65534, python=SYSTEM_PYTHON)
        member = start(processes, node, HOST_PROCESS, user=0)
        assert outsider.send(encode(message(pod="outsider"))) == ["PermissionError"]
        assert member.send(encode(message(pod="member"))) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        assert [r.key.pod for r in inbox.ranks()] == ["member"]
        assert oct(os.stat(path).st_mode & 0o777) == "0o660"


def test_the_mode_is_set_over_a_socket_a_crashed_agent_left_behind(node) -> None:
    path, proc = node
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stale:
        stale.bind(str(path))
    os.chmod(path, 0o666)
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc), mode=0o660):
        assert oct(os.stat(path).st_mode & 0o777) == "0o660"


def test_the_agent_cli_refuses_a_bad_mode_or_group_in_one_line(tmp_path) -> None:
    for flag, value, says in (("--telemetry-socket-mode", "rw-rw----", "is not a mode such as 0660"),
                              ("--telemetry-socket-mode", "01777", "is not a mode such as 0660"),
                              ("--telemetry-socket-group", "no-such-group-here", "no group 'no-such-group-here'")):
        proc = subprocess.run([sys.executable, "-m", "burnrate", "agent", "--once", "--backend", "simulated",
                               "--telemetry-socket", str(tmp_path / "t.sock"), flag, value],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
