"""The agent's NVML reader against `nvidia-smi -q -x` on the same GPU: the fields that
`--query-gpu` has no column for (maximum clocks, the enforced power limit, the clock event
reasons and their counters, ECC, remapped rows, PCIe replays).

nvidia-smi writes values with their units ("1980 MHz", "700.00 W", "168480 us") and states
as words ("Active", "No"); each is read back into the reader's field and unit.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pynvml

from smi import PAIRS as QUERY_PAIRS, Pair

# nvidia-smi's clock event reason, under <clocks_event_reasons>, -> NVML's bit.
REASONS = {
    "clocks_event_reason_gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "clocks_event_reason_applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "clocks_event_reason_sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "clocks_event_reason_hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "clocks_event_reason_sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "clocks_event_reason_sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "clocks_event_reason_hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "clocks_event_reason_hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "clocks_event_reason_display_clocks_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

# A counter of time under the power cap grows by at most the seconds between the two reads.
PAIRS = (
    Pair("max_sm_clock_mhz", "max_clocks/sm_clock", 0.0),
    Pair("max_mem_clock_mhz", "max_clocks/mem_clock", 0.0),
    Pair("enforced_power_limit_w", "gpu_power_readings/current_power_limit", 0.5),
    Pair("power_violation_ns", "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_power_cap", 2e9),
    Pair("throttle_reasons", "clocks_event_reasons", 0.0),   # REASONS' bits of the reasons "Active"
    Pair("ecc_sbe_volatile", "ecc_errors/volatile (correctable)", 0.0),
    Pair("ecc_dbe_volatile", "ecc_errors/volatile (uncorrectable)", 0.0),
    Pair("remapped_rows_correctable", "remapped_rows/remapped_row_corr", 0.0),
    Pair("remapped_rows_uncorrectable", "remapped_rows/remapped_row_unc", 0.0),
    Pair("row_remap_failure", "remapped_rows/remapped_row_failure", 0.0),
    Pair("pcie_replay", "pci/replay_counter", 0.0),
)
assert not {p.field for p in PAIRS} & {p.field for p in QUERY_PAIRS}, "each field is compared once"

_SCALE = {"MHz": 1.0, "W": 1.0, "us": 1e3}   # to the reader's MHz, W and ns
REASONS_PATH = "clocks_event_reasons"
# NVML's volatile totals, as the sums of what nvidia-smi lists under <ecc_errors><volatile>.
ECC = {"ecc_errors/volatile (correctable)": ("sram_correctable", "dram_correctable"),
       "ecc_errors/volatile (uncorrectable)": ("sram_uncorrectable_parity", "sram_uncorrectable_secded",
                                               "dram_uncorrectable")}


def parse(text: str) -> dict[str, dict[str, float | None]]:
    """GPU UUID -> {PAIRS' nvidia-smi name: value in the reader's unit, None where N/A}."""
    out = {}
    for gpu in ET.fromstring(text).iter("gpu"):
        values: dict[str, float | None] = {p.smi: _value(gpu.findtext(p.smi)) for p in PAIRS
                                           if p.smi != REASONS_PATH and p.smi not in ECC}
        reasons = gpu.find(REASONS_PATH)
        values[REASONS_PATH] = None if reasons is None else float(sum(
            bit for tag, bit in REASONS.items() if (reasons.findtext(tag) or "").strip() == "Active"))
        volatile = gpu.find("ecc_errors/volatile")
        for name, tags in ECC.items():
            counts = [_value(volatile.findtext(t)) if volatile is not None else None for t in tags]
            values[name] = None if None in counts else sum(counts)
        out[(gpu.findtext("uuid") or "").strip()] = values
    return out


def _value(text: str | None) -> float | None:
    """"1980 MHz" -> 1980.0, "168480 us" -> 168480000.0 (ns), "No" -> 0, "Yes" -> 1; N/A -> None."""
    if text is None:
        return None
    words = text.split()
    if words in (["No"], ["Yes"]):
        return float(words == ["Yes"])
    try:
        number = float(words[0])
    except (IndexError, ValueError):
        return None
    return number * _SCALE.get(words[1], 1.0) if len(words) > 1 else number
