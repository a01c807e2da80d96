"""NvmlReader on real NVIDIA GPUs; skipped where NVML cannot start."""
from __future__ import annotations

import time

import pynvml
import pytest

from burnrate.agent.gpu.nvml import NvmlReader
from burnrate.exporter.catalog import GPU_FIELDS

try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    pytest.skip(f"NVML cannot start here (no NVIDIA GPU or driver): {exc}", allow_module_level=True)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def readings():
    reader = NvmlReader(call_timeout=5.0)
    try:
        reader.read()
        time.sleep(1.0)   # a second read covers an interval: sampled utilization, GPM, NVLink rate
        yield reader.read()
    finally:
        reader.close()


def test_every_gpu_is_read(readings) -> None:
    assert len(readings) == pynvml.nvmlDeviceGetCount() > 0
    for reading in readings:
        assert reading.up, reading.error
        assert reading.identity.uuid.startswith(("GPU-", "MIG-"))
        assert reading.identity.pci_bus_id
        assert set(reading.fields) <= set(GPU_FIELDS)


def test_values_are_in_sane_ranges(readings) -> None:
    for reading in readings:
        f = reading.fields
        handle = pynvml.nvmlDeviceGetHandleByIndex(reading.identity.index)
        total_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2 ** 20
        assert 0 <= f["gpu_util"] <= 100
        assert 0 <= f["mem_copy_util"] <= 100
        assert f["fb_used_mib"] + f["fb_free_mib"] == pytest.approx(total_mib, rel=0.01)
        assert f["power_w"] > 0
        assert 10 <= f["temp_c"] <= 110
        assert f["sm_clock_mhz"] > 0 and f["mem_clock_mhz"] > 0
        for ratio in ("tensor_active", "gr_engine_active", "dram_active"):
            if ratio in f:
                assert 0 <= f[ratio] <= 1
        if reading.nvlink_bytes:
            assert reading.nvlink_bytes["tx"] >= 0 and reading.nvlink_bytes["rx"] >= 0
