"""The sampler: on its own interval, ask every collector once and build one Snapshot.

Scrapes never wait on it; they read the last finished Snapshot. Every collector is
timed and its failures counted, and one failing collector leaves the others' parts
of the Snapshot intact.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Mapping, Protocol, TypeVar

from .gpu import GpuReader
from .gpu_time import GpuClock
from burnrate.exporter.snapshot import (AgentStats, Allocation, HostReading, NodeInfo, PodRef, RankState, Snapshot,
                       frozen)

log = logging.getLogger(__name__)
T = TypeVar("T")


class AttributionSource(Protocol):
    errors: dict[str, int]

    def current(self): ...  # -> agent.attribution.Attribution


class TelemetrySource(Protocol):
    received: int
    rejected: dict[str, int]
    relabelled: int

    def ranks(self) -> tuple[RankState, ...]: ...


class HostSource(Protocol):
    def read(self, pods: Iterable[PodRef]) -> HostReading: ...


class Sampler:
    def __init__(
        self,
        *,
        node_name: str,
        reader: GpuReader,
        attribution: AttributionSource,
        telemetry: TelemetrySource | None = None,
        host: HostSource | None = None,
        sinks: Mapping[str, Callable[[Snapshot], object]] | None = None,
        gpu_clock: GpuClock | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._node_name = node_name
        self._reader = reader
        self._attribution = attribution
        self._telemetry = telemetry
        self._host = host
        self._sinks = dict(sinks or {})  # name -> consumer (recorder, renderer), timed like collectors
        self._gpu_clock = gpu_clock
        self._clock = clock
        self._errors: dict[str, int] = {}
        self._seconds: dict[str, float] = {}
        self._failing: dict[str, tuple[str, int]] = {}   # collector -> (its last error, failures in a row)
        self.latest: Snapshot | None = None

    def _timed(self, name: str, fn: Callable[[], T], fallback: T) -> T:
        self._errors.setdefault(name, 0)  # a counter exists from the start, so rate() sees its first error
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # a broken collector must not take the others down
            self._errors[name] = self._errors.get(name, 0) + 1
            self._failed(name, exc)
            return fallback
        finally:
            self._seconds[name] = time.perf_counter() - start
        if name in self._failing:
            log.info("collector %s recovered after %d failures", name, self._failing.pop(name)[1])
        return value

    def _failed(self, name: str, exc: Exception) -> None:
        """Sampled every second, a lasting fault would log a traceback a second: the first
        failure logs one, a different error one line, a repeat nothing (the counter has it)."""
        what = f"{type(exc).__name__}: {exc}"
        last, count = self._failing.get(name, (None, 0))
        self._failing[name] = (what, count + 1)
        if last is None:
            log.exception("collector %s failed: %s", name, what)
        elif what != last:
            log.error("collector %s failed: %s", name, what)

    def collect(self) -> Snapshot:
        ranks = self._timed("telemetry", self._telemetry.ranks, ()) if self._telemetry else ()
        gpus = tuple(self._timed("gpu", self._reader.read, []))
        attribution = self._timed("attribution", self._attribution.current, None)
        node = attribution.node if attribution else NodeInfo(self._node_name)
        present = {g.identity.uuid for g in gpus}
        allocations: tuple[Allocation, ...] = tuple(
            a for a in (attribution.allocations if attribution else ()) if a.gpu_uuid in present)
        pods = {a.pod for a in allocations}
        host = self._timed("host", lambda: self._host.read(pods), HostReading()) if self._host else HostReading()
        errors = dict(self._errors)
        for source, count in self._attribution.errors.items():
            errors[source] = errors.get(source, 0) + count
        stats = AgentStats(
            telemetry_received=self._telemetry.received if self._telemetry else 0,
            telemetry_rejected=frozen(self._telemetry.rejected if self._telemetry else {}),
            telemetry_relabelled=self._telemetry.relabelled if self._telemetry else 0,
            telemetry_ranks=len(ranks),
            collection_errors=frozen(errors),
            collection_seconds=frozen(self._seconds),
        )
        if node.hostname != self._node_name:
            node = NodeInfo(self._node_name, node.instance_type, node.capacity_type, node.zone)
        now = self._clock()
        gpu_seconds = self._timed("gpu_time", lambda: self._gpu_clock.advance(now, gpus, allocations), ()) \
            if self._gpu_clock else ()
        snap = Snapshot(now, node, gpus, allocations, tuple(ranks), host, stats, gpu_seconds)
        self.latest = snap
        for name, sink in self._sinks.items():
            self._timed(name, lambda: sink(snap), None)
        return snap

    def run(self, interval: float, stop: threading.Event) -> None:
        """Collect every `interval` seconds on a fixed cadence until `stop` is set."""
        next_at = time.monotonic()
        while not stop.is_set():
            self.collect()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # overran: skip the missed ticks rather than bursting
                next_at, delay = time.monotonic(), 0.0
            stop.wait(delay)
