"""A local stand-in for the pynvml module.

It exists because no NVIDIA GPU or driver is present where these tests run, so the
real pynvml cannot initialise. NvmlReader takes its NVML module by injection and is
handed a StandInNvml instead. The stand-in stays faithful to pynvml where the reader
can tell the difference:

- the same function names and argument order, for the subset the reader calls; any
  other pynvml function is missing here (AttributeError), as an unexpected call should be;
- the real constants, error classes and ctypes structures, taken from pynvml itself;
- device handles are real `c_nvmlDevice_t` pointers, event data a real
  `c_nvmlEventData_t`, samples real `c_nvmlSample_t` and so on;
- failures are the real `pynvml.NVMLError` subclasses, e.g.
  `pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)`, including NVML's own quirks:
  NOT_FOUND from nvmlDeviceGetSamples when no sample is newer than the timestamp given,
  per-value nvmlReturn codes from nvmlDeviceGetFieldValues, TIMEOUT from
  nvmlEventSetWait_v2 when no event arrives.

The driver version is the stand-in's; each GPU is a FakeGpu: its model, values, the functions it does not support, NVLink,
GPM, MIG, when it gets lost, and calls that hang until the test releases them. XID
events are delivered with `emit_xid`. Every device call is counted in `calls`.
"""
from __future__ import annotations

import ctypes
import inspect
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

GiB = 1024 ** 3
_ALL_LINKS = 0xFFFFFFFF
# GPU-instance profile id -> slices, for the profiles the stand-in offers.
_PROFILE_SLICES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: 7,
}


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    pci_bus_id: str = ""
    mem_total: int = 80 * GiB
    mem_used: int = 20 * GiB                      # as the v2 query counts it, without the reserve
    mem_reserved: int = 566 * 1024 ** 2           # None: a driver without the v2 query
    power_mw: int = 350_000
    energy_mj: int = 123_456_789
    temp_c: int = 55
    sm_clock: int = 1980
    mem_clock: int = 2619
    clock_reasons: int = 0
    # (CPU timestamp in microseconds, percent), as the driver's sample buffer holds them.
    util_samples: list[tuple[int, int]] = field(default_factory=list)
    mem_util_samples: list[tuple[int, int]] = field(default_factory=list)
    util_rates: tuple[int, int] = (0, 0)          # instant (gpu, memory) percent
    ecc_volatile: tuple[int, int] = (0, 0)        # (corrected, uncorrected)
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    unsupported: set[str] = field(default_factory=set)   # pynvml function names
    nvlink_links: int = 0                         # active links; 0 = no NVLink
    nvlink_tx_kib: int = 0
    nvlink_rx_kib: int = 0
    gpm: dict[int, float] | None = None           # GPM metric id -> percent; None = pre-Hopper
    mig: list[tuple[str, int]] | None = None      # (MIG UUID, slices); None = not MIG-capable
    total_slices: int = 7
    xid_supported: bool = True
    old_driver: bool = False                      # no nvmlDeviceGetCurrentClocksEventReasons
    memory_temp_c: int | None = 62                # None: no HBM sensor (NOT_SUPPORTED per value)
    pcie_replays: int = 0
    encoder: tuple[int, int] = (0, 167_000)       # (percent, sampling period µs)
    decoder: tuple[int, int] = (0, 167_000)
    virtualization: int = pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE
    vgpu_licensed: bool = False
    pcie_kib_s: tuple[int, int] = (102_400, 1_048_576)   # (tx, rx)
    violation_ns: tuple[int, int] = (0, 0)        # (power, thermal), cumulative
    max_clocks: tuple[int, int] = (1980, 2619)    # (SM, memory) MHz
    power_limit_mw: int = 700_000
    lost_after: int | None = None                 # device calls answered before GPU_IS_LOST


