"""Every metric burnrate exposes, as plain data: the single source for the collector,
the metrics doc, the alert-rule checks and the recording schema.

No third-party imports here: agent, analyzer, trainer and tests all read this table.
Adding a metric is one entry; `source` and `field` tell the collector where in a
Snapshot its value lives.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import labels as L

GAUGE = "gauge"
COUNTER = "counter"

# Where a value lives in a Snapshot (see exporter.snapshot).
GPU_FIELD = "gpu_field"          # GpuReading.fields[field]; absent key -> no series
GPU_UP = "gpu_up"
GPU_LAST_XID = "gpu_last_xid"
GPU_XID_COUNTS = "gpu_xid_counts"
GPU_NVLINK_BYTES = "gpu_nvlink_bytes"
ALLOCATION = "allocation"
NODE_INFO = "node_info"
NODE_HOST = "node_host"          # HostReading attribute
POD_HOST = "pod_host"            # HostReading.pod_cpu_seconds
RANK = "rank"                    # RankState.values[field]
AGENT = "agent"                  # AgentStats attribute
GPU_TIME = "gpu_time"            # Snapshot.gpu_seconds: GpuSeconds.observed, HolderSeconds attributes

IDLE_UTIL_PCT = 2.0
"""Utilization at or below this is idle. A constant of the metrics' contract, not a setting:
the agent splits burnrate_gpu_idle_seconds_total from busy with it as it counts, so no
--detector-config can move the split already exported. The idle_gpu detector's default
threshold is this one, and fleet mode says where a config's differs (docs/thresholds.md).
NVML reports 0-1% for a GPU with only a CUDA context and no kernels; 2% leaves room for a
monitoring probe."""


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str
    unit: str
    help: str
    labels: tuple[str, ...]
    source: str
    field: str = ""
    dcgm: bool = False
    # In dcgm-exporter's default counters (and so exported without a counters file).
    default: bool = True
    # Kept in recordings and read by the analyzer; the rest are exported only, for the
    # dashboards and tools built on dcgm-exporter.
    recorded: bool = True

    @property
    def sample_name(self) -> str:
        """The name samples carry. dcgm-exporter's counters have no `_total` suffix."""
        if self.type == COUNTER and not self.dcgm and not self.name.endswith("_total"):
            return self.name + "_total"
        return self.name


DEVICE = L.DEVICE_LABELS
DEVICE_POD = L.DEVICE_LABELS + L.POD_LABELS
T = L.RANK_LABELS


def _dcgm(name: str, type_: str, unit: str, help_: str, field: str) -> MetricSpec:
    return MetricSpec(name, type_, unit, help_, DEVICE_POD, GPU_FIELD, field, dcgm=True)


def _dcgm_more(name: str, type_: str, unit: str, help_: str, field: str, default: bool) -> MetricSpec:
    """A device field exported for compatibility, not analysed: in dcgm-exporter's default
    set when `default`, else turned on by a counters file (`--collectors`)."""
    return MetricSpec(name, type_, unit, help_, DEVICE_POD, GPU_FIELD, field, dcgm=True,
                      default=default, recorded=False)


def _train(name: str, type_: str, unit: str, help_: str, field: str) -> MetricSpec:
    return MetricSpec(name, type_, unit, help_, T, RANK, field)


