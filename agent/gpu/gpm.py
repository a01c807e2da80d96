"""Tensor, graphics and DRAM activity from NVML GPM (GPU Performance Monitoring, Hopper
and newer): the same signals as DCGM's profiling fields, without a DCGM host engine.

GPM metrics are computed from two samples of the GPU's counters, so each read takes a
new sample and pairs it with the previous read's one: the values cover the interval. The
reader decides how often (agent/gpu/nvml.py SLOW_EVERY_S): a pair costs about 2 ms of CPU.
"""
from __future__ import annotations

from typing import Any


def gpm_supported(nvml: Any, handle: Any) -> bool:
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError as exc:
        if exc.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return False
        raise


class GpmSampler:
    """Two GPM sample buffers for one GPU, used in turn."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        # field key -> (GPM metric id, factor to the catalog's unit): NVML gives the
        # activities in percent (0.0 - 100.0) and the traffic in MiB/s.
        ratio, mib = 0.01, float(2 ** 20)
        self._metrics = (
            ("tensor_active", nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, ratio),
            ("gr_engine_active", nvml.NVML_GPM_METRIC_GRAPHICS_UTIL, ratio),
            ("dram_active", nvml.NVML_GPM_METRIC_DRAM_BW_UTIL, ratio),
            ("sm_active", nvml.NVML_GPM_METRIC_SM_UTIL, ratio),
            ("sm_occupancy", nvml.NVML_GPM_METRIC_SM_OCCUPANCY, ratio),
            ("fp64_active", nvml.NVML_GPM_METRIC_FP64_UTIL, ratio),
            ("fp32_active", nvml.NVML_GPM_METRIC_FP32_UTIL, ratio),
            ("fp16_active", nvml.NVML_GPM_METRIC_FP16_UTIL, ratio),
            ("pcie_tx_bytes_per_s", nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, mib),
            ("pcie_rx_bytes_per_s", nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, mib),
            ("nvlink_tx_bytes_per_s", nvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, mib),
            ("nvlink_rx_bytes_per_s", nvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, mib),
        )
        self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self._next = 0
        self._have_previous = False

    def read(self) -> dict[str, float] | None:
        """Values over the time since the previous call; None on the first call."""
        nvml = self._nvml
        current = self._samples[self._next]
        previous = self._samples[1 - self._next]
        nvml.nvmlGpmSampleGet(self._handle, current)
        self._next = 1 - self._next
        if not self._have_previous:
            self._have_previous = True
            return None
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._metrics)
        request.sample1 = previous
        request.sample2 = current
        for i, (_, metric_id, _) in enumerate(self._metrics):
            request.metrics[i].metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        return {
            key: request.metrics[i].value * factor
            for i, (key, _, factor) in enumerate(self._metrics)
            if request.metrics[i].nvmlReturn == nvml.NVML_SUCCESS
        }

    def close(self) -> None:
        for sample in self._samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._nvml.NVMLError:
                pass  # shutting down: nothing more to do with a buffer NVML refuses to free
        self._samples = []
