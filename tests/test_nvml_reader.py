"""NvmlReader against a pynvml stand-in (no GPU exists where these tests run)."""
from __future__ import annotations

import time
from typing import Callable, Iterator

import pynvml
import pytest

from burnrate.agent.gpu.nvml import SLOW_EVERY_S, NvmlReader
from burnrate.exporter.snapshot import GpuReading
from burnrate.exporter.catalog import GPU_FIELDS
from tests.nvml_standin import GiB, FakeGpu, StandInNvml

HOPPER_GPM = {
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 40.0,
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 90.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 25.0,
}
# Every GPM metric the reader asks for: percents, and MiB/s for the traffic.
FULL_GPM = {**HOPPER_GPM, pynvml.NVML_GPM_METRIC_SM_UTIL: 80.0, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0,
            pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.0, pynvml.NVML_GPM_METRIC_FP32_UTIL: 12.0,
            pynvml.NVML_GPM_METRIC_FP16_UTIL: 3.0, pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 100.0,
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 2048.0, pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 40960.0,
            pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 40000.0}

MakeReader = Callable[..., tuple[StandInNvml, NvmlReader]]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make() -> Iterator[MakeReader]:
    readers: list[NvmlReader] = []

    def build(*gpus: FakeGpu, **kwargs) -> tuple[StandInNvml, NvmlReader]:
        nvml = StandInNvml(list(gpus))
        kwargs.setdefault("event_wait_ms", 20)
        reader = NvmlReader(nvml=nvml, **kwargs)
        readers.append(reader)
        return nvml, reader

    yield build
    for reader in readers:
        reader.close()


def wait_for(reader: NvmlReader, done: Callable[[list[GpuReading]], bool], seconds: float = 2.0
             ) -> list[GpuReading]:
    end = time.monotonic() + seconds
    while True:
        readings = reader.read()
        if done(readings) or time.monotonic() > end:
            return readings
        time.sleep(0.01)


def test_identity_values_and_units(make: MakeReader) -> None:
    gpu = FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:18:00.0", mem_total=80 * GiB, mem_used=20 * GiB,
                  power_mw=351_250, energy_mj=9_876_543_210, temp_c=61, sm_clock=1755, mem_clock=2619,
                  clock_reasons=0x4, ecc_volatile=(3, 1), remapped_rows=(2, 1, 0, 0),
                  util_samples=[(10, 50)], mem_util_samples=[(10, 20)])
    _, reader = make(gpu)
    (reading,) = reader.read()

    assert reading.up and reading.error == ""
    assert reading.identity.index == 0
    assert reading.identity.uuid == "GPU-aaaa"
    assert reading.identity.pci_bus_id == "00000000:18:00.0"
    assert reading.identity.model_name == "NVIDIA H100 80GB HBM3"
    assert reading.identity.device == "nvidia0"
    assert dict(reading.fields) == {
        "gpu_util": 50, "mem_copy_util": 20,
        "fb_used_mib": 20 * 1024, "fb_free_mib": 60 * 1024 - 566, "fb_reserved_mib": 566, "fb_total_mib": 80 * 1024,
        "power_w": pytest.approx(351.25), "energy_mj": 9_876_543_210, "temp_c": 61,
        "sm_clock_mhz": 1755, "mem_clock_mhz": 2619, "throttle_reasons": 0x4,
        "ecc_sbe_volatile": 3, "ecc_dbe_volatile": 1,
        "remapped_rows_correctable": 2, "remapped_rows_uncorrectable": 1, "row_remap_failure": 0,
        # dcgm-exporter's other default fields, in its units
        "memory_temp_c": 62, "pcie_replay": 0, "enc_util": 0, "dec_util": 0, "vgpu_license": 0,
        "pcie_tx_bytes_per_s": 102_400 * 1024, "pcie_rx_bytes_per_s": 1_048_576 * 1024,
        # fields a counters file may turn on
        "power_violation_ns": 0, "thermal_violation_ns": 0, "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 2619,
        "enforced_power_limit_w": pytest.approx(700.0),
    }
    assert reading.identity.driver_version == "580.95.05"
    assert set(reading.fields) <= set(GPU_FIELDS)


