"""A prometheus_client custom collector that renders one agent Snapshot.

It reads only the finished Snapshot it is handed: a scrape never calls NVML or the
kubelet. Families are built fresh each time, so GPUs and pods that went away
vanish by themselves.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from .counters import DEFAULT, Counters
from .snapshot import Allocation, GpuReading, HolderSeconds, Snapshot

from . import catalog as C
from . import labels as L

Row = tuple[dict[str, str], float]


def device_labels(gpu: GpuReading, hostname: str) -> dict[str, str]:
    ident = gpu.identity
    return {
        L.GPU: str(ident.index), L.UUID: ident.uuid, L.PCI_BUS_ID: ident.pci_bus_id,
        L.DEVICE: ident.device, L.MODEL_NAME: ident.model_name, L.HOSTNAME: hostname,
    }


def pod_labels(holder: Allocation | HolderSeconds) -> dict[str, str]:
    pod = holder.pod
    return {L.NAMESPACE: pod.namespace, L.POD: pod.pod, L.CONTAINER: pod.container,
            L.TRAINING_JOB: pod.training_job}


class _View:
    """Per-render lookups shared by every family.

    Each GPU's and each rank's label dict is made once per render and shared by all of
    its series, which lets the encoder render each distinct dict once (exposition.encode).
    """

    def __init__(self, snap: Snapshot, counters: Counters) -> None:
        self.snap = snap
        self.host = snap.node.hostname
        by_uuid: dict[str, list[Allocation]] = {}
        for a in snap.allocations:
            by_uuid.setdefault(a.gpu_uuid, []).append(a)
        self.allocs = by_uuid
        # (reading, device labels, the labels of its DCGM series: the device's, the driver
        # version where the counters ask for it, and the pod's when one pod holds the GPU
        # (a shared GPU's device series cannot belong to one pod; its holders are in
        # burnrate_gpu_allocated))
        self.gpus: list[tuple[GpuReading, dict[str, str], dict[str, str]]] = []
        driver = L.DRIVER_VERSION in counters.labels
        for gpu in snap.gpus:
            labels = device_labels(gpu, self.host)
            dcgm = {**labels, L.DRIVER_VERSION: gpu.identity.driver_version} \
                if driver and gpu.identity.driver_version else labels
            allocs = by_uuid.get(gpu.identity.uuid, ())
            self.gpus.append((gpu, labels, {**dcgm, **pod_labels(allocs[0])} if len(allocs) == 1 else dcgm))
        # Rank series are most of the exposition: one pass files each rank's values by field.
        self.rank_rows: dict[str, list[Row]] = {}
        for state in snap.ranks:
            k = state.key
            labels = {L.NAMESPACE: k.namespace, L.POD: k.pod, L.TRAINING_JOB: k.training_job,
                      L.RANK: str(k.rank), L.HOSTNAME: self.host}
            for field, value in state.values.items():
                self.rank_rows.setdefault(field, []).append((labels, value))


def _gpu_field(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    field = spec.field
    for gpu, _, labels in v.gpus:
        if gpu.up and field in gpu.fields:
            yield labels, gpu.fields[field]


def _gpu_up(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    for gpu, labels, _ in v.gpus:
        yield labels, 1.0 if gpu.up else 0.0


def _gpu_last_xid(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    for gpu, _, labels in v.gpus:
        yield labels, float(gpu.last_xid or 0)


def _gpu_xid_counts(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    for gpu, labels, _ in v.gpus:
        for code, count in sorted(gpu.xid_counts.items()):
            yield {**labels, "xid": str(code)}, count


def _gpu_nvlink(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    for gpu, labels, _ in v.gpus:
        for direction, value in sorted(gpu.nvlink_bytes.items()):
            yield {**labels, "direction": direction}, value


def _allocation(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    for gpu, labels, _ in v.gpus:
        for alloc in v.allocs.get(gpu.identity.uuid, ()):
            yield {**labels, **pod_labels(alloc)}, 1.0 if spec.field == "allocated" else alloc.share


def _gpu_time(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    for entry in v.snap.gpu_seconds:
        labels = device_labels(entry.gpu, v.host)
        if spec.field == "observed":
            yield labels, entry.observed
            continue
        for holder in entry.holders:
            yield {**labels, **pod_labels(holder)}, getattr(holder, spec.field)


def _node_info(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    n = v.snap.node
    yield {L.HOSTNAME: v.host, "instance_type": n.instance_type, "capacity_type": n.capacity_type,
           "zone": n.zone, "gpu_model": v.snap.gpu_model, "gpu_count": str(len(v.snap.gpus))}, 1.0


def _node_host(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    value = getattr(v.snap.host, spec.field)
    if value is not None:
        yield {L.HOSTNAME: v.host}, value


def _pod_host(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    for (namespace, pod), seconds in sorted(v.snap.host.pod_cpu_seconds.items()):
        yield {L.NAMESPACE: namespace, L.POD: pod, L.HOSTNAME: v.host}, seconds


def _rank(v: _View, spec: C.MetricSpec) -> Iterable[Row]:
    return v.rank_rows.get(spec.field, ())


def _agent(v: _View, spec: C.MetricSpec) -> Iterator[Row]:
    if spec.field == "time":
        yield {L.HOSTNAME: v.host}, v.snap.time
        return
    value = getattr(v.snap.stats, spec.field)
    if isinstance(value, (int, float)):
        yield {L.HOSTNAME: v.host}, value
        return
    key = "reason" if spec.field == "telemetry_rejected" else "collector"
    for name, count in sorted(value.items()):
        yield {L.HOSTNAME: v.host, key: name}, count


_ROWS: dict[str, Callable[[_View, C.MetricSpec], Iterable[Row]]] = {
    C.GPU_FIELD: _gpu_field, C.GPU_UP: _gpu_up, C.GPU_LAST_XID: _gpu_last_xid,
    C.GPU_XID_COUNTS: _gpu_xid_counts, C.GPU_NVLINK_BYTES: _gpu_nvlink, C.ALLOCATION: _allocation,
    C.NODE_INFO: _node_info, C.NODE_HOST: _node_host, C.POD_HOST: _pod_host, C.RANK: _rank,
    C.AGENT: _agent, C.GPU_TIME: _gpu_time,
}


class SnapshotCollector:
    """Renders the snapshot `source()` returns; nothing at all before the first one.
    `counters` chooses the device series (dcgm-exporter's default set unless given);
    `constant` labels go on every series (the cluster's name, for many clusters in one store)."""

    def __init__(self, source: Callable[[], Snapshot | None], counters: Counters = DEFAULT,
                 constant: dict[str, str] | None = None) -> None:
        self._source = source
        self._specs = [spec for spec in C.CATALOG if counters.exports(spec)]
        self._counters = counters
        self._constant = dict(constant or {})

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        if snap is None:
            return
        view = _View(snap, self._counters)
        for spec in self._specs:
            family = Metric(spec.name, spec.help, spec.type)
            name = spec.sample_name
            rows = _ROWS[spec.source](view, spec)
            if self._constant:
                rows = [({**labels, **self._constant}, value) for labels, value in rows]
            family.samples = [Sample(name, labels, float(value)) for labels, value in rows]
            if family.samples:
                yield family
