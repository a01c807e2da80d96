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

Each sender also gets a budget key, its pod's UID, so that one pod flooding made-up
ranks exhausts only its own share of the node's ranks, however many users its processes
switch to. Outside Kubernetes a process outside pods is keyed by its user, and every
sender that could not be looked at shares one key.
"""
from __future__ import annotations

import logging
import os
import re
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
_REMEMBERED_PIDS = 4096
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
        # pid -> (when its /proc entry was made, its pod UID or "" outside pods). The entry's
        # time tells the process placed before from a new one at the same pid, for a stat
        # (2 µs) rather than reads of its stat and cgroup per datagram.
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
        entry = f"{self._proc}/{pid}"
        try:
            made = os.stat(entry).st_ctime_ns
            seen = self._seen.get(pid)
            if seen is not None and seen[0] == made:
                return seen[1]   # the process placed before, so it started before an earlier datagram
            with open(f"{entry}/stat", "rb") as stat:
                started = _start_time(stat.read())
            if started > received:
                return None
            with open(f"{entry}/cgroup") as cgroup:
                found = pod_uid(cgroup.read()) or ""
        except (OSError, ValueError, IndexError):
            return None
        self._seen[pid] = (made, found)
        self._seen.move_to_end(pid)
        if len(self._seen) > _REMEMBERED_PIDS:
            self._seen.popitem(last=False)
        return found


def _start_time(stat: bytes) -> float:
    """When a process started, in seconds on the boot-time clock, from its /proc/<pid>/stat:
    field 22, counted in clock ticks. The command name (field 2) may itself hold ") "."""
    return int(stat.rsplit(b") ", 1)[1].split()[19]) / _TICKS_PER_S
