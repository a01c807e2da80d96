"""GPU-seconds as counters, so that cost and waste are an `increase()` over any window.

Each collection adds the time since the one before to what the one before saw: a state
holds until the next reading, as the analyzer reads series (analyzer.grid.holding), so no
scrape interval, missed scrape or query step changes a total. Per GPU, the seconds it
was listed (a GPU that stopped answering is still paid for). Per GPU and holder, the
seconds held, weighted by the holder's share (shares adding up to more than a whole GPU
split it, as the analyzer's accounting does), split into idle (utilization at or below
IDLE_UTIL_PCT) and busy (above it, or unknown): allocated = idle + busy for every holder.
The split is the metrics' contract (exporter.catalog), never a setting: whoever reads the
counters knows where it lies.

A gap longer than the staleness bound (the agent was stopped, the node suspended) counts
as one interval, not as the gap. Every series starts at 0 when its GPU or holder is
first seen, so that `increase()` sees the first interval too, and stays for `keep_s`
after it was last seen, so that the last interval is scraped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from burnrate.exporter.catalog import IDLE_UTIL_PCT
from burnrate.exporter.snapshot import Allocation, GpuReading, GpuSeconds, HolderSeconds, PodRef

# Prometheus' default lookback: a sample is current for five minutes (analyzer.grid.holding).
STALENESS_S = 300.0


@dataclass
class _Holder:
    pod: PodRef
    allocated: float = 0.0
    idle: float = 0.0
    last_seen: float = 0.0


def _series(pod: PodRef) -> tuple[str, str, str, str]:
    """What names a holder's series: a pod made again under the same name (a StatefulSet's,
    a restarted job's) continues its counters rather than start a second series like it."""
    return pod.namespace, pod.pod, pod.container, pod.training_job


@dataclass
class _Gpu:
    reading: GpuReading
    observed: float = 0.0
    last_seen: float = 0.0
    holders: dict[tuple[str, str, str, str], _Holder] = field(default_factory=dict)


class GpuClock:
    def __init__(self, interval_s: float, keep_s: float) -> None:
        self._interval = interval_s
        self._keep = keep_s
        self._gpus: dict[str, _Gpu] = {}
        self._before: tuple[float, Sequence[GpuReading], Sequence[Allocation]] | None = None

    def advance(self, now: float, gpus: Sequence[GpuReading],
                allocations: Sequence[Allocation]) -> tuple[GpuSeconds, ...]:
        """Count the time since the last call as the last call's state; the totals after it."""
        if self._before is not None:
            then, gpus_then, allocs_then = self._before
            elapsed = now - then
            if elapsed > STALENESS_S:
                elapsed = self._interval
            if elapsed > 0:
                self._count(elapsed, gpus_then, allocs_then)
        self._before = (now, tuple(gpus), tuple(allocations))
        for gpu in gpus:
            entry = self._gpus.get(gpu.identity.uuid)
            if entry is None:
                entry = self._gpus[gpu.identity.uuid] = _Gpu(gpu)
            entry.reading, entry.last_seen = gpu, now
        for alloc in allocations:
            entry = self._gpus.get(alloc.gpu_uuid)
            if entry is not None:
                holder = entry.holders.setdefault(_series(alloc.pod), _Holder(alloc.pod))
                holder.pod, holder.last_seen = alloc.pod, now
        self._forget(now)
        return tuple(
            GpuSeconds(g.reading, g.observed, tuple(
                HolderSeconds(h.pod, h.allocated, h.idle, h.allocated - h.idle) for h in g.holders.values()))
            for g in self._gpus.values())

    def _count(self, elapsed: float, gpus: Sequence[GpuReading], allocations: Sequence[Allocation]) -> None:
        shares: dict[str, dict[tuple[str, str, str, str], float]] = {}
        for alloc in allocations:
            held = shares.setdefault(alloc.gpu_uuid, {})
            # A pod listed twice for one GPU (two containers' device IDs) holds what both say.
            key = _series(alloc.pod)
            held[key] = held.get(key, 0.0) + alloc.share
        for gpu in gpus:
            entry = self._gpus[gpu.identity.uuid]
            entry.observed += elapsed
            held = shares.get(gpu.identity.uuid)
            if not held:
                continue
            whole = max(sum(held.values()), 1.0)
            util = gpu.fields.get("gpu_util")
            idle = util is not None and util <= IDLE_UTIL_PCT
            for key, share in held.items():
                holder = entry.holders[key]
                seconds = elapsed * share / whole
                holder.allocated += seconds
                if idle:
                    holder.idle += seconds

    def _forget(self, now: float) -> None:
        cutoff = now - self._keep
        for uuid in [u for u, g in self._gpus.items() if g.last_seen < cutoff]:
            del self._gpus[uuid]
        for entry in self._gpus.values():
            for key in [k for k, h in entry.holders.items() if h.last_seen < cutoff]:
                del entry.holders[key]
