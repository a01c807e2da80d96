"""The NVML GPU reader: one GpuReading per GPU, in dcgm-exporter's units.

Each GPU is read on its own daemon thread with a deadline. NVML calls can hang in the
driver (a GPU falling off the bus, a wedged firmware call); a hung call then holds
only its own GPU, which reports up=False with error "timeout" and gets no new call
until the hung one returns.
"""
from __future__ import annotations

import functools
import math
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, TypeVar

import pynvml

from burnrate.exporter.snapshot import UNKNOWN, GpuIdentity, GpuReading, frozen
from ..thread_names import name_thread
from . import compat
from .compat import put
from .gpm import GpmSampler, gpm_supported
from .xid import XidWatcher

T = TypeVar("T")

# What costs a large share of a read's CPU in the driver (on an H200: total energy 3.7 ms,
# GPM's metrics from two samples 2.0 ms, each violation counter 1.1 ms, the PCIe replay
# counter 0.5 ms, the MIG mode 0.3 ms, where a plain field costs 4-10 us) is read every
# SLOW_EVERY_S and held between: a scrape every 15 s sees it at most that old, and GPM's
# activities then cover the 10 s before their last sample. The maximum clocks (1.6 ms each)
# are the board's and read once.
SLOW_EVERY_S = 10.0
# NVML's utilization rate covers the driver's last sample period, 1/6 s to 1 s by product.
SAMPLED_MEAN_AFTER_S = 1.5

_KIB = 1024
# scopeId that asks NVML for a field summed over all NVLink links.
_ALL_LINKS = 0xFFFFFFFF


class _Lane:
    """One daemon thread running one GPU's NVML calls in order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: Future | None = None   # an abandoned call still running in the driver
        threading.Thread(target=self._run, args=(name,), name=name, daemon=True).start()

    def _run(self, name: str) -> None:
        name_thread(name)
        while (item := self._queue.get()) is not None:
            fn, future = item
            try:
                future.set_result(fn())
            except Exception as exc:  # handed to the caller through the future
                future.set_exception(exc)

    def submit(self, fn: Callable[[], T]) -> Future:
        future: Future = Future()
        self._queue.put((fn, future))
        return future

    def busy(self) -> bool:
        if self.pending is not None and self.pending.done():
            self.pending = None
        return self.pending is not None

    def stop(self) -> None:
        self._queue.put(None)


@dataclass
class _Gpu:
    """One GPU's state. Only its lane thread changes it, so it needs no lock."""

    index: int
    lane: _Lane
    identity: GpuIdentity
    handle: Any = None
    probed: bool = False
    xid: bool = False
    nvlink: bool = False
    gpm: GpmSampler | None = None
    minor: int | None = None
    unsupported: set[str] = field(default_factory=set)
    sample_ts: dict[str, int] = field(default_factory=dict)
    last_read: float | None = None
    held: dict[tuple, tuple[float, Any]] = field(default_factory=dict)
    nvlink_prev: tuple[float, int, int] | None = None
    mig_slices: int = 0
    mig: Mapping[str, tuple[str, float]] = field(default_factory=lambda: MappingProxyType({}))


