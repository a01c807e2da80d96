"""What one allocated device stands for: which GPU, and how much of it.

MIG profiles are named as NVIDIA's go-nvlib prints them: `<g>g.<mem>gb`, or `<c>c.<g>g.<mem>gb`
for a compute instance inside a larger GPU instance, then attributes (`+me`, `-me`, `+me.all`,
`+gfx`). The device plugin's resource names swap `+` for `.` (`nvidia.com/mig-1g.10gb.me`);
NVIDIA's DRA driver drops the dots from its device names (`gpu-0-mig-1g10gb-19-0`). Attributes
change the media and graphics engines, not the compute share.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, NamedTuple

from burnrate.exporter.snapshot import Allocation, PodRef

_PROFILE = re.compile(r"(?:(?P<c>\d+)c\.?)?(?P<g>\d+)g\.?(?P<mem>\d+)gb(?![0-9a-z])")
# The A30 is the one MIG GPU cut into 4 slices rather than 7; these profiles are its own.
_A30_PROFILES = {"1g.6gb", "2g.12gb", "4g.24gb"}


class Part(NamedTuple):
    """One device's share of one GPU, held by one container."""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str
    device_id: str
    share: float


def profile_share(profile: str) -> float | None:
    """The fraction of a GPU one device of `profile` stands for; None when it is no profile."""
    match = _PROFILE.match(profile)
    if match is None:
        return None
    slices = 4 if f"{match['g']}g.{match['mem']}gb" in _A30_PROFILES else 7
    return int(match["c"] or match["g"]) / slices


def physical(device_id: str, share: float | None,
             mig_devices: Mapping[str, tuple[str, float]]) -> tuple[str, float]:
    """(GPU uuid, share of that GPU) for a `GPU-…` or `MIG-…` device, `share` being its
    profile's share where the name it was allocated under tells it."""
    if not device_id.startswith("MIG-"):
        return device_id, 1.0
    known = mig_devices.get(device_id)
    if known is not None:
        return known
    # NVML does not know the device (yet): the MIG device stands in for its GPU. With the
    # device plugin's `single` strategy nothing names the profile, so the share is the whole
    # of that stand-in.
    return device_id, 1.0 if share is None else share


def merge(parts: Iterable[Part]) -> tuple[Allocation, ...]:
    """One Allocation per (pod, container, GPU): a container's devices on one GPU (replicas of
    a time-sliced GPU, several MIG devices) add up, so that the exporter never sees two series
    with the same labels. The device_id is the first of theirs."""
    merged: dict[tuple[str, str, str, str], tuple[str, float]] = {}
    for p in parts:
        key = (p.namespace, p.pod, p.container, p.gpu_uuid)
        first, total = merged.get(key, (p.device_id, 0.0))
        merged[key] = (min(first, p.device_id), total + p.share)
    return tuple(
        Allocation(gpu_uuid=gpu, device_id=device_id,
                   pod=PodRef(namespace=namespace, pod=pod, container=container), share=share)
        for (namespace, pod, container, gpu), (device_id, share) in sorted(merged.items()))