class StandInNvml:
    """Stands in for the pynvml module; see the module docstring."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "580.95.05") -> None:
        self.gpus = gpus
        self.driver = driver
        for i, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-{i:08d}-0000-0000-0000-000000000000"
            gpu.pci_bus_id = gpu.pci_bus_id or f"00000000:{0x18 + i:02X}:00.0"
        self.initialized = False
        self.calls: Counter[tuple[int, str]] = Counter()
        self._lock = threading.Lock()
        self._handles = [ctypes.pointer(pynvml.struct_c_nvmlDevice_t()) for _ in gpus]
        self._by_address = {_address(h): i for i, h in enumerate(self._handles)}
        self._mig_handles: dict[int, tuple[int, int]] = {}     # address -> (gpu, slot)
        self._mig_objects: dict[tuple[int, int], Any] = {}
        self._hangs: dict[tuple[int, str], threading.Event] = {}
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._registered: set[int] = set()
        self.event_sets_freed = 0
        self.gpm_samples: dict[int, tuple[int, int, dict[int, float]] | None] = {}
        self._gpm_seq = 0

    def __getattr__(self, name: str) -> Any:
        """pynvml's constants, error classes and structures; never its functions."""
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"the stand-in does not implement {name}")
        return value

    # --- test controls -------------------------------------------------------------------

    def hang(self, index: int, function: str) -> threading.Event:
        """The next call of `function` on GPU `index` blocks until the event is set."""
        release = threading.Event()
        self._hangs[(index, function)] = release
        return release

    def lose(self, index: int) -> None:
        """GPU `index` falls off the bus now."""
        self.gpus[index].lost_after = self.device_calls(index)

    def device_calls(self, index: int) -> int:
        return sum(n for (i, _), n in self.calls.items() if i == index)

    def emit_xid(self, index: int, code: int) -> None:
        """The driver reports XID `code` on GPU `index` (delivered if it was registered)."""
        if index in self._registered:
            self._events.put((index, code))

    # --- plumbing ------------------------------------------------------------------------

    def _check_init(self) -> None:
        if not self.initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: Any, function: str) -> tuple[int, FakeGpu]:
        """Count one call on a device and fail or hang it as that GPU is configured to."""
        self._check_init()
        index = self._by_address.get(_address(handle))
        if index is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        with self._lock:
            answered = self.device_calls(index)
            self.calls[(index, function)] += 1
        release = self._hangs.pop((index, function), None)
        if release is not None:
            release.wait()
        if gpu.lost_after is not None and answered >= gpu.lost_after:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return index, gpu

    # --- init and identity -----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._device(self._handles[index], "nvmlDeviceGetHandleByIndex")
        return self._handles[index]

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """/dev/nvidiaN's N: the stand-in numbers GPUs in reverse, so a minor is never
        mistaken for the NVML index."""
        index = self._device(handle, "nvmlDeviceGetMinorNumber")[0]
        return len(self.gpus) - 1 - index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetName")[1].name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        mig = self._mig_handles.get(_address(handle))
        if mig is not None:
            gpu_index, slot = mig
            return self.gpus[gpu_index].mig[slot][0]
        return self._device(handle, "nvmlDeviceGetUUID")[1].uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        gpu = self._device(handle, "nvmlDeviceGetPciInfo")[1]
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        return info

    # --- values ----------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        """v1 counts the driver's reserve as used; v2 (nvmlDeviceGetMemoryInfo_v2) reports it
        apart. A driver before v2 lacks the function: FUNCTION_NOT_FOUND, as pynvml raises."""
        if not version:
            gpu = self._device(handle, "nvmlDeviceGetMemoryInfo")[1]
            reserved = gpu.mem_reserved or 0
            return pynvml.c_nvmlMemory_t(total=gpu.mem_total, free=gpu.mem_total - gpu.mem_used - reserved,
                                         used=gpu.mem_used + reserved)
        gpu = self._device(handle, "nvmlDeviceGetMemoryInfo_v2")[1]
        if gpu.mem_reserved is None:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != pynvml.nvmlMemory_v2:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return pynvml.c_nvmlMemory_v2_t(version=version, total=gpu.mem_total, reserved=gpu.mem_reserved,
                                        free=gpu.mem_total - gpu.mem_used - gpu.mem_reserved, used=gpu.mem_used)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetPcieReplayCounter")[1].pcie_replays

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        return list(self._device(handle, "nvmlDeviceGetEncoderUtilization")[1].encoder)

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        return list(self._device(handle, "nvmlDeviceGetDecoderUtilization")[1].decoder)

    def nvmlDeviceGetVirtualizationMode(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetVirtualizationMode")[1].virtualization

    def nvmlDeviceGetGridLicensableFeatures_v4(self, handle: Any) -> Any:
        gpu = self._device(handle, "nvmlDeviceGetGridLicensableFeatures_v4")[1]
        features = pynvml.c_nvmlGridLicensableFeatures_v4_t()
        features.isGridLicenseSupported = 1
        features.licensableFeaturesCount = 1
        features.gridLicensableFeatures[0].featureCode = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_COMPUTE
        features.gridLicensableFeatures[0].featureState = int(gpu.vgpu_licensed)
        return features

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu = self._device(device, "nvmlDeviceGetPcieThroughput")[1]
        if counter not in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.pcie_kib_s[counter]

    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> Any:
        gpu = self._device(device, "nvmlDeviceGetViolationStatus")[1]
        policies = {pynvml.NVML_PERF_POLICY_POWER: 0, pynvml.NVML_PERF_POLICY_THERMAL: 1}
        if perfPolicyType not in policies:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.c_nvmlViolationTime_t(referenceTime=1_700_000_000_000_000,
                                            violationTime=gpu.violation_ns[policies[perfPolicyType]])

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMaxClockInfo")[1]
        clocks = {pynvml.NVML_CLOCK_SM: gpu.max_clocks[0], pynvml.NVML_CLOCK_MEM: gpu.max_clocks[1]}
        if type not in clocks:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return clocks[type]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetEnforcedPowerLimit")[1].power_limit_mw

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetPowerUsage")[1].power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetTotalEnergyConsumption")[1].energy_mj

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTemperature")[1]
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_c

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._device(handle, "nvmlDeviceGetClockInfo")[1]
        clocks = {pynvml.NVML_CLOCK_SM: gpu.sm_clock, pynvml.NVML_CLOCK_MEM: gpu.mem_clock}
        if type not in clocks:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return clocks[type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons")[1]
        if gpu.old_driver:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return gpu.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")[1].clock_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTotalEccErrors")[1]
        if counterType != pynvml.NVML_VOLATILE_ECC:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc_volatile[errorType]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._device(handle, "nvmlDeviceGetRemappedRows")[1].remapped_rows

    def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> tuple[int, list]:
        gpu = self._device(device, "nvmlDeviceGetSamples")[1]
        buffers = {pynvml.NVML_GPU_UTILIZATION_SAMPLES: gpu.util_samples,
                   pynvml.NVML_MEMORY_UTILIZATION_SAMPLES: gpu.mem_util_samples}
        newer = [(ts, v) for ts, v in buffers[sampling_type] if ts > timeStamp]
        if not newer:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        samples = []
        for ts, value in newer:
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = ts
            sample.sampleValue.uiVal = value
            samples.append(sample)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, samples

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        gpu = self._device(handle, "nvmlDeviceGetUtilizationRates")[1]
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_rates[0], memory=gpu.util_rates[1])

    # --- NVLink ----------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list) -> Any:
        gpu = self._device(handle, "nvmlDeviceGetFieldValues")[1]
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for value, requested in zip(values, fieldIds):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            value.fieldId, value.scopeId = field_id, scope
            value.nvmlReturn = pynvml.NVML_SUCCESS
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temp_c is not None:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.memory_temp_c
            elif not gpu.nvlink_links:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.nvlink_links
            elif field_id in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                              pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) and scope == _ALL_LINKS:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                tx = field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                value.value.ullVal = gpu.nvlink_tx_kib if tx else gpu.nvlink_rx_kib
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._device(device, "nvmlDeviceGetNvLinkState")[1]
        if not 0 <= link < gpu.nvlink_links:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    # --- GPM -------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> pynvml.c_nvmlGpmSupport_t:
        gpu = self._device(device, "nvmlGpmQueryDeviceSupport")[1]
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm is not None)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check_init()
        sample = ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        self.gpm_samples[_address(sample)] = None
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self.gpm_samples.pop(_address(gpmSample))

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        index, gpu = self._device(device, "nvmlGpmSampleGet")
        self._gpm_seq += 1
        self.gpm_samples[_address(gpmSample)] = (self._gpm_seq, index, dict(gpu.gpm or {}))
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Metrics over the interval between sample1 (older) and sample2 (newer); the values
        are those the GPU was set to when sample2 was taken."""
        self._check_init()
        first = self.gpm_samples.get(_address(metricsGet.sample1))
        second = self.gpm_samples.get(_address(metricsGet.sample2))
        if (metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION or first is None or second is None
                or first[1] != second[1] or first[0] >= second[0]):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId in second[2]:
                metric.value = second[2][metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    # --- XID events ------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._check_init()
        return ctypes.pointer(pynvml.struct_c_nvmlEventSet_t())

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        index, gpu = self._device(handle, "nvmlDeviceRegisterEvents")
        if not gpu.xid_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if eventTypes & pynvml.nvmlEventTypeXidCriticalError:
            self._registered.add(index)

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> pynvml.c_nvmlEventData_t:
        self._check_init()
        try:
            index, code = self._events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise _error(pynvml.NVML_ERROR_TIMEOUT) from None
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handles[index]
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = code
        return data

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self.event_sets_freed += 1

    # --- MIG -------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._device(device, "nvmlDeviceGetMigMode")[1]
        if gpu.mig is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        return self._device(device, "nvmlDeviceGetMaxMigDeviceCount")[1].total_slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu_index, gpu = self._device(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < len(gpu.mig or []):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        key = (gpu_index, index)
        if key not in self._mig_objects:
            handle = ctypes.pointer(pynvml.struct_c_nvmlDevice_t())
            self._mig_objects[key] = handle
            self._mig_handles[_address(handle)] = key
        return self._mig_objects[key]

    def nvmlDeviceGetAttributes(self, device: Any) -> pynvml.c_nvmlDeviceAttributes:
        self._check_init()
        key = self._mig_handles.get(_address(device))
        if key is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu_index, slot = key
        return pynvml.c_nvmlDeviceAttributes(gpuInstanceSliceCount=self.gpus[gpu_index].mig[slot][1])

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        gpu = self._device(device, "nvmlDeviceGetGpuInstanceProfileInfo")[1]
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = _PROFILE_SLICES.get(profile, 0)
        if not slices or slices > gpu.total_slices or (slices == 3 and gpu.total_slices == 4):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = profile, slices
        return info
