"""Attribution where there is no kubelet: a laptop, the demo, a bare-metal box.

A GPU belongs to the training rank that drives it (its `local_rank`, else its rank
modulo the GPU count), as reported over the telemetry socket: what the kubelet would
have said in a cluster. A rank holds its GPU while its process runs, silent or not, as a
pod holds its GPUs however hung its loop is; where the kernel did not name the process
(the agent outside the trainers' PID namespace), until it has been silent `held_for_s`.
"""
from __future__ import annotations

import time
from typing import Iterable, Sequence

from burnrate.exporter.snapshot import Allocation, GpuReading, PodRef, RankState

CONTAINER = "trainer"


def gpu_index(state: RankState, gpus: int) -> int:
    index = state.local_rank if state.local_rank is not None else state.key.rank
    return index % gpus


def running(pid: int, proc: str = "/proc") -> bool:
    """Whether process `pid` still runs: a zombie has released its devices. A pid reused by a
    new process within the rank table's forget-after keeps the GPU held that long at most."""
    if pid <= 0:
        return False
    try:
        with open(f"{proc}/{pid}/stat", "rb") as stat:
            # The state follows the command name, which may itself hold ") ".
            state = stat.read().rsplit(b") ", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class LocalHolders:
    """Who holds each GPU, from one collection to the next. The telemetry table forgets a rank
    silent for its forget-after (5 minutes by default), shorter than a stall takes to be
    one (10 minutes at least): a GPU whose rank was forgotten stays held while the process
    that last drove it runs."""

    def __init__(self, held_for_s: float = 30.0) -> None:
        self.held_for_s = held_for_s
        self._held: dict[str, tuple[Allocation, int]] = {}   # uuid -> (holder, its pid)

    def __call__(self, ranks: Iterable[RankState], gpus: Sequence[GpuReading], *,
                 now: float | None = None) -> list[Allocation]:
        if not gpus:
            return []
        now = time.time() if now is None else now
        by_index = {g.identity.index: g.identity.uuid for g in gpus}
        held: dict[str, tuple[Allocation, int]] = {}
        for state in ranks:
            uuid = by_index.get(gpu_index(state, len(gpus)))
            if uuid is not None and (running(state.pid) if state.pid > 0 else now - state.last_seen <= self.held_for_s):
                k = state.key
                held[uuid] = (Allocation(uuid, uuid, PodRef(k.namespace, k.pod, CONTAINER, k.training_job)), state.pid)
        present = set(by_index.values())
        for uuid, (alloc, pid) in self._held.items():
            if uuid not in held and uuid in present and running(pid):
                held[uuid] = (alloc, pid)
        self._held = held
        return [alloc for alloc, _ in held.values()]