def test_minor_numbers_name_each_gpu_for_dra(make: MakeReader) -> None:
    _, reader = make(FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b"), FakeGpu(uuid="GPU-c"))
    assert reader.gpu_minors() == {}     # nothing read yet: no NVML call from attribution
    reader.read()
    assert reader.gpu_minors() == {2: "GPU-a", 1: "GPU-b", 0: "GPU-c"}


def test_a_driver_without_the_v2_memory_query_gives_used_and_free_without_a_reserve(make: MakeReader) -> None:
    _, reader = make(FakeGpu(mem_total=80 * GiB, mem_used=20 * GiB, mem_reserved=None))
    (reading,) = reader.read()
    assert "fb_reserved_mib" not in reading.fields
    assert reading.fields["fb_used_mib"] == 20 * 1024
    assert reading.fields["fb_used_mib"] + reading.fields["fb_free_mib"] == reading.fields["fb_total_mib"]


def test_a_vgpu_guest_reports_its_license_and_missing_sensors_stay_absent(make: MakeReader) -> None:
    licensed = FakeGpu(virtualization=pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU, vgpu_licensed=True)
    unlicensed = FakeGpu(virtualization=pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU, memory_temp_c=None,
                         unsupported={"nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetPcieThroughput"})
    _, reader = make(licensed, unlicensed)
    first, second = reader.read()
    assert first.fields["vgpu_license"] == 1 and second.fields["vgpu_license"] == 0
    for absent in ("memory_temp_c", "enc_util", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"):
        assert absent not in second.fields, absent
    assert second.fields["dec_util"] == 0


def test_gpm_gives_the_profiling_fields_in_dcgm_units(make: MakeReader) -> None:
    nvml, reader = make(FakeGpu(gpm=dict(FULL_GPM)))
    reader.read()
    (reading,) = reader.read()
    f = reading.fields
    assert (f["sm_active"], f["sm_occupancy"], f["fp64_active"], f["fp32_active"], f["fp16_active"]) == \
        pytest.approx((0.80, 0.30, 0.0, 0.12, 0.03))
    # GPM's MiB/s, in bytes per second; the NVML PCIe sensor is not asked where GPM answers.
    assert f["pcie_tx_bytes_per_s"] == 100 * 2 ** 20 and f["pcie_rx_bytes_per_s"] == 2048 * 2 ** 20
    assert f["nvlink_tx_bytes_per_s"] == 40960 * 2 ** 20 and f["nvlink_rx_bytes_per_s"] == 40000 * 2 ** 20
    assert nvml.calls[(0, "nvmlDeviceGetPcieThroughput")] == 0


def test_full_hopper_gpu_reports_every_catalog_field(make: MakeReader) -> None:
    gpu = FakeGpu(nvlink_links=18, gpm=dict(FULL_GPM), util_samples=[(1, 10)], mem_util_samples=[(1, 5)])
    _, reader = make(gpu)
    reader.read()
    (reading,) = reader.read()
    assert set(reading.fields) == set(GPU_FIELDS)


def test_utilization_is_the_mean_of_the_samples_since_the_last_read(make: MakeReader) -> None:
    gpu = FakeGpu(util_samples=[(1_000, 10), (2_000, 20), (3_000, 60)],
                  mem_util_samples=[(1_000, 4), (2_000, 8)], util_rates=(99, 99))
    clock = FakeClock()
    nvml, reader = make(gpu, clock=clock)
    (first,) = reader.read()
    assert first.fields["gpu_util"] == pytest.approx(30.0)
    assert first.fields["mem_copy_util"] == pytest.approx(6.0)

    gpu.util_samples += [(4_000, 100), (5_000, 50)]
    gpu.mem_util_samples += [(3_000, 30)]
    clock.now += 10.0   # an interval longer than the driver's sample period
    (second,) = reader.read()
    assert second.fields["gpu_util"] == pytest.approx(75.0)   # only the two new samples
    assert second.fields["mem_copy_util"] == pytest.approx(30.0)
    assert nvml.calls[(0, "nvmlDeviceGetUtilizationRates")] == 0

    # An idle GPU's sample buffer runs dry (NOT_FOUND): the instant rate stands in.
    gpu.util_rates = (0, 0)
    clock.now += 10.0
    (idle,) = reader.read()
    assert idle.fields["gpu_util"] == 0
    assert idle.fields["mem_copy_util"] == 0


def test_at_one_second_the_rate_stands_for_the_interval_and_costly_counters_are_held(make: MakeReader) -> None:
    # Measured on an H200 (bench/RESULTS.md): the samples cost 2.5 ms of CPU each, total
    # energy 3.7 ms, GPM's metrics 2 ms, a violation counter 1.1 ms, the PCIe replay counter
    # 0.5 ms, the MIG mode 0.3 ms, a maximum clock 1.6 ms; a plain field 4 to 10 us.
    gpu = FakeGpu(util_samples=[(1_000, 10)], mem_util_samples=[(1_000, 3)], util_rates=(42, 7), energy_mj=1_000,
                  gpm=dict(HOPPER_GPM), mig=[])
    clock = FakeClock()
    nvml, reader = make(gpu, clock=clock)
    reader.read()
    energies = []
    for _ in range(25):
        clock.now += 1.0
        gpu.energy_mj += 700_000   # 700 W
        (reading,) = reader.read()
        energies.append(reading.fields["energy_mj"])
        assert (reading.fields["gpu_util"], reading.fields["mem_copy_util"]) == (42, 7)
    assert nvml.calls[(0, "nvmlDeviceGetSamples")] == 2            # the first read's, once per type
    assert nvml.calls[(0, "nvmlDeviceGetUtilizationRates")] == 25
    assert nvml.calls[(0, "nvmlDeviceGetTotalEnergyConsumption")] == 3   # at 0, 10 and 20 s
    assert nvml.calls[(0, "nvmlDeviceGetViolationStatus")] == 2 * 3      # power and thermal
    assert nvml.calls[(0, "nvmlDeviceGetMaxClockInfo")] == 2             # SM and memory, once
    assert nvml.calls[(0, "nvmlDeviceGetPcieReplayCounter")] == 3
    assert nvml.calls[(0, "nvmlDeviceGetMigMode")] == 3
    # GPM: a sample at 0 and 1 s (the first values), then at 11 and 21 s, each pair's values held
    assert nvml.calls[(0, "nvmlGpmSampleGet")] == 4
    # The counter is held, never made up: each value is one the driver gave, at most 10 s old.
    assert energies[:9] == [1_000] * 9 and energies[9] == 1_000 + 10 * 700_000
    assert energies[19] == 1_000 + 20 * 700_000


def test_samples_not_supported_falls_back_to_instant_rates_without_retrying(make: MakeReader) -> None:
    gpu = FakeGpu(unsupported={"nvmlDeviceGetSamples"}, util_rates=(77, 33))
    nvml, reader = make(gpu)
    for _ in range(3):
        (reading,) = reader.read()
        assert reading.fields["gpu_util"] == 77
        assert reading.fields["mem_copy_util"] == 33
    assert nvml.calls[(0, "nvmlDeviceGetSamples")] == 2   # once per sampling type, then remembered
    assert nvml.calls[(0, "nvmlDeviceGetUtilizationRates")] == 3


def test_unsupported_values_are_absent_and_not_asked_again(make: MakeReader) -> None:
    unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                   "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
                   "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"}
    gpu = FakeGpu(name="NVIDIA GeForce RTX 4090", unsupported=unsupported, util_rates=(12, 3))
    nvml, reader = make(gpu)
    for _ in range(3):
        (reading,) = reader.read()
        assert reading.up
        for key in ("power_w", "energy_mj", "ecc_sbe_volatile", "ecc_dbe_volatile", "throttle_reasons",
                    "remapped_rows_correctable", "remapped_rows_uncorrectable", "row_remap_failure",
                    "nvlink_bandwidth_mbps", "tensor_active", "gr_engine_active", "dram_active"):
            assert key not in reading.fields
        assert reading.fields["temp_c"] == 55
        assert reading.nvlink_bytes == {}
    for function in unsupported:
        assert nvml.calls[(0, function)] == 1, function


def test_old_driver_reads_throttle_reasons_by_the_older_name(make: MakeReader) -> None:
    gpu = FakeGpu(old_driver=True, clock_reasons=0x40)
    nvml, reader = make(gpu)
    for _ in range(2):
        (reading,) = reader.read()
        assert reading.fields["throttle_reasons"] == 0x40
    assert nvml.calls[(0, "nvmlDeviceGetCurrentClocksEventReasons")] == 1
    assert nvml.calls[(0, "nvmlDeviceGetCurrentClocksThrottleReasons")] == 2


def test_a_lost_gpu_is_down_alone(make: MakeReader) -> None:
    nvml, reader = make(FakeGpu(power_mw=300_000), FakeGpu(power_mw=280_000), FakeGpu(power_mw=290_000))
    assert all(r.up for r in reader.read())

    nvml.lose(1)
    readings = reader.read()
    assert [r.up for r in readings] == [True, False, True]
    assert readings[1].error == str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert readings[1].identity.uuid == nvml.gpus[1].uuid   # still labelled as the same GPU
    assert readings[1].fields == {}
    assert readings[0].fields["power_w"] == 300.0
    assert readings[2].fields["power_w"] == 290.0
    assert readings[2].fields["fb_used_mib"] == 20 * 1024


def test_a_gpu_lost_before_it_was_identified_is_still_reported(make: MakeReader) -> None:
    _, reader = make(FakeGpu(), FakeGpu(lost_after=0))
    good, lost = reader.read()
    assert good.up and not lost.up
    assert lost.identity.index == 1
    assert lost.error == str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))


