"""Pod attribution: which pod and training job holds each GPU, and what the node costs.

`attributor.Attributor` combines the kubelet's pod-resources API (`kubelet`, with DRA
claims in `dra`) with the Kubernetes API (`kube`) on its own thread;
`static.StaticAttributor` serves fixed allocations where there is no cluster. Both hand
out an `Attribution`.
"""
from __future__ import annotations

from dataclasses import dataclass

from burnrate.exporter.snapshot import Allocation, NodeInfo


@dataclass(frozen=True)
class Attribution:
    allocations: tuple[Allocation, ...]
    node: NodeInfo
