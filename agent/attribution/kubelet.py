"""Which pod holds which GPU, from the kubelet's pod-resources v1 API on its Unix socket.

Device-plugin ids follow the NVIDIA device plugin: `GPU-<uuid>` for a whole GPU, `MIG-<uuid>`
for a MIG device, and `<id>::<n>` for replica n of a time-sliced GPU or MIG device. Devices
allocated through DRA are the `dra` module's.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

import grpc

from burnrate.exporter.snapshot import Allocation

from .devices import Part, merge, physical, profile_share
from .dra import dra_parts
from .podresources.v1 import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
REPLICA_SEPARATOR = "::"

# mig uuid -> (parent GPU uuid, fraction of the parent), as the NVML reader sees it.
MigDevices = Callable[[], Mapping[str, tuple[str, float]]]
# GPU minor number (N of /dev/nvidiaN) -> GPU uuid, which DRA device names need.
GpuMinors = Callable[[], Mapping[int, str]]

# Some replies list every pod on a big node; the gRPC default of 4 MiB is too small.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class KubeletError(Exception):
    """The pod-resources API could not be read."""


def is_gpu_resource(resource_name: str) -> bool:
    # `.shared` variants are what the device plugin names time-sliced resources
    # when its renameByDefault option is on.
    base = resource_name.removesuffix(".shared")
    return base == GPU_RESOURCE or base.startswith(MIG_RESOURCE_PREFIX)


def mig_profile_share(resource_name: str) -> float | None:
    """The fraction of a GPU one device of a MIG resource name stands for, or None."""
    if not resource_name.startswith(MIG_RESOURCE_PREFIX):
        return None
    return profile_share(resource_name.removeprefix(MIG_RESOURCE_PREFIX))


def split_replica(device_id: str) -> str:
    """The device a time-sliced replica id belongs to (the id itself when not a replica)."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def replica_counts(devices: Iterable[api_pb2.ContainerDevices]) -> dict[str, int]:
    """How many replicas the kubelet advertises per physical device."""
    counts: dict[str, int] = defaultdict(int)
    for dev in devices:
        if is_gpu_resource(dev.resource_name):
            for device_id in dev.device_ids:
                counts[split_replica(device_id)] += 1
    return dict(counts)


@dataclass(frozen=True)
class Held:
    """The GPUs pods hold, and the DRA GPU devices (`<driver>/<pool>/<device>`) that no known
    GPU could be found for."""

    allocations: tuple[Allocation, ...]
    unmapped: tuple[str, ...]


def to_allocations(
    response: api_pb2.ListPodResourcesResponse,
    replicas: Mapping[str, int],
    mig_devices: Mapping[str, tuple[str, float]],
    gpu_minors: Mapping[int, str],
) -> Held:
    """One Allocation per (pod, container, GPU), from device-plugin devices and DRA claims."""
    claimed, unmapped = dra_parts(response, gpu_minors, mig_devices)
    plugged = _plugin_parts(response, replicas, mig_devices)
    return Held(merge([*plugged, *claimed]), tuple(unmapped))


def _plugin_parts(response: api_pb2.ListPodResourcesResponse, replicas: Mapping[str, int],
                  mig_devices: Mapping[str, tuple[str, float]]) -> Iterator[Part]:
    held: dict[tuple[str, str, str, str], list[str]] = {}
    resource_of: dict[str, str] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if not is_gpu_resource(dev.resource_name):
                    continue
                for device_id in dev.device_ids:
                    base = split_replica(device_id)
                    resource_of[base] = dev.resource_name
                    held.setdefault((pod.namespace, pod.name, container.name, base), []).append(device_id)

    for (namespace, pod, container, base), ids in held.items():
        gpu_uuid, device_share = physical(base, mig_profile_share(resource_of[base]), mig_devices)
        held_fraction = 1.0
        if any(REPLICA_SEPARATOR in i for i in ids):
            # A device the allocatable list does not mention is counted as having only
            # the replicas we see held, the most it can be worth.
            held_fraction = len(ids) / max(replicas.get(base, 0), len(ids))
        yield Part(namespace, pod, container, gpu_uuid, min(ids), device_share * held_fraction)


class PodResourcesClient:
    """Reads GPU allocations from the kubelet.

    A fresh channel per call: the kubelet recreates its socket when it restarts, and a
    long-lived channel would sit in reconnect backoff long after it is back.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0,
                 mig_devices: MigDevices = dict, gpu_minors: GpuMinors = dict) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._mig_devices = mig_devices
        self._gpu_minors = gpu_minors

    def allocations(self) -> Held:
        """What the pods on this node hold; raises KubeletError."""
        if not os.path.exists(self.socket_path):
            raise KubeletError(f"pod-resources socket {self.socket_path} not found")
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)]
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path}", options=options) as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                listed = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
                replicas = self._replicas(stub, listed)
        except grpc.RpcError as e:
            raise KubeletError(f"pod-resources {e.code().name}: {e.details()}") from e
        return to_allocations(listed, replicas, self._mig_devices(), self._gpu_minors())

    def _replicas(self, stub: api_pb2_grpc.PodResourcesListerStub,
                  listed: api_pb2.ListPodResourcesResponse) -> dict[str, int]:
        # Only time-slicing needs the allocatable list; skipping it otherwise keeps
        # attribution working on kubelets that disable GetAllocatableResources.
        if not _has_replicas(listed):
            return {}
        allocatable = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(),
                                                   timeout=self.timeout_s)
        return replica_counts(allocatable.devices)


def _has_replicas(listed: api_pb2.ListPodResourcesResponse) -> bool:
    return any(REPLICA_SEPARATOR in device_id
               for pod in listed.pod_resources for container in pod.containers
               for dev in container.devices if is_gpu_resource(dev.resource_name)
               for device_id in dev.device_ids)