def test_a_hung_call_holds_only_its_gpu_and_it_recovers(make: MakeReader) -> None:
    nvml, reader = make(FakeGpu(), FakeGpu(), call_timeout=0.3)
    reader.read()
    release = nvml.hang(1, "nvmlDeviceGetPowerUsage")

    started = time.monotonic()
    good, hung = reader.read()
    assert time.monotonic() - started < 0.6
    assert good.up and good.fields["power_w"] == 350.0
    assert not hung.up and hung.error == "timeout"

    # While the call is still stuck, the GPU gets no new call and read() does not wait for it.
    calls_before = nvml.device_calls(1)
    started = time.monotonic()
    good, hung = reader.read()
    assert time.monotonic() - started < 0.2
    assert good.up and not hung.up and hung.error == "timeout"
    assert nvml.device_calls(1) == calls_before

    release.set()
    readings = wait_for(reader, lambda rs: rs[1].up)
    assert readings[1].up and readings[1].fields["power_w"] == 350.0


def test_xid_events_are_counted_per_code(make: MakeReader) -> None:
    nvml, reader = make(FakeGpu(), FakeGpu(xid_supported=False))
    reader.read()   # the first read registers each GPU for XID events
    for code in (79, 13, 13, 48, 13):
        nvml.emit_xid(0, code)
    nvml.emit_xid(1, 31)   # GPU 1 cannot report XIDs: never delivered

    watched, unwatched = wait_for(reader, lambda rs: sum(rs[0].xid_counts.values()) == 5)
    assert watched.xid_counts == {13: 3, 79: 1, 48: 1}
    assert watched.last_xid == 13
    assert unwatched.up and unwatched.xid_counts == {} and unwatched.last_xid is None

    nvml.emit_xid(0, 79)
    (watched, _) = wait_for(reader, lambda rs: sum(rs[0].xid_counts.values()) == 6)
    assert watched.xid_counts == {13: 3, 79: 2, 48: 1}   # cumulative
    assert watched.last_xid == 79


