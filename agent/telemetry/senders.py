"""Who sent a telemetry datagram, from the kernel rather than from what the datagram says.

The socket is writable by every pod on the node, so a datagram's `namespace` and `pod`
are only claims. The receiving socket asks for SCM_CREDENTIALS, in which the kernel
names the sending process; that process's cgroup names its pod's UID (the kubelet puts
every container under `kubepods…pod<uid>`), and the Kubernetes API's pod list turns the
UID into the pod's namespace and name. The rule (docs/security.md):

- From a pod the agent knows: the pod's true namespace and name replace whatever the
  datagram claimed (counted as relabelled). The namespace is the tenancy boundary, so
  `training_job` stays as sent.
- From anywhere else (a pod not listed yet, a process outside any pod, a process that
  exited before its cgroup could be read): the datagram may not name a pod the agent
  knows; one that does is refused as impersonation.
- Where the kernel cannot name the sender (pid 0: the agent does not share the host's PID
  namespace) nothing can be checked, and a warning says so once.

Each sender also gets a budget key, so that one pod flooding made-up ranks exhausts only
its own share of the node's ranks.
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

# A pod UID in a cgroup path: the cgroupfs driver writes `pod<uid>`, the systemd driver
# `kubepods-<qos>-pod<uid with _ for ->.slice`; static pods' UIDs are 32 hex digits.
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12})\b")
_REMEMBERED_PIDS = 4096
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
    """Checks each record against its sender; `pods` is the agent's current pod list
    (keyed (namespace, name), as the attributor holds it), or None where there is none."""

    def __init__(self, proc_root: str | Path = "/proc",
                 pods: Callable[[], Mapping[tuple[str, str], PodLike] | None] = lambda: None) -> None:
        self._proc = str(proc_root)
        self.pods = pods
        self._listed: Mapping[tuple[str, str], PodLike] | None = None
        self._by_uid: dict[str, tuple[str, str]] = {}
        # pid -> (when its /proc entry was made, its pod UID). The entry's time tells a reused
        # pid from the process seen before, for a stat (2 µs) rather than a read of its cgroup
        # (15 µs) per datagram. A sender that exits right after its last send (a trainer's
        # final flush) can be gone before it is looked at; what its pid was last still names it.
        self._seen: OrderedDict[int, tuple[int, str | None]] = OrderedDict()
        self._warned = False
        self.relabelled = 0

    def check(self, record: Record, pid: int, uid: int) -> tuple[Record, str] | Rejection:
        """The record as it will be kept and its sender's budget key, or why it is refused."""
        if pid <= 0:
            if not self._warned:
                self._warned = True
                _log.warning("telemetry senders cannot be identified (the kernel names no process: run the agent "
                             "in the host's PID namespace, hostPID: true); pod names are taken as sent")
            return record, f"uid:{uid}"
        by_uid = self._index()
        sender_pod = self._pod_of(pid)
        claimed = (record.namespace, record.pod)
        if sender_pod is not None:
            truth = by_uid.get(sender_pod)
            if truth is not None:
                if claimed != truth:
                    self.relabelled += 1
                    record = msgspec.structs.replace(record, namespace=truth[0], pod=truth[1])
                return record, f"pod:{sender_pod}"
        listed = self._listed
        if listed is not None and claimed in listed:
            return Rejection(IMPERSONATION, f"pid {pid} claims {claimed[0]}/{claimed[1]}")
        return record, f"pod:{sender_pod}" if sender_pod else f"uid:{uid}"

    def _index(self) -> dict[str, tuple[str, str]]:
        listed = self.pods()
        if listed is not self._listed:  # the attributor swaps in a new list each refresh
            self._listed = listed
            self._by_uid = {p.uid: (p.namespace, p.name) for p in (listed or {}).values() if p.uid}
        return self._by_uid

    def _pod_of(self, pid: int) -> str | None:
        seen = self._seen.get(pid)
        entry = f"{self._proc}/{pid}"
        try:
            made = os.stat(entry).st_ctime_ns
            if seen is not None and seen[0] == made:
                return seen[1]
            with open(f"{entry}/cgroup") as cgroup:
                found = pod_uid(cgroup.read())
        except OSError:
            return seen[1] if seen is not None else None
        self._seen[pid] = (made, found)
        self._seen.move_to_end(pid)
        if len(self._seen) > _REMEMBERED_PIDS:
            self._seen.popitem(last=False)
        return found
