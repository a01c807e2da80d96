"""Attribution where there is no kubelet: a laptop, the demo, a bare-metal box.

A GPU belongs to the training rank that drives it (its `local_rank`, else its rank
modulo the GPU count), as reported over the telemetry socket: what the kubelet would
have said in a cluster. A rank silent for `held_for_s` no longer holds its GPU.
"""
from __future__ import annotations

import time
from typing import Iterable, Sequence

from burnrate.exporter.snapshot import Allocation, GpuReading, PodRef, RankState

CONTAINER = "trainer"


def gpu_index(state: RankState, gpus: int) -> int:
    index = state.local_rank if state.local_rank is not None else state.key.rank
    return index % gpus


def local_allocations(ranks: Iterable[RankState], gpus: Sequence[GpuReading], *,
                      now: float | None = None, held_for_s: float = 30.0) -> list[Allocation]:
    if not gpus:
        return []
    now = time.time() if now is None else now
    by_index = {g.identity.index: g.identity.uuid for g in gpus}
    held: dict[str, Allocation] = {}
    for state in ranks:
        uuid = by_index.get(gpu_index(state, len(gpus)))
        if uuid is not None and now - state.last_seen <= held_for_s:
            k = state.key
            held[uuid] = Allocation(uuid, uuid, PodRef(k.namespace, k.pod, CONTAINER, k.training_job))
    return list(held.values())
