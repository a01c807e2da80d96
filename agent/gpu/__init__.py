"""GPU readers: NVML on real GPUs, a simulated fleet where none exist."""
from __future__ import annotations

from typing import Mapping, Protocol

from burnrate.exporter.snapshot import GpuReading


class GpuReader(Protocol):
    # True where some values cover the time between two reads (sampled utilization, NVML GPM
    # activity, NVLink and PCIe rates), so the first read alone leaves them out.
    needs_interval: bool

    def read(self) -> list[GpuReading]:
        """One reading per GPU. A failing GPU yields a reading with up=False; it
        never raises for one GPU's sake."""

    def mig_devices(self) -> Mapping[str, tuple[str, float]]:
        """MIG device UUID -> (parent GPU UUID, share of the GPU), for attribution."""

    def gpu_minors(self) -> Mapping[int, str]:
        """Device minor number (/dev/nvidiaN) -> GPU UUID: how NVIDIA's DRA driver names GPUs."""

    def close(self) -> None: ...