CATALOG: tuple[MetricSpec, ...] = (
    # --- Device metrics: dcgm-exporter 4.8 names, units and labels ---------------
    _dcgm("DCGM_FI_DEV_GPU_UTIL", GAUGE, "%", "GPU utilization (in %).", "gpu_util"),
    _dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", GAUGE, "%", "Memory utilization (in %).", "mem_copy_util"),
    _dcgm("DCGM_FI_DEV_FB_USED", GAUGE, "MiB", "Framebuffer memory used (in MiB).", "fb_used_mib"),
    _dcgm("DCGM_FI_DEV_FB_FREE", GAUGE, "MiB", "Framebuffer memory free (in MiB).", "fb_free_mib"),
    _dcgm("DCGM_FI_DEV_POWER_USAGE", GAUGE, "W", "Power draw (in W).", "power_w"),
    _dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", COUNTER, "mJ",
          "Total energy consumption since boot (in mJ).", "energy_mj"),
    _dcgm("DCGM_FI_DEV_GPU_TEMP", GAUGE, "°C", "GPU temperature (in C).", "temp_c"),
    _dcgm("DCGM_FI_DEV_SM_CLOCK", GAUGE, "MHz", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    _dcgm("DCGM_FI_DEV_MEM_CLOCK", GAUGE, "MHz", "Memory clock frequency (in MHz).", "mem_clock_mhz"),
    _dcgm("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", COUNTER, "MB/s",
          "Total NVLink bandwidth over the last interval, all lanes (in MB/s; a rate, typed as a counter "
          "like dcgm-exporter does; use burnrate_gpu_nvlink_bytes_total for rate()).", "nvlink_bandwidth_mbps"),
    MetricSpec("DCGM_FI_DEV_XID_ERRORS", GAUGE, "code",
               "Value of the last XID error encountered (see burnrate_gpu_xid_errors_total for counts).",
               DEVICE_POD, GPU_LAST_XID, dcgm=True),
    _dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", GAUGE, "ratio",
          "Ratio of cycles the tensor (HMMA) pipe is active.", "tensor_active"),
    _dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", GAUGE, "ratio",
          "Ratio of time the graphics engine is active.", "gr_engine_active"),
    _dcgm("DCGM_FI_PROF_DRAM_ACTIVE", GAUGE, "ratio",
          "Ratio of cycles the device memory interface is active sending or receiving data.", "dram_active"),
    _dcgm("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", GAUGE, "bitmask",
          "Current clock throttle reasons (NVML clocks-event reasons bitmask).", "throttle_reasons"),
    _dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", COUNTER, "errors",
          "Total number of single-bit volatile ECC errors.", "ecc_sbe_volatile"),
    _dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", COUNTER, "errors",
          "Total number of double-bit volatile ECC errors.", "ecc_dbe_volatile"),
    _dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", COUNTER, "rows",
          "Number of remapped rows for correctable errors.", "remapped_rows_correctable"),
    _dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", COUNTER, "rows",
          "Number of remapped rows for uncorrectable errors.", "remapped_rows_uncorrectable"),
    _dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", GAUGE, "bool",
          "Whether remapping of rows has failed.", "row_remap_failure"),
    # The rest of dcgm-exporter's default set (etc/default-counters.csv, 4.8) ...
    _dcgm_more("DCGM_FI_DEV_MEMORY_TEMP", GAUGE, "°C", "Memory temperature (in C).", "memory_temp_c", True),
    _dcgm_more("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", COUNTER, "retries", "Total number of PCIe retries.",
               "pcie_replay", True),
    _dcgm_more("DCGM_FI_DEV_ENC_UTIL", GAUGE, "%", "Encoder utilization (in %).", "enc_util", True),
    _dcgm_more("DCGM_FI_DEV_DEC_UTIL", GAUGE, "%", "Decoder utilization (in %).", "dec_util", True),
    _dcgm_more("DCGM_FI_DEV_FB_RESERVED", GAUGE, "MiB", "Framebuffer memory reserved (in MiB).",
               "fb_reserved_mib", True),
    _dcgm_more("DCGM_FI_DEV_VGPU_LICENSE_STATUS", GAUGE, "bool",
               "vGPU License status (1 licensed; 0 unlicensed, or not a vGPU).", "vgpu_license", True),
    _dcgm_more("DCGM_FI_PROF_PCIE_TX_BYTES", GAUGE, "B/s",
               "The rate of data transmitted over the PCIe bus, headers included (in bytes per second).",
               "pcie_tx_bytes_per_s", True),
    _dcgm_more("DCGM_FI_PROF_PCIE_RX_BYTES", GAUGE, "B/s",
               "The rate of data received over the PCIe bus, headers included (in bytes per second).",
               "pcie_rx_bytes_per_s", True),
    # ... and fields a counters file may turn on.
    _dcgm_more("DCGM_FI_DEV_FB_TOTAL", GAUGE, "MiB", "Framebuffer memory total (in MiB).", "fb_total_mib", False),
    _dcgm_more("DCGM_FI_PROF_SM_ACTIVE", GAUGE, "ratio",
               "The ratio of cycles an SM has at least 1 warp assigned.", "sm_active", False),
    _dcgm_more("DCGM_FI_PROF_SM_OCCUPANCY", GAUGE, "ratio",
               "The ratio of number of warps resident on an SM.", "sm_occupancy", False),
    _dcgm_more("DCGM_FI_PROF_PIPE_FP64_ACTIVE", GAUGE, "ratio",
               "Ratio of cycles the fp64 pipes are active.", "fp64_active", False),
    _dcgm_more("DCGM_FI_PROF_PIPE_FP32_ACTIVE", GAUGE, "ratio",
               "Ratio of cycles the fp32 pipes are active.", "fp32_active", False),
    _dcgm_more("DCGM_FI_PROF_PIPE_FP16_ACTIVE", GAUGE, "ratio",
               "Ratio of cycles the fp16 pipes are active.", "fp16_active", False),
    _dcgm_more("DCGM_FI_PROF_NVLINK_TX_BYTES", GAUGE, "B/s",
               "The rate of data transmitted over NVLink, not including protocol headers (in bytes per second).",
               "nvlink_tx_bytes_per_s", False),
    _dcgm_more("DCGM_FI_PROF_NVLINK_RX_BYTES", GAUGE, "B/s",
               "The rate of data received over NVLink, not including protocol headers (in bytes per second).",
               "nvlink_rx_bytes_per_s", False),
    _dcgm_more("DCGM_FI_DEV_POWER_VIOLATION", COUNTER, "ns",
               "Throttling duration due to power constraints (in ns).", "power_violation_ns", False),
    _dcgm_more("DCGM_FI_DEV_THERMAL_VIOLATION", COUNTER, "ns",
               "Throttling duration due to thermal constraints (in ns).", "thermal_violation_ns", False),
    _dcgm_more("DCGM_FI_DEV_MAX_SM_CLOCK", GAUGE, "MHz", "Maximum supported SM clock (in MHz).",
               "max_sm_clock_mhz", False),
    _dcgm_more("DCGM_FI_DEV_MAX_MEM_CLOCK", GAUGE, "MHz", "Maximum supported memory clock (in MHz).",
               "max_mem_clock_mhz", False),
    _dcgm_more("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", GAUGE, "W", "Effective power limit (in W).",
               "enforced_power_limit_w", False),
    # --- burnrate's own per-GPU series -----------------------------------------------
    MetricSpec("burnrate_gpu_up", GAUGE, "bool",
               "1 while NVML answers for this GPU, 0 once it fails or is lost.", DEVICE, GPU_UP),
    MetricSpec("burnrate_gpu_allocated", GAUGE, "bool",
               "1 for each GPU allocated to a running pod.", DEVICE_POD, ALLOCATION, "allocated"),
    MetricSpec("burnrate_gpu_allocation_share_ratio", GAUGE, "ratio",
               "Fraction of the GPU the pod holds: 1 for a whole GPU, slices/7 for a MIG slice, "
               "replicas held/replicas for a time-sliced GPU.", DEVICE_POD, ALLOCATION, "share"),
    MetricSpec("burnrate_gpu_nvlink_bytes_total", COUNTER, "bytes",
               "NVLink data bytes, a true counter.", DEVICE + ("direction",), GPU_NVLINK_BYTES),
    MetricSpec("burnrate_gpu_xid_errors_total", COUNTER, "events",
               "XID events, counted per code.", DEVICE + ("xid",), GPU_XID_COUNTS),
    # GPU-time as counters: cost and waste over any window are increase() of these, whatever
    # the scrape interval (agent.gpu_time). allocated = idle + busy for every holder.
    MetricSpec("burnrate_gpu_observed_seconds_total", COUNTER, "seconds",
               "Seconds this GPU was on the node, answering NVML or not.", DEVICE, GPU_TIME, "observed",
               recorded=False),
    MetricSpec("burnrate_gpu_allocated_seconds_total", COUNTER, "seconds",
               "Seconds this pod held the GPU, times its share (shares over a whole GPU split it).",
               DEVICE_POD, GPU_TIME, "allocated", recorded=False),
    MetricSpec("burnrate_gpu_idle_seconds_total", COUNTER, "seconds",
               f"The allocated seconds during which GPU utilization was at or below {IDLE_UTIL_PCT:g}%.",
               DEVICE_POD, GPU_TIME, "idle", recorded=False),
    MetricSpec("burnrate_gpu_busy_seconds_total", COUNTER, "seconds",
               f"The allocated seconds during which GPU utilization was above {IDLE_UTIL_PCT:g}%, or unknown.",
               DEVICE_POD, GPU_TIME, "busy", recorded=False),
    MetricSpec("burnrate_node_info", GAUGE, "info",
               "Node facts used for pricing; always 1.", L.NODE_INFO_LABELS, NODE_INFO),
    MetricSpec("burnrate_node_cpu_utilization_ratio", GAUGE, "ratio",
               "Node CPU busy share over the last interval (a starving loader often shows here).",
               (L.HOSTNAME,), NODE_HOST, "cpu_utilization"),
    MetricSpec("burnrate_pod_cpu_seconds_total", COUNTER, "seconds",
               "CPU time used by a pod that holds a GPU, read from its cgroup.",
               (L.NAMESPACE, L.POD, L.HOSTNAME), POD_HOST),
    # --- Training telemetry (docs/telemetry.md), per rank ----------------------------------
    _train("burnrate_train_steps_total", COUNTER, "steps", "Completed optimizer steps.", "steps"),
    _train("burnrate_train_step_seconds_total", COUNTER, "seconds", "Wall time of those steps.", "step_s"),
    _train("burnrate_train_data_wait_seconds_total", COUNTER, "seconds",
           "Time blocked waiting for the next batch; on a GPU, as far as the GPU waited too.", "data_wait_s"),
    _train("burnrate_train_compute_seconds_total", COUNTER, "seconds",
           "This rank's own compute, without time spent waiting for other ranks.", "compute_s"),
    _train("burnrate_train_samples_total", COUNTER, "samples", "Samples processed.", "samples"),
    _train("burnrate_train_tokens_total", COUNTER, "tokens", "Tokens processed.", "tokens"),
    _train("burnrate_train_flops_total", COUNTER, "FLOPs", "Model FLOPs done (the MFU numerator).", "flops"),
    _train("burnrate_train_mfu_ratio", GAUGE, "ratio",
           "Model FLOPs utilization, 0 to 1, over the last window.", "mfu"),
    _train("burnrate_train_loss", GAUGE, "loss", "Last reported training loss (NaN kept as NaN).", "loss"),
    _train("burnrate_train_grad_norm", GAUGE, "norm", "Last reported gradient norm (NaN kept as NaN).",
           "grad_norm"),
    _train("burnrate_train_last_step_timestamp_seconds", GAUGE, "seconds",
           "Unix time of the last completed step.", "last_step_time"),
    _train("burnrate_train_last_report_timestamp_seconds", GAUGE, "seconds",
           "Unix time the agent last heard from this rank, a keep-alive included: a living process's "
           "is seconds old, an ended one's stays where it ended.", "last_report_time"),
    _train("burnrate_train_closed_timestamp_seconds", GAUGE, "seconds",
           "Unix time the agent heard this rank's process close its monitor (its last message said so): "
           "the process trains no more while this equals the rank's last report time.", "closed_time"),
    _train("burnrate_train_world_size", GAUGE, "ranks", "Ranks in the job.", "world_size"),
    _train("burnrate_train_last_checkpoint_timestamp_seconds", GAUGE, "seconds",
           "Unix time of the last checkpoint saved.", "last_checkpoint_time"),
    _train("burnrate_train_checkpoint_seconds_total", COUNTER, "seconds",
           "Time the loop spent saving checkpoints (the blocking part).", "checkpoint_s"),
    _train("burnrate_train_eval_seconds_total", COUNTER, "seconds", "Time the loop spent in evaluation.", "eval_s"),
    _train("burnrate_train_global_step", GAUGE, "steps",
           "The run's own step number (after a resume, counted on from the step it resumed from).", "global_step"),
    _train("burnrate_train_start_timestamp_seconds", GAUGE, "seconds",
           "Unix time this training process started, before its model loaded.", "start_time"),
    _train("burnrate_train_resumed_from_step", GAUGE, "steps",
           "The step this process resumed from; 0 for a fresh start.", "resumed_from"),
    # --- The agent on itself -----------------------------------------------------------
    MetricSpec("burnrate_agent_telemetry_received_total", COUNTER, "messages",
               "Telemetry datagrams received.", (L.HOSTNAME,), AGENT, "telemetry_received"),
    MetricSpec("burnrate_agent_telemetry_rejected_total", COUNTER, "messages",
               "Telemetry datagrams dropped, by reason.", (L.HOSTNAME, "reason"), AGENT, "telemetry_rejected"),
    MetricSpec("burnrate_agent_telemetry_relabelled_total", COUNTER, "messages",
               "Telemetry datagrams kept under the namespace and pod of the pod that sent them, "
               "not the ones they named.", (L.HOSTNAME,), AGENT, "telemetry_relabelled"),
    MetricSpec("burnrate_agent_telemetry_ranks", GAUGE, "ranks",
               "Ranks whose telemetry the agent holds now.", (L.HOSTNAME,), AGENT, "telemetry_ranks"),
    MetricSpec("burnrate_agent_collection_errors_total", COUNTER, "errors",
               "Collection errors, by collector.", (L.HOSTNAME, "collector"), AGENT, "collection_errors"),
    MetricSpec("burnrate_agent_collection_duration_seconds", GAUGE, "seconds",
               "Duration of the last collection, by collector.", (L.HOSTNAME, "collector"), AGENT,
               "collection_seconds"),
    MetricSpec("burnrate_agent_last_collection_timestamp_seconds", GAUGE, "seconds",
               "Unix time of the snapshot being served.", (L.HOSTNAME,), AGENT, "time"),
)

