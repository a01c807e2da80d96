"""Pod and node facts from the Kubernetes API: one pod list and one node read per refresh.

In a pod (the DaemonSet) the agent asks the API server itself, over HTTPS with its service
account's token and CA: two GETs every refresh need no client library, and the kubernetes
package takes 35 MB to import (its models, every API group's; 21 MB of the agent's RSS). Outside a
cluster the kubernetes package reads the kubeconfig, with everything a kubeconfig may hold
(exec plugins, client certificates), and the same two GETs go out with what it found.
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Callable, Mapping

import msgspec

from burnrate.exporter.snapshot import UNKNOWN, NodeInfo

# Where Kubernetes mounts a pod's service account (its token is rotated in place).
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# An answer larger than this is refused rather than held: a node's pods list in far less.
MAX_ANSWER_BYTES = 64 << 20


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status


class ConfigError(Exception):
    """Neither a service account nor a kubeconfig says where the API server is."""


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


# The fields read of the API's objects; msgspec skips the rest without building it.
class Owner(msgspec.Struct, rename="camel"):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class _Meta(msgspec.Struct, rename="camel"):
    namespace: str = ""
    name: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None
    owner_references: list[Owner] | None = None


class _Status(msgspec.Struct):
    phase: str | None = None


class _Pod(msgspec.Struct):
    metadata: _Meta
    status: _Status | None = None


class _PodList(msgspec.Struct):
    items: list[_Pod] | None = None


class _Node(msgspec.Struct):
    metadata: _Meta


class KubeClient:
    """Reads the pods of one node and the node itself through the API server.

    `authorization` gives the Authorization header for each request (None: none), asked
    anew each time because tokens rotate.
    """

    def __init__(self, host: str, authorization: Callable[[], str | None] = lambda: None,
                 tls: ssl.SSLContext | None = None, timeout_s: float = 5.0, proxy: str | None = None) -> None:
        self.host = host.rstrip("/")
        self._authorization = authorization
        # The API server directly, or through the kubeconfig's proxy-url: never through the
        # pod's HTTP(S)_PROXY, which is meant for the outside world (the kubernetes package's
        # client ignores it too).
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": proxy, "https": proxy} if proxy else {}),
            urllib.request.HTTPSHandler(context=tls))
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(cls, timeout_s: float = 5.0, environ: Mapping[str, str] = os.environ,
                         service_account: str = SERVICE_ACCOUNT) -> KubeClient:
        """The pod's service account when running in one, else the kubeconfig.

        Raises ConfigError when neither is available.
        """
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
        token_file = os.path.join(service_account, "token")
        if host and port and os.path.exists(token_file):
            host = f"[{host}]" if ":" in host else host
            tls = ssl.create_default_context(cafile=os.path.join(service_account, "ca.crt"))

            def bearer() -> str:
                with open(token_file) as fh:
                    return "Bearer " + fh.read().strip()
            return cls(f"https://{host}:{port}", bearer, tls, timeout_s)
        return cls._from_kubeconfig(environ.get("KUBECONFIG"), timeout_s)

    @classmethod
    def _from_kubeconfig(cls, paths: str | None, timeout_s: float) -> KubeClient:
        """`paths`: KUBECONFIG's list of files; None: ~/.kube/config."""
        import kubernetes.client
        import kubernetes.config
        from kubernetes.config.config_exception import ConfigException

        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_kube_config(config_file=paths, client_configuration=configuration)
        except (ConfigException, OSError) as exc:
            raise ConfigError(f"no service account and no usable kubeconfig: {exc}") from None
        if getattr(configuration, "tls_server_name", None):
            raise ConfigError("the kubeconfig's tls-server-name is not supported: name the API server by the "
                              "name its certificate holds in the cluster's server URL")
        tls = None
        if configuration.host.startswith("https"):
            tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                tls.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
        return cls(configuration.host,
                   lambda: configuration.get_api_key_with_prefix("BearerToken", alias="authorization"), tls,
                   timeout_s, configuration.proxy)

    def _get(self, path: str, query: Mapping[str, str] | None = None) -> bytes:
        url = self.host + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        authorization = self._authorization()
        if authorization:
            request.add_header("Authorization", authorization)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as answer:
                body = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _reason(exc)) from None
        if len(body) > MAX_ANSWER_BYTES:
            raise ValueError(f"the API server's answer is over {MAX_ANSWER_BYTES} bytes")
        return body

    def pods(self, node: str) -> dict[tuple[str, str], PodInfo]:
        """Every pod scheduled on `node`, keyed (namespace, name), in one list call."""
        listed = msgspec.json.decode(self._get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}),
                                     type=_PodList)
        pods = {}
        for pod in listed.items or ():
            meta = pod.metadata
            pods[(meta.namespace, meta.name)] = PodInfo(
                namespace=meta.namespace,
                name=meta.name,
                uid=meta.uid,
                phase=(pod.status.phase if pod.status else None) or UNKNOWN,
                training_job=training_job(meta.name, meta.labels, meta.owner_references),
            )
        return pods

    def node(self, node: str) -> NodeInfo:
        read = msgspec.json.decode(self._get("/api/v1/nodes/" + urllib.parse.quote(node, safe="")), type=_Node)
        return node_info(node, read.metadata.labels)


def _reason(exc: urllib.error.HTTPError) -> str:
    """The API server's own message from its Status object, else the HTTP reason."""
    try:
        return str(json.loads(exc.read(65536)).get("message") or exc.reason)
    except (ValueError, AttributeError, OSError):
        return str(exc.reason)
