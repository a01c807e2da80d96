"""The device fields read for dcgm-exporter compatibility rather than for burnrate's
analysis: the rest of its default counters and the fields a counters file may turn on.
Each is read as DCGM reads it from NVML, so dashboards built on dcgm-exporter see the
same numbers; a field the GPU does not have stays absent.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

_MIB = 1024 * 1024
# NVML's PCIe throughput sensor answers in KiB/s, over a 20 ms window.
_KIB = 1024

OptionalCall = Callable[..., Any]   # NvmlReader._optional bound to one GPU


class Calls(NamedTuple):
    """How one GPU's NVML is asked, each as `call(key, fn, *args)`: None when unsupported
    (remembered) or failing this time."""
    every_read: OptionalCall
    slow: OptionalCall     # held between reads for NvmlReader's SLOW_EVERY_S
    fixed: OptionalCall    # asked once


def read(nvml: Any, handle: Any, calls: Calls, value: Callable[[int, Any], float],
         fields: dict[str, float], gpm: bool) -> None:
    """Add what this GPU gives of the compatibility fields to `fields`. `value` reads an NVML
    value union by its type; `gpm` says the GPM sampler supplies the PCIe rates."""
    optional = calls.every_read
    temps = optional("memory_temp", nvml.nvmlDeviceGetFieldValues, handle, [nvml.NVML_FI_DEV_MEMORY_TEMP])
    if temps is not None and temps[0].nvmlReturn == nvml.NVML_SUCCESS:
        fields["memory_temp_c"] = value(temps[0].valueType, temps[0].value)
    put(fields, "pcie_replay", calls.slow("pcie_replay", nvml.nvmlDeviceGetPcieReplayCounter, handle))
    for key, fn in (("enc_util", nvml.nvmlDeviceGetEncoderUtilization),
                    ("dec_util", nvml.nvmlDeviceGetDecoderUtilization)):
        answer = optional(key, fn, handle)
        if answer is not None:
            fields[key] = answer[0]   # (percent, sampling period in µs)
    put(fields, "vgpu_license", _vgpu_license(nvml, handle, optional))
    if not gpm:
        for key, counter in (("pcie_tx_bytes_per_s", nvml.NVML_PCIE_UTIL_TX_BYTES),
                             ("pcie_rx_bytes_per_s", nvml.NVML_PCIE_UTIL_RX_BYTES)):
            put(fields, key, optional("pcie_throughput", nvml.nvmlDeviceGetPcieThroughput, handle, counter), _KIB)
    for key, policy in (("power_violation_ns", nvml.NVML_PERF_POLICY_POWER),
                        ("thermal_violation_ns", nvml.NVML_PERF_POLICY_THERMAL)):
        status = calls.slow("violation", nvml.nvmlDeviceGetViolationStatus, handle, policy)
        if status is not None:
            fields[key] = status.violationTime
    for key, clock in (("max_sm_clock_mhz", nvml.NVML_CLOCK_SM), ("max_mem_clock_mhz", nvml.NVML_CLOCK_MEM)):
        put(fields, key, calls.fixed("max_clock", nvml.nvmlDeviceGetMaxClockInfo, handle, clock))
    put(fields, "enforced_power_limit_w", optional("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle),
         1e-3)


def memory(nvml: Any, handle: Any, optional: OptionalCall, fields: dict[str, float]) -> None:
    """Framebuffer use. The v2 query splits out what the driver reserves, as DCGM reports
    it (used then excludes it); drivers without v2 give used and free only."""
    mem = optional("memory_v2", nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2)
    if mem is not None:
        fields["fb_reserved_mib"] = mem.reserved / _MIB
    else:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    fields.update(fb_used_mib=mem.used / _MIB, fb_free_mib=mem.free / _MIB, fb_total_mib=mem.total / _MIB)


def _vgpu_license(nvml: Any, handle: Any, optional: OptionalCall) -> int | None:
    """1 when a vGPU guest holds a license; 0 when it does not, or is no vGPU at all
    (bare metal and passthrough), which is what dcgm-exporter reports there."""
    mode = optional("virtualization", nvml.nvmlDeviceGetVirtualizationMode, handle)
    if mode is None:
        return None
    if mode != nvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU:
        return 0
    features = optional("grid_license", nvml.nvmlDeviceGetGridLicensableFeatures_v4, handle)
    if features is None:
        return None
    states = features.gridLicensableFeatures[:features.licensableFeaturesCount]
    return int(any(f.featureState for f in states))


def put(fields: dict[str, float], key: str, value: float | None, scale: float = 1.0) -> None:
    if value is not None:
        fields[key] = value * scale