class NvmlReader:
    """GpuReader over NVML.

    nvml: the pynvml module, or a stand-in with the same functions and constants.
    call_timeout: seconds one read() may take; a GPU whose calls overrun is reported
        down with error "timeout".
    event_wait_ms: how long the XID thread blocks per wait, which bounds close().
    clock: monotonic seconds, for the NVLink rate.

    Raises pynvml.NVMLError when NVML itself cannot start (no driver).
    """

    needs_interval = True

    def __init__(self, nvml: Any = pynvml, call_timeout: float = 2.0, event_wait_ms: int = 500,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._timeout = call_timeout
        self._clock = clock
        self._closed = False
        nvml.nvmlInit()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError:
            nvml.nvmlShutdown()
            raise
        try:
            self._driver = str(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self._driver = ""
        self._xid = XidWatcher(nvml, event_wait_ms)
        self._failures = {nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED}
        self._value_fields = {
            nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
        }
        self._gpus = [
            _Gpu(i, _Lane(f"nvml-gpu{i}"), GpuIdentity(i, UNKNOWN, UNKNOWN, UNKNOWN))
            for i in range(count)
        ]

    # --- GpuReader ---------------------------------------------------------------------

    def read(self) -> list[GpuReading]:
        deadline = time.monotonic() + self._timeout
        futures = [None if g.lane.busy() else g.lane.submit(lambda g=g: self._read_gpu(g))
                   for g in self._gpus]
        readings = []
        for gpu, future in zip(self._gpus, futures):
            if future is None:
                readings.append(self._down(gpu, "timeout"))
                continue
            try:
                readings.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                gpu.lane.pending = future
                readings.append(self._down(gpu, "timeout"))
            except Exception as exc:  # one GPU's failure must not cost the others their reading
                readings.append(self._down(gpu, f"{type(exc).__name__}: {exc}"))
        return readings

    def gpu_minors(self) -> Mapping[int, str]:
        """Minor numbers as of the last read(); no NVML call, so it cannot hang."""
        return frozen({g.minor: g.identity.uuid for g in self._gpus if g.minor is not None})

    def mig_devices(self) -> Mapping[str, tuple[str, float]]:
        """MIG devices as of the last read(); no NVML call, so it cannot hang."""
        merged: dict[str, tuple[str, float]] = {}
        for gpu in self._gpus:
            merged.update(gpu.mig)
        return frozen(merged)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._xid.close()
        hung = False
        for gpu in self._gpus:
            gpu.lane.stop()
            if gpu.lane.busy():
                hung = True
            elif gpu.gpm is not None:
                gpu.gpm.close()
        if not hung:
            # Shutting NVML down under a call still in the driver is not safe.
            self._nvml.nvmlShutdown()

    @property
    def xid_running(self) -> bool:
        return self._xid.running

    # --- one GPU, on its lane ---------------------------------------------------------------

    def _read_gpu(self, gpu: _Gpu) -> GpuReading:
        nvml = self._nvml
        try:
            self._identify(gpu)
            h = gpu.handle
            optional = functools.partial(self._optional, gpu)
            slow = functools.partial(self._held, gpu, SLOW_EVERY_S)
            fixed = functools.partial(self._held, gpu, math.inf)
            fields: dict[str, float] = {}
            now, since = self._clock(), gpu.last_read
            gpu.last_read = now
            # Memory is the one value every NVML GPU gives; if it fails the GPU is not answering.
            compat.memory(nvml, h, optional, fields)
            self._utilization(gpu, fields, None if since is None else now - since)
            put(fields, "power_w", optional("power", nvml.nvmlDeviceGetPowerUsage, h), 1e-3)
            put(fields, "energy_mj", slow("energy", nvml.nvmlDeviceGetTotalEnergyConsumption, h))
            put(fields, "temp_c", optional("temperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU))
            put(fields, "sm_clock_mhz", optional("sm_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM))
            put(fields, "mem_clock_mhz", optional("mem_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM))
            put(fields, "throttle_reasons", self._clock_reasons(gpu))
            self._errors(gpu, fields)
            compat.read(nvml, h, compat.Calls(optional, slow, fixed), self._value, fields, gpm=gpu.gpm is not None)
            nvlink_bytes = optional("nvlink", self._nvlink, gpu, fields) or {}
            if gpu.gpm is not None:
                fields.update(slow("gpm", gpu.gpm.read) or {})
            gpu.mig = slow("mig", self._mig, gpu)
        except nvml.NVMLError as exc:
            return self._down(gpu, str(exc))
        xid_counts, last_xid = self._xid.counts(gpu.handle) if gpu.xid else ({}, None)
        return GpuReading(gpu.identity, True, frozen(fields), frozen(nvlink_bytes),
                          frozen(xid_counts), last_xid)

    def _identify(self, gpu: _Gpu) -> None:
        nvml = self._nvml
        if gpu.handle is None:
            gpu.handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        h = gpu.handle
        if gpu.identity.uuid == UNKNOWN:
            gpu.identity = GpuIdentity(gpu.index, nvml.nvmlDeviceGetUUID(h),
                                       nvml.nvmlDeviceGetPciInfo(h).busId, nvml.nvmlDeviceGetName(h),
                                       self._driver)
        if not gpu.probed:
            gpu.minor = self._optional(gpu, "minor", nvml.nvmlDeviceGetMinorNumber, h)
            # Optional features, looked at once; one that errors here stays off.
            gpu.xid = bool(self._optional(gpu, "xid", self._xid.register, h))
            gpu.nvlink = bool(self._optional(gpu, "nvlink", self._has_nvlink, h))
            if self._optional(gpu, "gpm", gpm_supported, nvml, h):
                gpu.gpm = GpmSampler(nvml, h)
            gpu.probed = True

    def _down(self, gpu: _Gpu, error: str) -> GpuReading:
        xid_counts, last_xid = self._xid.counts(gpu.handle) if gpu.xid else ({}, None)
        return GpuReading(gpu.identity, False, xid_counts=frozen(xid_counts), last_xid=last_xid,
                          error=error)

    def _optional(self, gpu: _Gpu, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        """A value the GPU may not have: None if unsupported (remembered, never asked again)
        or failing this time; a lost GPU still raises."""
        nvml = self._nvml
        if key in gpu.unsupported:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if exc.value in self._failures:
                raise
            if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                gpu.unsupported.add(key)
            return None

    def _held(self, gpu: _Gpu, every_s: float, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        """_optional's answer, asked again only once `every_s` seconds have passed since."""
        now, cache_key = self._clock(), (key, *args[1:])
        held = gpu.held.get(cache_key)
        if held is not None and now - held[0] < every_s:
            return held[1]
        value = self._optional(gpu, key, fn, *args)
        if value is not None:
            gpu.held[cache_key] = (now, value)
        return value

    def _value(self, value_type: int, value: Any) -> float:
        return getattr(value, self._value_fields[value_type])

    def _utilization(self, gpu: _Gpu, fields: dict[str, float], since: float | None) -> None:
        """Over an interval longer than the driver's own sample period, the mean of its samples;
        over a shorter one its current rate, which covers most of the interval already and
        costs a thousandth of reading the samples (about 2.5 ms of CPU each on an H200)."""
        nvml = self._nvml
        if since is None or since > SAMPLED_MEAN_AFTER_S:
            for key, sampling in (("gpu_util", nvml.NVML_GPU_UTILIZATION_SAMPLES),
                                  ("mem_copy_util", nvml.NVML_MEMORY_UTILIZATION_SAMPLES)):
                put(fields, key, self._sampled_mean(gpu, key, sampling))
        if "gpu_util" in fields and "mem_copy_util" in fields:
            return
        rates = self._optional(gpu, "utilization_rates", nvml.nvmlDeviceGetUtilizationRates, gpu.handle)
        if rates is not None:
            fields.setdefault("gpu_util", rates.gpu)
            fields.setdefault("mem_copy_util", rates.memory)

    def _sampled_mean(self, gpu: _Gpu, key: str, sampling: int) -> float | None:
        """Mean of the driver's utilization samples since the last read, so a 10 s interval
        is not judged by one instant. None when there are none: NVML's sample buffer runs
        dry while the GPU idles (NOT_FOUND), and the instant rate then stands in."""
        nvml = self._nvml
        result = self._optional(gpu, f"samples:{key}", nvml.nvmlDeviceGetSamples,
                                gpu.handle, sampling, gpu.sample_ts.get(key, 0))
        if not result or not result[1]:
            return None
        value_type, samples = result
        gpu.sample_ts[key] = max(s.timeStamp for s in samples)
        return sum(self._value(value_type, s.sampleValue) for s in samples) / len(samples)

    def _clock_reasons(self, gpu: _Gpu) -> int | None:
        nvml = self._nvml
        if "clocks_event_reasons" not in gpu.unsupported:
            try:
                return nvml.nvmlDeviceGetCurrentClocksEventReasons(gpu.handle)
            except nvml.NVMLError as exc:
                if exc.value in self._failures:
                    raise
                if exc.value not in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                    return None
                # Drivers before R535 know the same bitmask only by its older name.
                gpu.unsupported.add("clocks_event_reasons")
        return self._optional(gpu, "clocks_throttle_reasons",
                              nvml.nvmlDeviceGetCurrentClocksThrottleReasons, gpu.handle)

    def _errors(self, gpu: _Gpu, fields: dict[str, float]) -> None:
        nvml = self._nvml
        h = gpu.handle
        for key, error_type in (("ecc_sbe_volatile", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                ("ecc_dbe_volatile", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            put(fields, key, self._optional(gpu, "ecc", nvml.nvmlDeviceGetTotalEccErrors,
                                                  h, error_type, nvml.NVML_VOLATILE_ECC))
        rows = self._optional(gpu, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            correctable, uncorrectable, _pending, failure = rows
            fields.update(remapped_rows_correctable=correctable, remapped_rows_uncorrectable=uncorrectable,
                          row_remap_failure=failure)

    # --- NVLink ------------------------------------------------------------------------------

    def _has_nvlink(self, handle: Any) -> bool:
        """True when at least one NVLink link is up; a PCIe card that merely could take a
        bridge has links in hardware but none active."""
        nvml = self._nvml
        (count,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        if count.nvmlReturn != nvml.NVML_SUCCESS:
            return False
        for link in range(int(self._value(count.valueType, count.value))):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                    return True
            except nvml.NVMLError as exc:
                if exc.value in self._failures:
                    raise
        return False

    def _nvlink(self, gpu: _Gpu, fields: dict[str, float]) -> dict[str, float]:
        """Cumulative NVLink data bytes per direction, plus dcgm-exporter's rate.

        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX count payload KiB since driver load,
        summed over all links with scopeId UINT_MAX. DCGM's DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL
        (field 449, which dcgm-exporter publishes) reads these same two counters, sums TX
        and RX, divides the difference by the seconds between its two reads and then by
        1000, and labels the result MB/s. The rate here is computed the same way so that
        dashboards built on dcgm-exporter read the same numbers.
        """
        nvml = self._nvml
        if not gpu.nvlink:
            return {}
        now = self._clock()
        tx, rx = nvml.nvmlDeviceGetFieldValues(gpu.handle, [
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ])
        if tx.nvmlReturn != nvml.NVML_SUCCESS or rx.nvmlReturn != nvml.NVML_SUCCESS:
            if nvml.NVML_ERROR_NOT_SUPPORTED in (tx.nvmlReturn, rx.nvmlReturn):
                gpu.nvlink = False
            return {}
        tx_kib = int(self._value(tx.valueType, tx.value))
        rx_kib = int(self._value(rx.valueType, rx.value))
        if gpu.nvlink_prev is not None:
            then, tx0, rx0 = gpu.nvlink_prev
            delta_kib = (tx_kib - tx0) + (rx_kib - rx0)
            # A negative delta means the counters restarted (driver reload): no rate this time.
            if now > then and delta_kib >= 0:
                fields["nvlink_bandwidth_mbps"] = delta_kib / (now - then) / 1000.0
        gpu.nvlink_prev = (now, tx_kib, rx_kib)
        return {"tx": float(tx_kib * _KIB), "rx": float(rx_kib * _KIB)}

    # --- MIG -----------------------------------------------------------------------------------

    def _mig(self, gpu: _Gpu) -> Mapping[str, tuple[str, float]]:
        """MIG device UUID -> (this GPU's UUID, share of its slices)."""
        nvml = self._nvml
        h = gpu.handle
        mode = self._optional(gpu, "mig_mode", nvml.nvmlDeviceGetMigMode, h)
        if mode is None or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return MappingProxyType({})
        try:
            if not gpu.mig_slices:
                gpu.mig_slices = self._total_slices(h)
            devices: dict[str, tuple[str, float]] = {}
            for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
                except nvml.NVMLError as exc:
                    if exc.value == nvml.NVML_ERROR_NOT_FOUND:   # an empty slot
                        continue
                    raise
                slices = nvml.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount
                devices[nvml.nvmlDeviceGetUUID(mig)] = (gpu.identity.uuid, slices / gpu.mig_slices)
        except nvml.NVMLError as exc:
            if exc.value in self._failures:
                raise
            return gpu.mig   # keep the last good mapping
        return MappingProxyType(devices)

    def _total_slices(self, handle: Any) -> int:
        """Slices in the whole GPU: the largest GPU-instance profile it offers (7 on A100 and
        H100, 4 on A30). Profiles a GPU lacks answer NOT_SUPPORTED or INVALID_ARGUMENT."""
        nvml = self._nvml
        largest = 0
        for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                largest = max(largest, nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile).sliceCount)
            except nvml.NVMLError as exc:
                if exc.value in self._failures:
                    raise
        if not largest:
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        return largest

