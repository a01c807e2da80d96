"""NVML's clocks-event reason bits (nvmlClocksEventReason*), the bitmask that
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS carries: the simulated GPUs set them as a real GPU
would, and the analyzer reads them back."""

GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
SW_THERMAL = 0x20
HW_THERMAL = 0x40
# Thermal slowdown, by the driver (software) or the GPU itself (hardware).
THERMAL = SW_THERMAL | HW_THERMAL
