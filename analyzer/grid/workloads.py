"""What kind of workload holds the GPUs: training, serving, interactive or batch.

The class decides which findings can be named (a training cause needs training
evidence) and which advice fits (spot only for a job that checkpoints; culling for
notebooks; scale-to-zero, MIG or time-slicing for serving). Evidence, best first:

1. a per-namespace override the user gives (`--workload-class NAMESPACE=CLASS`);
2. trainer telemetry: only a training loop reports steps;
3. the pods' controller (kube-state-metrics' kube_pod_owner): training operators,
   serving controllers, notebooks, batch Jobs;
4. a training operator's pod name (`<job>-worker-N`), or JupyterHub's (`jupyter-<user>`),
   where no controller is known.

Anything else is `batch`, and its basis says that nothing better was known.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

TRAINING, SERVING, INTERACTIVE, BATCH = "training", "serving", "interactive", "batch"
CLASSES = (TRAINING, SERVING, INTERACTIVE, BATCH)

OWNER_CLASSES = {
    # Kubeflow training operators, Trainer v2, JobSet, Volcano's and Ray's jobs.
    **dict.fromkeys(("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob", "JobSet",
                     "RayJob"), TRAINING),
    **dict.fromkeys(("Deployment", "ReplicaSet", "StatefulSet", "LeaderWorkerSet", "InferenceService",
                     "InferencePool", "DaemonSet"), SERVING),
    "Notebook": INTERACTIVE,
    **dict.fromkeys(("Job", "CronJob"), BATCH),
}
_TRAINING_POD = re.compile(r"-(?:worker|master|launcher)-\d+$")


class WorkloadError(ValueError):
    """A malformed `--workload-class` override; the message is one line."""


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    basis: str      # the evidence, in words


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`NAMESPACE=CLASS` pairs."""
    out = {}
    for item in items:
        namespace, _, name = item.partition("=")
        if not namespace or name not in CLASSES:
            raise WorkloadError(f"--workload-class {item!r}: expected NAMESPACE=CLASS, CLASS one of {', '.join(CLASSES)}")
        out[namespace] = name
    return out


def classify(job: tuple[str, str], pods: list[str], owner_kinds: list[str], telemetry: bool,
             overrides: Mapping[str, str]) -> WorkloadClass:
    namespace = job[0]
    if namespace in overrides:
        return WorkloadClass(overrides[namespace], f"namespace {namespace} set to {overrides[namespace]}")
    if telemetry:
        return WorkloadClass(TRAINING, "trainer telemetry")
    for kind in owner_kinds:
        if kind in OWNER_CLASSES:
            return WorkloadClass(OWNER_CLASSES[kind], f"owned by a {kind}")
    if any(_TRAINING_POD.search(pod) for pod in pods):
        return WorkloadClass(TRAINING, "a training operator's pod name")
    if any(pod.startswith("jupyter-") for pod in pods):
        # JupyterHub's single-user servers are bare pods named jupyter-<user>.
        return WorkloadClass(INTERACTIVE, "a JupyterHub pod name")
    what = f"owner kind {', '.join(sorted(set(owner_kinds)))}" if owner_kinds else "no controller"
    return WorkloadClass(BATCH, f"{what} and no trainer telemetry: counted as batch")
