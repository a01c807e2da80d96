"""Simulated GPUs for machines without one: the demo, tests and benchmarks.

Values follow simple physics so that detectors and dashboards see what real GPUs
show: power between idle and TDP following utilization, temperature lagging power
(first-order, tens of seconds), the SM clock dropping with the thermal-slowdown
bits set when a GPU runs hot, framebuffer use, and NVLink bytes from gradient
traffic. Everything is deterministic from the seed and the clock, and the model
name says "(simulated)" wherever it is shown.
"""
from __future__ import annotations

import math
import random
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from burnrate.exporter import throttle
from burnrate.exporter.labels import SIMULATED

from ..local import gpu_index
from burnrate.exporter.snapshot import GpuIdentity, GpuReading, RankState, frozen



@dataclass(frozen=True)
class GpuModelSpec:
    name: str
    memory_mib: int
    idle_w: float
    tdp_w: float
    sm_clock_max_mhz: float
    sm_clock_idle_mhz: float
    mem_clock_mhz: float
    nvlink_bytes_per_s: float   # per direction, all links
    slowdown_temp_c: float
    reserved_mib: int           # framebuffer the driver keeps for itself


H100_SXM = GpuModelSpec("NVIDIA H100 80GB HBM3", 81559, 70.0, 700.0, 1980.0, 345.0, 2619.0, 450e9, 87.0, 566)
DRIVER_VERSION = "580.95.05"


@dataclass(frozen=True)
class Load:
    """What a workload asks of one GPU over the last interval."""

    utilization: float                    # 0..1
    memory_fraction: float | None = None  # of the framebuffer
    nvlink_bytes_per_s: float | None = None


Workload = Callable[[], Mapping[int, Load]]


@dataclass
class _GpuState:
    identity: GpuIdentity
    temp_c: float
    energy_mj: float
    thermal_c_per_w: float
    phase: float
    nvlink_tx: float = 0.0
    nvlink_rx: float = 0.0
    throttled: bool = False
    lost: bool = False
    last_xid: int | None = None
    xid_counts: dict[int, int] | None = None
    power_violation_ns: float = 0.0
    thermal_violation_ns: float = 0.0


