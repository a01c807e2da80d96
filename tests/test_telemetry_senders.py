"""Who may report as whom on the telemetry socket.

Real sockets and real sender processes: the kernel's SCM_CREDENTIALS name each sender's
pid. What no machine here has is a kubelet putting those processes into pod cgroups, so
the agent reads their cgroups from a stand-in /proc: a directory holding, for each real
sender pid, the `cgroup` file a pod's process has on a Kubernetes node (the formats of
the systemd and cgroupfs drivers, cgroup v2 and v1). A wrong pid from the kernel would
find no file there and show as an unidentified sender. The pod list is the real
attributor's, read from a stand-in kubelet and API server (tests/test_attribution.py's).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from burnrate.agent.attribution.attributor import Attributor
from burnrate.agent.attribution.kube import PodInfo
from burnrate.agent.telemetry import CARDINALITY, TelemetryInbox, validate
from burnrate.agent.telemetry.senders import IMPERSONATION, Senders, pod_uid
from tests.test_attribution import MIG_DEVICES, NODE, apiserver, kube_client, kubelet, socket_dir  # noqa: F401
from tests.test_telemetry import T0, Clock, encode, message

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
        self.cgroup.parent.mkdir()
        self.cgroup.write_text(cgroup)

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


def test_nobody_outside_a_pod_can_name_that_pod(node, processes) -> None:
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc, pods=lambda: PODS)) as inbox:
        unlisted_pod = start(processes, node, systemd_v2(UID_NEW))
        host = start(processes, node, HOST_PROCESS)
        victim = encode(message(namespace="team-b", pod="trainer-b-0"))
        assert unlisted_pod.send(victim, encode(message(namespace="team-c", pod="new-0"))) == ["sent", "sent"]
        assert host.send(victim, encode(message(namespace="local", pod="bench", rank=3))) == ["sent", "sent"]
        assert inbox.wait_idle(timeout=10)
        # A pod the API has not listed yet, and a process outside every pod, keep the names
        # they give so long as those are no known pod's.
        assert by_pod(inbox) == {("team-c", "new-0"): [("llm-7b", 0)], ("local", "bench"): [("llm-7b", 3)]}
        assert dict(inbox.rejected) == {IMPERSONATION: 2}


def test_a_sender_that_exits_after_its_last_send_is_still_its_pod(node, processes) -> None:
    """A trainer's final flush can be read after the trainer is gone: its pid was seen in its pod."""
    path, proc = node
    with TelemetryInbox(path, clock=Clock(), senders=Senders(proc, pods=lambda: PODS)) as inbox:
        trainer = start(processes, node, systemd_v2(UID_B))
        assert trainer.send(encode(message(namespace="team-b", pod="trainer-b-0", steps=3))) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        shutil.rmtree(trainer.cgroup.parent)  # its /proc entry gone, as after exit
        assert trainer.send(encode(message(namespace="team-b", pod="trainer-b-0", steps=4))) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        (rank,) = inbox.ranks()
        assert (rank.key.pod, rank.values["steps"]) == ("trainer-b-0", 7)
        assert dict(inbox.rejected) == {}
        # The pid taken again, by a process of another pod: its new /proc entry is read afresh.
        trainer.cgroup.parent.mkdir()
        trainer.cgroup.write_text(systemd_v2(UID_A))
        assert trainer.send(encode(message(namespace="team-b", pod="trainer-b-0", steps=5))) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        assert {(r.key.pod, r.values["steps"]) for r in inbox.ranks()} == {("trainer-b-0", 7), ("trainer-a-0", 5)}


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
        # Before the first list nothing is known: the claim stands.
        assert list(by_pod(inbox)) == [("default", "whatever")]
        attributor.refresh()
        assert worker.send(claim) == ["sent"]
        assert inbox.wait_idle(timeout=10)
        assert ("ml", "llm-7b-worker-0") in by_pod(inbox)
        assert inbox.relabelled == 1


def test_without_the_hosts_pid_namespace_claims_are_taken_and_a_warning_says_why(caplog) -> None:
    senders = Senders("/nonexistent", pods=lambda: PODS)
    record = validate(encode(message(namespace="team-b", pod="trainer-b-0")))
    assert senders.check(record, 0, 1000) == (record, "uid:1000")
    assert senders.check(record, 0, 1000) == (record, "uid:1000")
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