def test_xid_counts_survive_the_gpu_going_down(make: MakeReader) -> None:
    nvml, reader = make(FakeGpu())
    reader.read()
    nvml.emit_xid(0, 79)
    wait_for(reader, lambda rs: rs[0].last_xid == 79)
    nvml.lose(0)
    (reading,) = reader.read()
    assert not reading.up
    assert reading.xid_counts == {79: 1} and reading.last_xid == 79


def test_nvlink_counter_and_dcgm_rate(make: MakeReader) -> None:
    clock = FakeClock()
    linked = FakeGpu(nvlink_links=18, nvlink_tx_kib=1_000, nvlink_rx_kib=2_000)
    pcie = FakeGpu(name="NVIDIA H100 PCIe")
    nvml, reader = make(linked, pcie, clock=clock)

    first, plain = reader.read()
    assert first.nvlink_bytes == {"tx": 1_000 * 1024, "rx": 2_000 * 1024}
    assert "nvlink_bandwidth_mbps" not in first.fields   # a rate needs two reads

    clock.now += 10.0
    linked.nvlink_tx_kib += 50_000
    linked.nvlink_rx_kib += 30_000
    second, plain = reader.read()
    assert second.nvlink_bytes == {"tx": 51_000 * 1024, "rx": 32_000 * 1024}
    # (50,000 + 30,000) KiB over 10 s, divided by 1000 as DCGM does.
    assert second.fields["nvlink_bandwidth_mbps"] == pytest.approx(8.0)

    assert plain.nvlink_bytes == {}
    assert "nvlink_bandwidth_mbps" not in plain.fields
    # NVLink probed once and never read; the other two calls are each read's memory temperature.
    assert nvml.calls[(1, "nvmlDeviceGetFieldValues")] == 3


