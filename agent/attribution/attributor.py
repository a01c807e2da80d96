"""Keeps an up-to-date Attribution for the sampler, refreshed off the sampling thread."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Iterable, Mapping, TypeVar

from burnrate.exporter.snapshot import Allocation, NodeInfo, frozen

from . import Attribution
from .kube import ApiError, KubeClient, PodInfo
from .kubelet import GpuMinors, Held, KubeletError, MigDevices, PodResourcesClient

log = logging.getLogger(__name__)
T = TypeVar("T")

KUBELET = "kubelet"
KUBERNETES = "kubernetes"
# DRA GPU devices that no known GPU was found for, counted each refresh that lists them.
DRA = "dra"


def enrich(allocations: Iterable[Allocation],
           pods: Mapping[tuple[str, str], PodInfo] | None) -> tuple[Allocation, ...]:
    """Adds training job and uid from the API; drops pods that have finished.

    A pod the API does not list (just deleted, or the list is from before an outage)
    keeps its allocation, unenriched: the kubelet is the authority on who holds a device.
    """
    if pods is None:
        return tuple(allocations)
    kept = []
    for a in allocations:
        info = pods.get((a.pod.namespace, a.pod.pod))
        if info is None:
            kept.append(a)
        elif not info.finished:
            pod = dataclasses.replace(a.pod, training_job=info.training_job, uid=info.uid)
            kept.append(dataclasses.replace(a, pod=pod))
    return tuple(kept)


def _kind(exc: Exception) -> str:
    """What an error is, without the parts (addresses, dates) that change every time."""
    if isinstance(exc, ApiError):
        return f"HTTP {exc.status}"
    if isinstance(exc, KubeletError):
        return str(exc)
    return type(exc).__name__


class Attributor:
    """Pod attribution from the kubelet and the Kubernetes API, served from a cache.

    `refresh()` does one round; `start()` repeats it every `refresh_s` on a daemon
    thread. `current()` never waits on the network. A source that fails is counted in
    `errors` and logged when its failure changes; its last good answer is used meanwhile
    (none yet: allocations without training_job, node facts `unknown`). A DRA GPU device
    that no known GPU is found for is counted in `errors["dra"]` and logged once.

    `gpu_minors` gives the GPUs' minor numbers, which name whole GPUs and MIG parents in
    NVIDIA's DRA device names.
    """

    def __init__(self, node_name: str, kubelet_socket: str, kube: KubeClient | None,
                 mig_devices: MigDevices = dict, refresh_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, gpu_minors: GpuMinors = dict) -> None:
        self.node_name = node_name
        self.refresh_s = refresh_s
        self._kubelet = PodResourcesClient(kubelet_socket, mig_devices=mig_devices, gpu_minors=gpu_minors)
        self._kube = kube
        self._clock = clock
        self._held: tuple[Allocation, ...] = ()
        self._pods: Mapping[tuple[str, str], PodInfo] | None = None
        self._node: NodeInfo | None = None
        self._current = Attribution((), NodeInfo(hostname=node_name))
        self._errors = {KUBELET: 0, KUBERNETES: 0, DRA: 0}
        self._failing = {KUBELET: "", KUBERNETES: ""}
        self._unmapped_seen: set[str] = set()
        self._refresh_lock = threading.Lock()
        self._errors_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_refresh_seconds = 0.0

    @property
    def errors(self) -> Mapping[str, int]:
        with self._errors_lock:
            return frozen(self._errors)

    def current(self) -> Attribution:
        return self._current

    def pods(self) -> Mapping[tuple[str, str], PodInfo] | None:
        """The node's pods from the last good API list, keyed (namespace, name); None before one.
        Each refresh swaps in a new mapping, so holders can tell when it changed."""
        return self._pods

    def refresh(self) -> Attribution:
        """One round: the kubelet's allocations first, so that every pod it names is
        already in the API's pod list that follows."""
        with self._refresh_lock:
            started = self._clock()
            held = self._attempt(KUBELET, self._kubelet.allocations)
            if held is not None:
                self._held = held.allocations
                self._count_unmapped(held)
            if self._kube is not None:
                kube, node = self._kube, self.node_name
                seen = self._attempt(KUBERNETES, lambda: (kube.pods(node), kube.node(node)))
                if seen is not None:
                    self._pods, self._node = seen
            self._current = Attribution(enrich(self._held, self._pods),
                                        self._node or NodeInfo(hostname=self.node_name))
            self.last_refresh_seconds = self._clock() - started
            return self._current

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="attribution", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _loop(self) -> None:
        due = self._clock()
        while not self._stopping.is_set():
            self.refresh()
            # Fixed cadence from the first round; a slow round shifts it rather than
            # triggering a burst of catch-up rounds.
            due = max(due + self.refresh_s, self._clock())
            self._stopping.wait(max(0.0, due - self._clock()))

    def _count_unmapped(self, held: Held) -> None:
        with self._errors_lock:
            self._errors[DRA] += len(held.unmapped)
        new = sorted(set(held.unmapped) - self._unmapped_seen)
        if new:
            log.warning("DRA GPU devices without a known GPU, not attributed: %s", ", ".join(new))
            self._unmapped_seen.update(new)

    def _attempt(self, source: str, read: Callable[[], T]) -> T | None:
        # Any failure is contained here: attribution is optional and must never stop
        # the agent or its refresh thread.
        try:
            value = read()
        except Exception as exc:  # noqa: BLE001
            with self._errors_lock:
                self._errors[source] += 1
            kind = _kind(exc)
            if kind != self._failing[source]:
                log.warning("%s unavailable, serving the last attribution: %s", source, exc)
                self._failing[source] = kind
            return None
        if self._failing[source]:
            log.info("%s available again", source)
            self._failing[source] = ""
        return value
