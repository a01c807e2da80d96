"""Who sent a telemetry datagram, from the kernel rather than from what the datagram says.

The socket is writable by every pod on the node, so a datagram's `namespace` and `pod`
are only claims. The receiving socket asks for SCM_CREDENTIALS, in which the kernel
names the sending process; that process's cgroup names its pod's UID (the kubelet puts
every container under `kubepods…pod<uid>`), and the Kubernetes API's pod list turns the
UID into the pod's namespace and name. The rule (docs/security.md):

- From a pod the agent lists: the pod's true namespace and name replace whatever the
  datagram claimed (counted as relabelled). The namespace is the tenancy boundary, so
  `training_job` stays as sent.
- From any sender the agent cannot place in a listed pod (a pod not listed yet, a
  process outside every pod, a process that exited before it was looked at, one that
  started after the datagram arrived, no pod list yet): dropped, as impersonation when
  it names a listed pod, else as unverified. Such a sender has no namespace of its own
  that the agent could check, so it may write into none.
- Outside Kubernetes (no pod source) claims are taken as sent: who may send at all is
  the socket's mode and group.

The process the kernel named may be gone when the agent looks, and its pid taken by
another. What the agent reads is trusted only if the process now at that pid started no
later than the datagram was received: pids are unique among live processes, so it is
then the sender, unless the pid was freed and reused between the send and the receipt,
which takes the node's whole pid space wrapping round in that time. Nothing is ever
taken from what the pid was before.

A placed process is held by an open descriptor of its /proc/<pid> directory, and its
stat and cgroup are read through it, so both come from the one process. Later datagrams
from that pid only ask whether the directory still has entries: the kernel empties it
once its process is reaped, which is also when the pid could first go to another. While
it has them, the process placed holds the pid, so it sent them (it started before an
earlier datagram arrived and has held the pid since). An access() through the descriptor
costs about half a stat of /proc/<pid>.

Each sender also gets a budget key, its pod's UID, so that one pod flooding made-up
ranks exhausts only its own share of the node's ranks, however many users its processes
switch to. Outside Kubernetes a process outside pods is keyed by its user, and every
sender that could not be looked at shares one key.
"""
from __future__ import annotations

import logging
import os
import re
import resource
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Mapping, Protocol

import msgspec

from .schema import Record, Rejection

IMPERSONATION = "impersonation"   # names a pod the agent knows, sent from outside that pod
UNVERIFIED = "unverified"         # on Kubernetes, from a sender the agent cannot place in a listed pod
UNPLACED = "unplaced"             # outside Kubernetes, the budget key of every sender not looked at