BY_NAME = {m.name: m for m in CATALOG}

# dcgm-exporter 4.9.0 exports the default fields under DCGM 4.7's names and in base units
# (its release notes: clocks in hertz, energy in joules, utilization as a 0-1 ratio, memory
# in bytes). The names are DCGM 4.7's field identifiers (its Python bindings' deprecated-alias
# table and go-dcgm's base-unit fields). Catalog name -> (4.9 name, factor back to our unit),
# so that a cluster that upgrades dcgm-exporter reads the same.
DCGM_4_9_NAMES: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", 100.0),
    "DCGM_FI_DEV_FB_USED": ("DCGM_FI_DEV_FB_USED_BYTES", 1.0 / 2 ** 20),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e-6),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1000.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", 1.0),
}

# Training fields carried per rank, in catalog order (also the recording's rank columns).
RANK_FIELDS = tuple(m.field for m in CATALOG if m.source == RANK)
# Device fields a GPU reader may report, in catalog order; the recorded ones are the
# recording's gpu columns.
GPU_FIELDS = tuple(m.field for m in CATALOG if m.source == GPU_FIELD)
RECORDED_GPU_FIELDS = tuple(m.field for m in CATALOG if m.source == GPU_FIELD and m.recorded)


def sample_names() -> set[str]:
    """Every series name that can appear in the exposition."""
    return {m.sample_name for m in CATALOG}