def test_gpm_ratios_from_two_samples(make: MakeReader) -> None:
    hopper = FakeGpu(gpm=dict(HOPPER_GPM))
    ampere = FakeGpu(name="NVIDIA A100-SXM4-80GB")
    clock = FakeClock()
    nvml, reader = make(hopper, ampere, clock=clock)

    first, _ = reader.read()
    assert not {"tensor_active", "gr_engine_active", "dram_active"} & set(first.fields)

    second, older = reader.read()
    assert second.fields["tensor_active"] == pytest.approx(0.40)
    assert second.fields["gr_engine_active"] == pytest.approx(0.90)
    assert second.fields["dram_active"] == pytest.approx(0.25)
    assert not {"tensor_active", "gr_engine_active", "dram_active"} & set(older.fields)

    hopper.gpm[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL] = 5.0
    clock.now += 1.0
    held, _ = reader.read()   # the pair's values, held until a sample is due again
    assert held.fields["tensor_active"] == pytest.approx(0.40)
    clock.now += SLOW_EVERY_S
    third, _ = reader.read()
    assert third.fields["tensor_active"] == pytest.approx(0.05)
    assert nvml.calls[(1, "nvmlGpmSampleGet")] == 0

    reader.close()
    assert nvml.gpm_samples == {}   # both buffers freed


def test_mig_devices_map_to_their_parent_and_share(make: MakeReader) -> None:
    h100 = FakeGpu(uuid="GPU-h100", mig=[("MIG-aaa", 3), ("MIG-bbb", 1)])
    a30 = FakeGpu(uuid="GPU-a30", name="NVIDIA A30", total_slices=4, mig=[("MIG-ccc", 2)])
    whole = FakeGpu(uuid="GPU-whole", mig=[])
    _, reader = make(h100, a30, whole, FakeGpu())
    reader.read()
    assert dict(reader.mig_devices()) == {
        "MIG-aaa": ("GPU-h100", pytest.approx(3 / 7)),
        "MIG-bbb": ("GPU-h100", pytest.approx(1 / 7)),
        "MIG-ccc": ("GPU-a30", pytest.approx(0.5)),
    }


def test_close_stops_the_xid_thread_promptly(make: MakeReader) -> None:
    nvml, reader = make(FakeGpu(), event_wait_ms=50)
    reader.read()
    assert reader.xid_running
    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < 0.5
    assert not reader.xid_running
    assert nvml.event_sets_freed == 1
    assert not nvml.initialized   # nvmlShutdown was called