class SimulatedReader:
    """N simulated GPUs on one node.

    `workload` (optional) says what each GPU index is doing; GPUs it does not name
    run a steady synthetic training load, or sit idle when `idle_when_undriven`.
    `hot_gpus` cool badly and reach thermal slowdown under load.
    """

    needs_interval = False

    def __init__(
        self,
        gpus: int = 8,
        *,
        seed: int = 0,
        model: GpuModelSpec = H100_SXM,
        clock: Callable[[], float] = time.monotonic,
        workload: Workload | None = None,
        idle_when_undriven: bool = False,
        hot_gpus: Iterable[int] = (),
        ambient_c: float = 30.0,
    ) -> None:
        self._model = model
        self._clock = clock
        self._workload = workload
        self._idle_when_undriven = idle_when_undriven
        self._ambient = ambient_c
        self._rng = random.Random(seed)
        hot = set(hot_gpus)
        self._gpus = [self._new_gpu(i, i in hot) for i in range(gpus)]
        self._last = clock()

    def _new_gpu(self, index: int, hot: bool) -> _GpuState:
        rng = self._rng
        identity = GpuIdentity(
            index=index,
            uuid="GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            model_name=f"{self._model.name} {SIMULATED}",
            driver_version=DRIVER_VERSION,
        )
        thermal = 0.105 if hot else 0.072 + rng.uniform(-0.004, 0.004)
        return _GpuState(
            identity=identity,
            temp_c=self._ambient + thermal * self._model.idle_w,
            energy_mj=rng.uniform(1e9, 5e9),
            thermal_c_per_w=thermal,
            phase=rng.uniform(0, 2 * math.pi),
            xid_counts={},
        )

    # --- fault injection -------------------------------------------------------
    def lose(self, index: int) -> None:
        """The GPU falls off the bus, as NVML_ERROR_GPU_IS_LOST reports it."""
        self._gpus[index].lost = True

    def inject_xid(self, index: int, code: int) -> None:
        gpu = self._gpus[index]
        gpu.xid_counts[code] = gpu.xid_counts.get(code, 0) + 1
        gpu.last_xid = code

    # --- GpuReader ---------------------------------------------------------------
    def mig_devices(self) -> Mapping[str, tuple[str, float]]:
        return {}

    def gpu_minors(self) -> Mapping[int, str]:
        return {g.identity.index: g.identity.uuid for g in self._gpus}

    def close(self) -> None:
        pass

    def read(self) -> list[GpuReading]:
        now = self._clock()
        dt = max(0.0, min(now - self._last, 60.0))
        self._last = now
        loads = dict(self._workload()) if self._workload else {}
        readings = []
        for gpu in self._gpus:
            if gpu.lost:
                readings.append(GpuReading(gpu.identity, up=False, error="GPU is lost"))
                continue
            readings.append(self._step(gpu, loads.get(gpu.identity.index), now, dt))
        return readings

    def _default_load(self, gpu: _GpuState, now: float) -> Load:
        if self._idle_when_undriven:
            return Load(0.0)
        # A steady training job: high utilization with a short evaluation dip every ~10 minutes.
        dip = 0.55 if math.sin(now / 95.0 + gpu.phase) > 0.985 else 0.0
        return Load(0.94 - dip)

    def _step(self, gpu: _GpuState, load: Load | None, now: float, dt: float) -> GpuReading:
        m, rng = self._model, self._rng
        load = load or self._default_load(gpu, now)
        util = min(1.0, max(0.0, load.utilization + (rng.gauss(0, 0.015) if load.utilization > 0.02 else 0.0)))

        power = m.idle_w + (m.tdp_w - m.idle_w) * util ** 0.9 + rng.gauss(0, 4.0)
        if gpu.throttled:
            power *= 0.78
        power = min(m.tdp_w, max(m.idle_w * 0.9, power))

        target = self._ambient + gpu.thermal_c_per_w * power
        gpu.temp_c += (target - gpu.temp_c) * (1.0 - math.exp(-dt / 20.0)) if dt else 0.0
        # Hysteresis, as the firmware does: slow down at the limit, recover a few degrees below.
        if gpu.temp_c >= m.slowdown_temp_c:
            gpu.throttled = True
        elif gpu.temp_c < m.slowdown_temp_c - 3.0:
            gpu.throttled = False

        if util < 0.01:
            sm_clock, reasons = m.sm_clock_idle_mhz, throttle.GPU_IDLE
        else:
            sm_clock, reasons = m.sm_clock_max_mhz - rng.choice((0.0, 15.0, 30.0)), 0
            if power >= 0.98 * m.tdp_w:
                reasons |= throttle.SW_POWER_CAP
        if gpu.throttled and util >= 0.01:
            sm_clock = round(m.sm_clock_max_mhz * 0.7 / 15.0) * 15.0
            reasons |= throttle.SW_THERMAL | throttle.HW_THERMAL

        gpu.energy_mj += power * dt * 1000.0
        link_rate = load.nvlink_bytes_per_s if load.nvlink_bytes_per_s is not None else 0.2 * m.nvlink_bytes_per_s * util
        tx = link_rate * dt
        rx = tx * (1.0 + rng.uniform(-0.01, 0.01))
        gpu.nvlink_tx += tx
        gpu.nvlink_rx += rx

        mem_frac = load.memory_fraction if load.memory_fraction is not None else (0.74 if util > 0.02 else 0.006)
        usable = m.memory_mib - m.reserved_mib
        used = round(usable * min(1.0, mem_frac))
        clock_ratio = sm_clock / m.sm_clock_max_mhz
        if reasons & throttle.SW_POWER_CAP:
            gpu.power_violation_ns += dt * 1e9
        if gpu.throttled:
            gpu.thermal_violation_ns += dt * 1e9
        # Host-to-device batches in, a little out: a training loader's PCIe traffic.
        pcie_rx = util * 1.6e9 * (1.0 + rng.uniform(-0.05, 0.05))
        fields = {
            "gpu_util": round(util * 100.0),
            "mem_copy_util": round(util * 35.0),
            "fb_used_mib": used,
            "fb_free_mib": usable - used,
            "power_w": round(power, 3),
            "energy_mj": round(gpu.energy_mj),
            "temp_c": round(gpu.temp_c),
            "sm_clock_mhz": sm_clock,
            "mem_clock_mhz": m.mem_clock_mhz,
            "nvlink_bandwidth_mbps": round((tx + rx) / dt / 1e6, 3) if dt else 0.0,
            "tensor_active": round(util * 0.55 * clock_ratio, 4),
            "gr_engine_active": round(util * 0.97, 4),
            "dram_active": round(util * 0.4, 4),
            "throttle_reasons": reasons,
            "ecc_sbe_volatile": 0,
            "ecc_dbe_volatile": 0,
            "remapped_rows_correctable": 0,
            "remapped_rows_uncorrectable": 0,
            "row_remap_failure": 0,
            # The rest of dcgm-exporter's default set: HBM a few degrees above the die, no
            # video engines in training, bare metal (no vGPU license).
            "memory_temp_c": round(gpu.temp_c + 4.0),
            "pcie_replay": 0,
            "enc_util": 0,
            "dec_util": 0,
            "fb_reserved_mib": m.reserved_mib,
            "vgpu_license": 0,
            "pcie_tx_bytes_per_s": round(pcie_rx * 0.08),
            "pcie_rx_bytes_per_s": round(pcie_rx),
            # What a counters file may turn on.
            "fb_total_mib": m.memory_mib,
            "sm_active": round(util * 0.92 * clock_ratio, 4),
            "sm_occupancy": round(util * 0.41, 4),
            "fp64_active": 0.0,
            "fp32_active": round(util * 0.11, 4),
            "fp16_active": round(util * 0.04, 4),
            "nvlink_tx_bytes_per_s": round(tx / dt) if dt else 0.0,
            "nvlink_rx_bytes_per_s": round(rx / dt) if dt else 0.0,
            "power_violation_ns": round(gpu.power_violation_ns),
            "thermal_violation_ns": round(gpu.thermal_violation_ns),
            "max_sm_clock_mhz": m.sm_clock_max_mhz,
            "max_mem_clock_mhz": m.mem_clock_mhz,
            "enforced_power_limit_w": m.tdp_w,
        }
        return GpuReading(
            gpu.identity,
            up=True,
            fields=frozen(fields),
            nvlink_bytes=frozen({"tx": round(gpu.nvlink_tx), "rx": round(gpu.nvlink_rx)}),
            xid_counts=frozen(gpu.xid_counts),
            last_xid=gpu.last_xid,
        )


