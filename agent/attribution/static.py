"""Attribution without a cluster: fixed node facts and allocations produced on the node.

Kept apart from `attributor`, whose kubelet client imports gRPC and protobuf (14 MB of the
agent's memory: bench/RESULTS.md, "Agent") that an agent attributing GPUs locally never uses."""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

from burnrate.exporter.snapshot import Allocation, NodeInfo, frozen

from . import Attribution


class StaticAttributor:
    """Fixed node facts and locally produced allocations, for demos and simulation."""

    def __init__(self, node: NodeInfo, allocations: Callable[[], Iterable[Allocation]]) -> None:
        self._node = node
        self._allocations = allocations

    @property
    def errors(self) -> Mapping[str, int]:
        return frozen({})

    def current(self) -> Attribution:
        return Attribution(tuple(self._allocations()), self._node)

    def start(self) -> None:
        """Nothing runs in the background: allocations are read on demand."""

    def stop(self, timeout_s: float = 5.0) -> None:
        """Nothing to stop."""
