"""Label names, in one place. Device labels are dcgm-exporter's, camelCase included,
so that its dashboards and `on(UUID)` joins keep working."""
import re


GPU = "gpu"
UUID = "UUID"
PCI_BUS_ID = "pci_bus_id"
DEVICE = "device"
MODEL_NAME = "modelName"
HOSTNAME = "Hostname"
# On dcgm-exporter's device series when its counters name it (they do by default).
DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"

NAMESPACE = "namespace"
POD = "pod"
CONTAINER = "container"
# Never `job`: Prometheus owns that label.
TRAINING_JOB = "training_job"
RANK = "rank"

DEVICE_LABELS = (GPU, UUID, PCI_BUS_ID, DEVICE, MODEL_NAME, HOSTNAME)
POD_LABELS = (NAMESPACE, POD, CONTAINER, TRAINING_JOB)
RANK_LABELS = (NAMESPACE, POD, TRAINING_JOB, RANK, HOSTNAME)
NODE_INFO_LABELS = (HOSTNAME, "instance_type", "capacity_type", "zone", "gpu_model", "gpu_count")

# What Prometheus itself puts on every scraped series: with honor_labels a target's own
# `job` would replace the scrape job's, so no label burnrate adds may take these names.
SCRAPE_LABELS = ("job", "instance", "__name__")


def not_a_cluster_label(label: str) -> str | None:
    """Why `label` cannot name each series' cluster, or None where it can."""
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label):
        return f"--cluster-label {label!r} is not a Prometheus label name"
    if label in SCRAPE_LABELS or label.startswith("__"):
        return f"--cluster-label {label!r} is a label Prometheus sets on every scrape; choose another, such as cluster"
    return None


# Appended to modelName by simulated GPUs, so that simulated data is never taken for real.
SIMULATED = "(simulated)"
