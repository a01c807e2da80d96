"""Pod and node facts from the Kubernetes API: one pod list and one node read per refresh."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import kubernetes.client
import kubernetes.config
from kubernetes.config.config_exception import ConfigException

from burnrate.exporter.snapshot import UNKNOWN, NodeInfo

SPOT = "spot"
ON_DEMAND = "on-demand"

# Pod labels naming the training job, the first present wins. A controller that builds on
# another comes before it: a TrainJob runs as a JobSet, a JobSet as batch Jobs, and their pods
# carry all three labels.
JOB_NAME_LABELS = (
    "trainer.kubeflow.org/trainjob-name",   # Kubeflow Trainer v2 TrainJob
    "training.kubeflow.org/job-name",       # Kubeflow Training Operator (PyTorchJob, MPIJob, ...)
    "jobset.sigs.k8s.io/jobset-name",       # JobSet
    "leaderworkerset.sigs.k8s.io/name",     # LeaderWorkerSet; its pods' owners are StatefulSets
    "volcano.sh/job-name",                  # Volcano Job
    # KubeRay RayCluster. A RayJob's pods carry no label naming it, only the cluster it
    # created for itself (`<rayjob>-<random>`; github.com/ray-project/kuberay/issues/707).
    "ray.io/cluster",
    "batch.kubernetes.io/job-name",         # batch/v1 Job, Kubernetes 1.27+
    "job-name",                             # batch/v1 Job, older clusters
    # Kueue's group of plain pods admitted as one workload. Kueue's workload name is not used:
    # it is one per admitted unit (per LeaderWorkerSet group, say), with a hash suffix.
    "kueue.x-k8s.io/pod-group-name",
)
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"

INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
# Capacity-type labels per provider: label -> {label value: capacity type}.
CAPACITY_TYPE_LABELS: Mapping[str, Mapping[str, str]] = {
    "eks.amazonaws.com/capacityType": {"SPOT": SPOT, "ON_DEMAND": ON_DEMAND},
    "karpenter.sh/capacity-type": {"spot": SPOT, "on-demand": ON_DEMAND},
    "cloud.google.com/gke-spot": {"true": SPOT},
    "cloud.google.com/gke-preemptible": {"true": SPOT},
    "kubernetes.azure.com/scalesetpriority": {"spot": SPOT},
}
# Pods in these phases have released their devices, though the kubelet may still list them.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    phase: str
    training_job: str

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES


def training_job(name: str, labels: Mapping[str, str] | None, owners: list | None) -> str:
    """The training job a pod belongs to: its job label, else its controller, else itself."""
    labels = labels or {}
    for key in JOB_NAME_LABELS:
        if labels.get(key):
            return labels[key]
    controller = next((o for o in owners or () if o.controller), None)
    if controller is None:
        return name
    if controller.kind == "ReplicaSet":
        # A Deployment names its ReplicaSets `<deployment>-<pod-template-hash>`.
        suffix = "-" + labels.get(POD_TEMPLATE_HASH_LABEL, "")
        if suffix != "-" and controller.name.endswith(suffix):
            return controller.name[: -len(suffix)]
    return controller.name


def capacity_type(labels: Mapping[str, str]) -> str:
    """`spot`, `on-demand` or `unknown`, from whichever provider's label the node carries."""
    for key, values in CAPACITY_TYPE_LABELS.items():
        found = values.get(labels.get(key, ""))
        if found:
            return found
    return UNKNOWN


def node_info(name: str, labels: Mapping[str, str] | None) -> NodeInfo:
    labels = labels or {}

    def first(keys: tuple[str, ...]) -> str:
        return next((labels[k] for k in keys if labels.get(k)), UNKNOWN)

    return NodeInfo(hostname=name, instance_type=first(INSTANCE_TYPE_LABELS),
                    capacity_type=capacity_type(labels), zone=first(ZONE_LABELS))


class KubeClient:
    """Reads the pods of one node and the node itself through the API server."""

    def __init__(self, configuration: kubernetes.client.Configuration, timeout_s: float = 5.0) -> None:
        self._api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(cls, timeout_s: float = 5.0) -> KubeClient:
        """In-cluster service-account credentials when running in a pod, else kubeconfig.

        Raises ConfigException when neither is available.
        """
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except ConfigException:
            kubernetes.config.load_kube_config(client_configuration=configuration)
        return cls(configuration, timeout_s)

    def pods(self, node: str) -> dict[tuple[str, str], PodInfo]:
        """Every pod scheduled on `node`, keyed (namespace, name), in one list call."""
        listed = self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _request_timeout=self.timeout_s)
        pods = {}
        for pod in listed.items:
            meta = pod.metadata
            pods[(meta.namespace, meta.name)] = PodInfo(
                namespace=meta.namespace,
                name=meta.name,
                uid=meta.uid or "",
                phase=(pod.status.phase if pod.status else None) or UNKNOWN,
                training_job=training_job(meta.name, meta.labels, meta.owner_references),
            )
        return pods

    def node(self, node: str) -> NodeInfo:
        read = self._api.read_node(node, _request_timeout=self.timeout_s)
        return node_info(node, read.metadata.labels)