# A pod UID in a cgroup path: the cgroupfs driver writes `pod<uid>`, the systemd driver
# `kubepods-<qos>-pod<uid with _ for ->.slice`; static pods' UIDs are 32 hex digits.
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12})\b")
# Each placed pid holds a descriptor: at most a quarter of the agent's descriptor limit, so
# that a node's worth of senders never starves the HTTP server or NVML of descriptors.
_DESCRIPTORS = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
_REMEMBERED_PIDS = 4096 if _DESCRIPTORS == resource.RLIM_INFINITY else max(1, min(4096, _DESCRIPTORS // 4))
_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_log = logging.getLogger(__name__)


class PodLike(Protocol):
    namespace: str
    name: str
    uid: str


def pod_uid(cgroup_text: str) -> str | None:
    """The pod UID in a /proc/<pid>/cgroup file, in the API's form; None outside a pod."""
    match = _POD_UID.search(cgroup_text)
    if match is None:
        return None
    uid = match.group(1).replace("_", "-")
    return uid if len(uid) in (32, 36) else None


class Senders:
    """Checks each record against its sender. `pods` gives the agent's current pod list
    (keyed (namespace, name), as the attributor holds it; None until the first one); no
    `pods` at all means outside Kubernetes."""

    def __init__(self, proc_root: str | Path = "/proc",
                 pods: Callable[[], Mapping[tuple[str, str], PodLike] | None] | None = None) -> None:
        self._proc = str(proc_root)
        self.pods = pods
        self._listed: Mapping[tuple[str, str], PodLike] | None = None
        self._by_uid: dict[str, tuple[str, str]] = {}
        # pid -> (a descriptor of its /proc entry, its pod UID or "" outside pods): the
        # process placed before, recognised without reading its stat and cgroup again.
        self._seen: OrderedDict[int, tuple[int, str]] = OrderedDict()
        self._warned = False
        self.relabelled = 0

    def check(self, record: Record, pid: int, uid: int, received: float) -> tuple[Record, str] | Rejection:
        """The record as it will be kept and its sender's budget key, or why it is refused.
        `received`: when the datagram was read, in seconds on the boot-time clock."""
        if pid <= 0:
            return self._unnamed(record, uid)
        placed = self._pod_of(pid, received)
        if self.pods is None:
            if placed is None:
                return record, UNPLACED
            return record, f"pod:{placed}" if placed else f"uid:{uid}"
        truth = self._index().get(placed) if placed else None
        claimed = (record.namespace, record.pod)
        if truth is None:
            if self._listed is not None and claimed in self._listed:
                return Rejection(IMPERSONATION, f"pid {pid} claims {claimed[0]}/{claimed[1]}")
            return Rejection(UNVERIFIED, f"pid {pid} is in no listed pod")
        if claimed != truth:
            self.relabelled += 1
            record = msgspec.structs.replace(record, namespace=truth[0], pod=truth[1])
        return record, f"pod:{placed}"

    def _unnamed(self, record: Record, uid: int) -> tuple[Record, str] | Rejection:
        """The kernel names no process where the agent is outside the senders' PID namespace."""
        if not self._warned:
            self._warned = True
            _log.warning("telemetry senders cannot be identified (the kernel names no process: run the agent in "
                         "the host's PID namespace, hostPID: true); %s",
                         "pod names are taken as sent" if self.pods is None else "their datagrams are dropped")
        if self.pods is None:
            return record, f"uid:{uid}"
        return Rejection(UNVERIFIED, "the kernel named no sender")

    def _index(self) -> dict[str, tuple[str, str]]:
        listed = self.pods() if self.pods is not None else None
        if listed is not self._listed:  # the attributor swaps in a new list each refresh
            self._listed = listed
            self._by_uid = {p.uid: (p.namespace, p.name) for p in (listed or {}).values() if p.uid}
        return self._by_uid

    def _pod_of(self, pid: int, received: float) -> str | None:
        """The pod UID of the process at `pid`, "" if it is outside pods, None if it cannot
        have sent a datagram received at `received` (gone, or started since)."""
        seen = self._seen.get(pid)
        if seen is not None:
            if os.access("stat", os.F_OK, dir_fd=seen[0]):
                return seen[1]   # the process placed before, so it started before an earlier datagram
            self._forget(pid)
        try:
            entry = os.open(f"{self._proc}/{pid}", _OPEN_DIRECTORY)
        except OSError:
            return None
        try:
            started = _start_time(_read(entry, "stat"))
            found = (pod_uid(_read(entry, "cgroup").decode()) or "") if started <= received else None
        except (OSError, ValueError, IndexError):
            found = None
        if found is None:
            os.close(entry)
            return None
        self._seen[pid] = (entry, found)
        if len(self._seen) > _REMEMBERED_PIDS:
            self._forget(next(iter(self._seen)))
        return found

    def _forget(self, pid: int) -> None:
        os.close(self._seen.pop(pid)[0])

    def close(self) -> None:
        """Let go of the processes placed (their descriptors); a later datagram places its sender afresh."""
        while self._seen:
            self._forget(next(iter(self._seen)))


def _read(entry: int, name: str) -> bytes:
    """A file of the /proc entry held open as `entry`: of its process, or of none."""
    with open(name, "rb", opener=lambda path, flags: os.open(path, flags, dir_fd=entry)) as file:
        return file.read()


def _start_time(stat: bytes) -> float:
    """When a process started, in seconds on the boot-time clock, from its /proc/<pid>/stat:
    field 22, counted in clock ticks. The command name (field 2) may itself hold ") "."""
    return int(stat.rsplit(b") ", 1)[1].split()[19]) / _TICKS_PER_S
