"""The plain records the agent's readers return and the immutable Snapshot its sampler
builds. They live on the floor because the exporter renders them and recordings keep them.

Everything here is a frozen dataclass so that a Snapshot can be handed to the HTTP
threads, the recorder and the renderer without locks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

UNKNOWN = "unknown"
_EMPTY: Mapping = MappingProxyType({})


def _empty() -> Mapping:
    return _EMPTY


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    pci_bus_id: str
    model_name: str
    driver_version: str = ""

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. A key missing from `fields` means the GPU cannot give
    that value: its series is left out, never reported as 0."""

    identity: GpuIdentity
    up: bool
    fields: Mapping[str, float] = field(default_factory=_empty)
    nvlink_bytes: Mapping[str, float] = field(default_factory=_empty)   # {"tx": bytes, "rx": bytes}, cumulative
    xid_counts: Mapping[int, int] = field(default_factory=_empty)       # cumulative events per XID code
    last_xid: int | None = None
    error: str = ""                              # why the GPU is down, when it is


@dataclass(frozen=True)
class PodRef:
    namespace: str
    pod: str
    container: str = ""
    training_job: str = ""
    uid: str = ""


@dataclass(frozen=True)
class Allocation:
    """A pod holding (part of) a GPU, as the kubelet reports it."""

    gpu_uuid: str       # the physical GPU
    device_id: str      # as the kubelet names it: GPU-…, MIG-…, or GPU-…::N
    pod: PodRef
    share: float = 1.0  # fraction of the GPU the pod holds


@dataclass(frozen=True)
class NodeInfo:
    hostname: str
    instance_type: str = UNKNOWN
    capacity_type: str = UNKNOWN   # spot | on-demand | unknown
    zone: str = UNKNOWN


@dataclass(frozen=True)
class RankKey:
    namespace: str
    pod: str
    training_job: str
    rank: int


@dataclass(frozen=True)
class RankState:
    """Cumulative training counters and last gauges of one rank (catalog RANK_FIELDS)."""

    key: RankKey
    values: Mapping[str, float]
    local_rank: int | None = None
    last_seen: float = 0.0
    # The process that sent its last report, as the kernel named it; 0 where it named none.
    pid: int = 0


@dataclass(frozen=True)
class HostReading:
    cpu_utilization: float | None = None
    # (namespace, pod) -> CPU seconds used by that pod's cgroup
    pod_cpu_seconds: Mapping[tuple[str, str], float] = field(default_factory=_empty)


@dataclass(frozen=True)
class AgentStats:
    telemetry_received: int = 0
    telemetry_rejected: Mapping[str, int] = field(default_factory=_empty)
    telemetry_relabelled: int = 0
    telemetry_ranks: int = 0
    collection_errors: Mapping[str, int] = field(default_factory=_empty)
    collection_seconds: Mapping[str, float] = field(default_factory=_empty)


@dataclass(frozen=True)
class HolderSeconds:
    """A holder's cumulative GPU-seconds on one GPU (agent.gpu_time)."""

    pod: PodRef
    allocated: float
    idle: float
    busy: float


@dataclass(frozen=True)
class GpuSeconds:
    """One GPU's cumulative seconds on the node, and its holders'; `gpu` is its last reading."""

    gpu: GpuReading
    observed: float
    holders: tuple[HolderSeconds, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    time: float
    node: NodeInfo
    gpus: tuple[GpuReading, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    ranks: tuple[RankState, ...] = ()
    host: HostReading = field(default_factory=HostReading)
    stats: AgentStats = field(default_factory=AgentStats)
    gpu_seconds: tuple[GpuSeconds, ...] = ()

    @property
    def gpu_model(self) -> str:
        models = sorted({g.identity.model_name for g in self.gpus})
        return models[0] if len(models) == 1 else (",".join(models) or UNKNOWN)


def frozen(mapping: Mapping) -> Mapping:
    """A read-only copy, so snapshots stay immutable."""
    return MappingProxyType(dict(mapping))