class RankWorkload:
    """Drives simulated GPUs from the training ranks that report to this agent.

    A rank drives the GPU `agent.local.gpu_index` names. Its utilization
    over the last interval is its own compute time over its wall time, so a starving
    loader or a rank waiting on a straggler shows low utilization, as on real GPUs.
    """

    def __init__(self, ranks: Callable[[], Iterable[RankState]], gpus: int) -> None:
        self._ranks = ranks
        self._gpus = gpus
        self._previous: dict[object, tuple[float, float]] = {}
        self._busy: dict[object, float] = {}

    def __call__(self) -> Mapping[int, Load]:
        loads: dict[int, Load] = {}
        previous: dict[object, tuple[float, float]] = {}
        for state in self._ranks():
            compute, wall = state.values.get("compute_s", 0.0), state.values.get("step_s", 0.0)
            before = self._previous.get(state.key)
            if before is not None and wall > before[1]:
                self._busy[state.key] = min(1.0, (compute - before[0]) / (wall - before[1]))
            elif before is not None:
                self._busy[state.key] = 0.0   # no step finished this interval: waiting or stalled
            previous[state.key] = (compute, wall)
            loads[gpu_index(state, self._gpus)] = Load(self._busy.get(state.key, 0.0), memory_fraction=0.6)
        self._previous = previous
        self._busy = {k: v for k, v in self._busy.items() if k in previous}
        return loads
