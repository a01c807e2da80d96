"""GPUs allocated through dynamic resource allocation (DRA), as the kubelet lists them.

Only devices of NVIDIA's GPU driver count. It publishes a whole GPU as `gpu-<minor>` and a MIG
device as `gpu-<parent minor>-mig-<profile>-<profile id>-<placement start>`, the minor being N
of the GPU's /dev/nvidiaN; the GPU's UUID is in its ResourceSlice, which the kubelet does not
pass on. A CDI device name ending in a GPU or MIG UUID (`nvidia.com/gpu=GPU-…`, as nvidia-ctk
names devices by UUID) identifies the device without the minor.
"""
from __future__ import annotations

import re
from typing import Mapping

from .devices import Part, physical, profile_share
from .podresources.v1 import api_pb2

NVIDIA_GPU_DRIVER = "gpu.nvidia.com"

_WHOLE = re.compile(r"gpu-(?P<minor>\d+)")
_MIG = re.compile(r"gpu-(?P<minor>\d+)-mig-(?P<profile>.+)-\d+-\d+")
_UUID = re.compile(r"(?:GPU|MIG)-[0-9a-fA-F-]+")


def device_key(claimed: api_pb2.ClaimResource) -> str:
    """The device's name in the cluster, `<driver>/<pool>/<device>`, as DRA writes it."""
    return f"{claimed.driver_name}/{claimed.pool_name}/{claimed.device_name}"


def locate(claimed: api_pb2.ClaimResource, gpu_minors: Mapping[int, str],
           mig_devices: Mapping[str, tuple[str, float]]) -> tuple[str, float] | None:
    """(GPU uuid, share of that GPU) for one allocated device; None where no GPU is known for it."""
    mig = _MIG.fullmatch(claimed.device_name)
    share = profile_share(mig["profile"]) if mig else None
    for cdi in claimed.cdi_devices:
        uuid = cdi.name.rpartition("=")[2]
        if _UUID.fullmatch(uuid):
            return physical(uuid, share, mig_devices)
    whole = _WHOLE.fullmatch(claimed.device_name)
    if whole:
        gpu = gpu_minors.get(int(whole["minor"]))
        return None if gpu is None else (gpu, 1.0)
    if mig and share is not None:
        parent = gpu_minors.get(int(mig["minor"]))
        return None if parent is None else (parent, share)
    return None


def dra_parts(response: api_pb2.ListPodResourcesResponse, gpu_minors: Mapping[int, str],
              mig_devices: Mapping[str, tuple[str, float]]) -> tuple[list[Part], list[str]]:
    """Each container's share of the GPUs its claims hold, and the devices no GPU is known for.

    A claim several containers or pods share splits its devices' shares evenly among them.
    """
    holders: dict[str, dict[tuple[str, str, str], None]] = {}
    claimed_as: dict[str, api_pb2.ClaimResource] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            holder = (pod.namespace, pod.name, container.name)
            for dynamic in container.dynamic_resources:
                for claimed in dynamic.claim_resources:
                    if claimed.driver_name != NVIDIA_GPU_DRIVER:
                        continue
                    key = device_key(claimed)
                    holders.setdefault(key, {})[holder] = None
                    claimed_as[key] = claimed
    parts, unmapped = [], []
    for key, holding in holders.items():
        found = locate(claimed_as[key], gpu_minors, mig_devices)
        if found is None:
            unmapped.append(key)
            continue
        gpu, share = found
        parts.extend(Part(*holder, gpu, key, share / len(holding)) for holder in holding)
    return parts, sorted(unmapped)
