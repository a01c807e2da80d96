"""Pod attribution end to end, over the real wire protocols.

No kubelet and no API server run here, so the tests start faithful local stand-ins:
a real gRPC server implementing the kubelet pod-resources v1 service (List and
GetAllocatableResources, from the same api.proto) on a temporary Unix socket, and an
`http.server` answering the two Kubernetes API paths the agent uses with real
Kubernetes JSON (a PodList of full pod objects, a Node), over TLS where the test is of
the service account's path, as a real API server answers a pod.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlparse

import grpc
import pytest

from burnrate.agent.attribution import Attribution
from burnrate.agent.attribution.attributor import Attributor
from burnrate.agent.attribution.static import StaticAttributor
from burnrate.agent.attribution.kube import ApiError, ConfigError, KubeClient, Owner, node_info, training_job
from burnrate.agent.attribution.kubelet import mig_profile_share
from burnrate.agent.attribution.podresources.v1 import api_pb2, api_pb2_grpc
from burnrate.exporter.snapshot import Allocation, NodeInfo, PodRef
from tests.conftest import PYTHON, ROOT
from tests.tls import self_signed

NODE = "ip-10-0-12-34.us-west-2.compute.internal"
GPU_A = "GPU-3f1b2c9e-6d0a-4e55-9c1e-7b2f8a9d0e11"
GPU_B = "GPU-8a7d6c5b-4e3f-4a1b-9c8d-0e1f2a3b4c5d"
GPU_C = "GPU-c0ffee00-1234-4abc-8def-0123456789ab"
GPU_D = "GPU-deadbeef-0000-4000-8000-00000000000d"
MIG_KNOWN = "MIG-1d2e3f40-5a6b-5c7d-8e9f-0a1b2c3d4e5f"
MIG_UNKNOWN = "MIG-9e8d7c6b-5a49-5382-9170-6f5e4d3c2b1a"


# --- the kubelet stand-in -----------------------------------------------------------

def container(name: str, *devices: tuple[str, list[str]],
              claims: tuple[api_pb2.DynamicResource, ...] = ()) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=name,
        devices=[api_pb2.ContainerDevices(
            resource_name=r, device_ids=ids,
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)])) for r, ids in devices],
        cpu_ids=[2, 3],
        dynamic_resources=claims)


def claim(name: str, *devices: tuple[str, list[str]], driver: str = "gpu.nvidia.com",
          namespace: str = "ml") -> api_pb2.DynamicResource:
    """A ResourceClaim as the kubelet lists it: each device by name and CDI device names, in
    the pool the driver publishes per node (named after the node)."""
    return api_pb2.DynamicResource(
        claim_name=name, claim_namespace=namespace,
        claim_resources=[api_pb2.ClaimResource(
            driver_name=driver, pool_name=NODE, device_name=device,
            cdi_devices=[api_pb2.CDIDevice(name=n) for n in cdi]) for device, cdi in devices])


def pod_resources(namespace: str, name: str, *containers) -> api_pb2.PodResources:
    return api_pb2.PodResources(namespace=namespace, name=name, containers=containers)


LISTED = api_pb2.ListPodResourcesResponse(pod_resources=[
    pod_resources("ml", "llm-7b-worker-0",
                  container("pytorch", ("nvidia.com/gpu", [GPU_A])),
                  container("log-shipper")),
    pod_resources("ml", "sweep-3-x7k2p",
                  container("trainer", ("nvidia.com/gpu", [f"{GPU_B}::0", f"{GPU_B}::1"]))),
    pod_resources("ml", "eval-legacy-8xq4d", container("eval", ("nvidia.com/gpu", [f"{GPU_B}::2"]))),
    pod_resources("ml", "finetune-lora-0", container("train", ("nvidia.com/mig-1g.10gb", [MIG_KNOWN]))),
    pod_resources("ml", "finetune-full-0", container("train", ("nvidia.com/mig-3g.40gb", [MIG_UNKNOWN]))),
    pod_resources("research", "notebook-7d9f8b6c4d-qwz5x",
                  container("jupyter", ("nvidia.com/gpu", [GPU_C]), ("example.com/fpga", ["fpga-0"]))),
    pod_resources("ml", "old-run-0", container("pytorch", ("nvidia.com/gpu", [GPU_D]))),
    pod_resources("kube-system", "coredns-5d78c9869d-abcde", container("coredns")),
])
ALLOCATABLE = api_pb2.AllocatableResourcesResponse(
    devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu",
                                      device_ids=[GPU_A, GPU_C, GPU_D] + [f"{GPU_B}::{i}" for i in range(4)]),
             api_pb2.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=[MIG_KNOWN]),
             api_pb2.ContainerDevices(resource_name="nvidia.com/mig-3g.40gb", device_ids=[MIG_UNKNOWN])],
    cpu_ids=list(range(64)))
MIG_DEVICES = {MIG_KNOWN: ("GPU-11111111-2222-4333-8444-555555555555", 1 / 7)}


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.listed = LISTED
        self.calls: list[str] = []

    def List(self, request, context):
        self.calls.append("List")
        return self.listed

    def GetAllocatableResources(self, request, context):
        self.calls.append("GetAllocatableResources")
        return ALLOCATABLE


@pytest.fixture
def socket_dir():
    # Unix socket paths are limited to ~108 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir):
    servicer = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    socket = socket_dir / "kubelet.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    servicer.socket = str(socket)
    servicer.server = server
    yield servicer
    server.stop(None)


# --- the API server stand-in --------------------------------------------------------

def k8s_pod(name: str, namespace: str = "ml", labels=None, owners=(), phase: str = "Running",
            uid: str = "", annotations=None) -> dict:
    return {
        "metadata": {
            "name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
            "resourceVersion": "48213377", "creationTimestamp": "2026-11-21T02:14:07Z",
            "labels": labels or {}, "annotations": annotations or {},
            "ownerReferences": [
                {"apiVersion": api, "kind": kind, "name": owner, "uid": f"uid-{owner}",
                 "controller": True, "blockOwnerDeletion": True} for api, kind, owner in owners],
        },
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "containers": [{
                "name": "main", "image": "ghcr.io/example/trainer:1.4.2",
                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
            }],
        },
        "status": {
            "phase": phase, "hostIP": "10.0.12.34", "podIP": "10.0.13.7", "qosClass": "Burstable",
            "startTime": "2026-11-21T02:14:09Z",
            "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False",
                            "lastTransitionTime": "2026-11-21T02:14:31Z"}],
            "containerStatuses": [{
                "name": "main", "image": "ghcr.io/example/trainer:1.4.2",
                "imageID": "ghcr.io/example/trainer@sha256:5b0d6a3c", "ready": phase == "Running",
                "restartCount": 0, "started": phase == "Running",
                "state": {"running": {"startedAt": "2026-11-21T02:14:30Z"}} if phase == "Running" else
                         {"terminated": {"exitCode": 0, "reason": "Completed",
                                         "startedAt": "2026-11-21T02:14:30Z",
                                         "finishedAt": "2026-11-21T04:02:11Z"}},
            }],
        },
    }


def pod_list(*pods: dict) -> dict:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "48213400"},
            "items": list(pods)}


POD_LIST = pod_list(
    k8s_pod("llm-7b-worker-0", uid="0c7e9b1a-2f4d-4e8b-9a6c-3d5e7f9a1b2c",
            labels={"training.kubeflow.org/job-name": "llm-7b",
                    "training.kubeflow.org/replica-type": "worker",
                    "training.kubeflow.org/replica-index": "0",
                    "training.kubeflow.org/operator-name": "pytorchjob-controller"},
            owners=[("kubeflow.org/v1", "PyTorchJob", "llm-7b")]),
    k8s_pod("sweep-3-x7k2p",
            labels={"batch.kubernetes.io/job-name": "sweep-3", "job-name": "sweep-3",
                    "batch.kubernetes.io/controller-uid": "uid-sweep-3", "controller-uid": "uid-sweep-3"},
            owners=[("batch/v1", "Job", "sweep-3")]),
    # A Job from a cluster older than 1.27: only the legacy label.
    k8s_pod("eval-legacy-8xq4d", labels={"job-name": "eval-legacy", "controller-uid": "uid-eval-legacy"},
            owners=[("batch/v1", "Job", "eval-legacy")]),
    # A JobSet-like owner without job labels: named by its controller.
    k8s_pod("finetune-lora-0", owners=[("jobset.x-k8s.io/v1alpha2", "JobSet", "finetune-lora")]),
    # A bare pod: named after itself.
    k8s_pod("finetune-full-0"),
    k8s_pod("notebook-7d9f8b6c4d-qwz5x", namespace="research",
            labels={"app": "notebook", "pod-template-hash": "7d9f8b6c4d"},
            owners=[("apps/v1", "ReplicaSet", "notebook-7d9f8b6c4d")]),
    k8s_pod("old-run-0", phase="Succeeded",
            labels={"training.kubeflow.org/job-name": "old-run"},
            owners=[("kubeflow.org/v1", "PyTorchJob", "old-run")]),
)

EKS_LABELS = {
    "kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
    "node.kubernetes.io/instance-type": "p4d.24xlarge", "beta.kubernetes.io/instance-type": "p4d.24xlarge",
    "topology.kubernetes.io/region": "us-west-2", "topology.kubernetes.io/zone": "us-west-2b",
    "eks.amazonaws.com/nodegroup": "gpu-spot", "eks.amazonaws.com/capacityType": "SPOT",
    "nvidia.com/gpu.present": "true",
}


def k8s_node(labels: dict) -> dict:
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": NODE, "uid": "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9",
                     "resourceVersion": "48213011", "creationTimestamp": "2026-11-20T18:00:00Z",
                     "labels": labels},
        "spec": {"providerID": "aws:///us-west-2b/i-0abc123def4567890"},
        "status": {
            "capacity": {"cpu": "96", "memory": "1176521332Ki", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "95690m", "memory": "1165424756Ki", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": "2026-11-21T04:00:00Z",
                            "lastTransitionTime": "2026-11-20T18:01:00Z"}],
            "nodeInfo": {"architecture": "amd64", "bootID": "b1",
                         "containerRuntimeVersion": "containerd://1.7.22", "kernelVersion": "6.1.112",
                         "kubeProxyVersion": "v1.31.2", "kubeletVersion": "v1.31.2",
                         "machineID": "m1", "operatingSystem": "linux", "osImage": "Amazon Linux 2023",
                         "systemUUID": "ec2-1"},
        },
    }


class FakeApiServer:
    """The API server's answers to the agent's two GETs, as JSON; over TLS with `tls`'s
    (certificate, key). Each request's path and Authorization header are kept."""

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self.status = 200
        self.node_labels = dict(EKS_LABELS)
        self.pod_list = POD_LIST
        self.requests: list[str] = []
        self.authorizations: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                outer.authorizations.append(self.headers.get("Authorization"))
                url = urlparse(self.path)
                if outer.status != 200:
                    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": "etcdserver: request timed out", "reason": "InternalError",
                            "code": outer.status}
                    return self.reply(outer.status, body)
                selector = parse_qs(url.query).get("fieldSelector")
                if url.path == "/api/v1/pods" and selector == [f"spec.nodeName={NODE}"]:
                    return self.reply(200, outer.pod_list)
                if url.path == f"/api/v1/nodes/{NODE}":
                    return self.reply(200, k8s_node(outer.node_labels))
                self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "reason": "NotFound", "code": 404})

            def reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def pod_lists(self) -> int:
        return sum(1 for r in self.requests if r.startswith("/api/v1/pods"))


@contextlib.contextmanager
def serving(server: FakeApiServer) -> Iterator[FakeApiServer]:
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


@pytest.fixture
def apiserver():
    with serving(FakeApiServer()) as server:
        yield server


def kube_client(server: FakeApiServer) -> KubeClient:
    return KubeClient(server.url, timeout_s=2.0)


def by_pod(attribution: Attribution) -> dict[str, Allocation]:
    return {a.pod.pod: a for a in attribution.allocations}


def attributor(kubelet_socket: str, kube: KubeClient | None) -> Attributor:
    return Attributor(NODE, kubelet_socket, kube, mig_devices=lambda: MIG_DEVICES)


# --- the tests ----------------------------------------------------------------------

def test_refresh_attributes_each_gpu_to_its_pod_and_job(kubelet, apiserver):
    got = attributor(kubelet.socket, kube_client(apiserver)).refresh()
    allocs = by_pod(got)

    whole = allocs["llm-7b-worker-0"]
    assert (whole.gpu_uuid, whole.device_id, whole.share) == (GPU_A, GPU_A, 1.0)
    assert whole.pod == PodRef("ml", "llm-7b-worker-0", "pytorch", "llm-7b",
                               "0c7e9b1a-2f4d-4e8b-9a6c-3d5e7f9a1b2c")

    # Time-slicing: 4 replicas of GPU_B; two held by one container, one by another.
    assert (allocs["sweep-3-x7k2p"].gpu_uuid, allocs["sweep-3-x7k2p"].share) == (GPU_B, 0.5)
    assert allocs["sweep-3-x7k2p"].device_id == f"{GPU_B}::0"
    assert (allocs["eval-legacy-8xq4d"].gpu_uuid, allocs["eval-legacy-8xq4d"].share) == (GPU_B, 0.25)

    # MIG: parent and share from NVML when it knows the device, else from the profile.
    lora, full = allocs["finetune-lora-0"], allocs["finetune-full-0"]
    assert (lora.gpu_uuid, lora.device_id) == (MIG_DEVICES[MIG_KNOWN][0], MIG_KNOWN)
    assert lora.share == pytest.approx(1 / 7)
    assert (full.gpu_uuid, full.device_id) == (MIG_UNKNOWN, MIG_UNKNOWN)
    assert full.share == pytest.approx(3 / 7)

    # training_job from each source.
    assert {name: a.pod.training_job for name, a in allocs.items()} == {
        "llm-7b-worker-0": "llm-7b",              # training.kubeflow.org/job-name
        "sweep-3-x7k2p": "sweep-3",               # batch.kubernetes.io/job-name
        "eval-legacy-8xq4d": "eval-legacy",       # legacy job-name
        "finetune-lora-0": "finetune-lora",       # controller owner
        "finetune-full-0": "finetune-full-0",     # no owner: the pod itself
        "notebook-7d9f8b6c4d-qwz5x": "notebook",  # ReplicaSet owner -> Deployment
    }
    # The Succeeded pod no longer holds GPU_D; non-GPU devices and pods are ignored.
    assert "old-run-0" not in allocs
    mig_parent = MIG_DEVICES[MIG_KNOWN][0]
    assert {a.gpu_uuid for a in got.allocations} == {GPU_A, GPU_B, mig_parent, MIG_UNKNOWN, GPU_C}

    assert got.node == NodeInfo(NODE, "p4d.24xlarge", "spot", "us-west-2b")
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    # One pod list for the whole node per refresh, and one node read.
    assert apiserver.pod_lists() == 1
    assert sum(1 for r in apiserver.requests if r.startswith("/api/v1/nodes/")) == 1


def test_allocatable_is_not_asked_without_time_slicing(kubelet):
    kubelet.listed = api_pb2.ListPodResourcesResponse(pod_resources=[LISTED.pod_resources[0]])
    got = attributor(kubelet.socket, None).refresh()
    assert [a.gpu_uuid for a in got.allocations] == [GPU_A]
    assert kubelet.calls == ["List"]


@pytest.mark.parametrize("labels, expected", [
    ({"eks.amazonaws.com/capacityType": "SPOT"}, "spot"),
    ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "on-demand"),
    ({"karpenter.sh/capacity-type": "spot"}, "spot"),
    ({"karpenter.sh/capacity-type": "on-demand"}, "on-demand"),
    ({"cloud.google.com/gke-spot": "true"}, "spot"),
    ({"cloud.google.com/gke-preemptible": "true"}, "spot"),
    ({"kubernetes.azure.com/scalesetpriority": "spot"}, "spot"),
    ({"kubernetes.io/os": "linux"}, "unknown"),
])
def test_capacity_type_from_each_provider_label(apiserver, labels, expected):
    apiserver.node_labels = {"kubernetes.io/hostname": NODE, **labels}
    assert kube_client(apiserver).node(NODE).capacity_type == expected


def test_node_facts_fall_back_to_beta_labels_then_unknown():
    beta = node_info(NODE, {"beta.kubernetes.io/instance-type": "a2-highgpu-8g",
                            "failure-domain.beta.kubernetes.io/zone": "us-central1-a",
                            "cloud.google.com/gke-spot": "true"})
    assert beta == NodeInfo(NODE, "a2-highgpu-8g", "spot", "us-central1-a")
    assert node_info(NODE, None) == NodeInfo(NODE, "unknown", "unknown", "unknown")


def owner(kind: str, name: str, controller: bool = True) -> Owner:
    return Owner(kind=kind, name=name, controller=controller)


def test_training_job_label_precedence_and_owner_fallbacks():
    labels = {"training.kubeflow.org/job-name": "kf", "batch.kubernetes.io/job-name": "batch",
              "job-name": "old"}
    assert training_job("p", labels, [owner("Job", "j")]) == "kf"
    del labels["training.kubeflow.org/job-name"]
    assert training_job("p", labels, [owner("Job", "j")]) == "batch"
    del labels["batch.kubernetes.io/job-name"]
    assert training_job("p", labels, [owner("Job", "j")]) == "old"
    # Only the controller counts among several owners.
    owners = [owner("ConfigMap", "cm", controller=False), owner("StatefulSet", "ss")]
    assert training_job("p", {}, owners) == "ss"
    # A ReplicaSet not made by a Deployment keeps its own name.
    assert training_job("p", {}, [owner("ReplicaSet", "standalone-rs")]) == "standalone-rs"
    assert training_job("p", {"pod-template-hash": "5f6d7"}, [owner("ReplicaSet", "web-5f6d7")]) == "web"
    assert training_job("p", {}, [owner("ConfigMap", "cm", controller=False)]) == "p"


def test_mig_profile_shares():
    assert mig_profile_share("nvidia.com/mig-1g.10gb") == pytest.approx(1 / 7)
    assert mig_profile_share("nvidia.com/mig-3g.40gb") == pytest.approx(3 / 7)
    assert mig_profile_share("nvidia.com/mig-7g.80gb") == pytest.approx(1.0)
    assert mig_profile_share("nvidia.com/mig-1g.10gb+me.shared") == pytest.approx(1 / 7)
    assert mig_profile_share("nvidia.com/mig-2g.12gb") == pytest.approx(2 / 4)  # A30: 4 slices
    assert mig_profile_share("nvidia.com/gpu") is None


def test_kubelet_socket_missing_is_counted_and_unenriched_served(socket_dir, apiserver, caplog):
    att = attributor(str(socket_dir / "absent.sock"), None)
    with caplog.at_level(logging.WARNING, logger="burnrate.agent.attribution"):
        first = att.refresh()
        att.refresh()
    assert first == Attribution((), NodeInfo(NODE))
    assert att.current() == first
    assert dict(att.errors) == {"kubelet": 2, "kubernetes": 0, "dra": 0}
    # Logged once per change, not once per refresh.
    assert len([r for r in caplog.records if "kubelet unavailable" in r.getMessage()]) == 1

    # With the API up, node facts are still served.
    att = attributor(str(socket_dir / "absent.sock"), kube_client(apiserver))
    assert att.refresh() == Attribution((), NodeInfo(NODE, "p4d.24xlarge", "spot", "us-west-2b"))
    assert dict(att.errors) == {"kubelet": 1, "kubernetes": 0, "dra": 0}


def test_kubelet_going_away_keeps_the_last_good_allocations(kubelet):
    att = attributor(kubelet.socket, None)
    good = att.refresh()
    assert len(good.allocations) == 7  # old-run-0 too: nothing says it finished
    kubelet.server.stop(None).wait()
    assert att.refresh() == good
    assert att.errors["kubelet"] == 1


def test_api_returning_500_is_counted_and_allocations_still_served(kubelet, apiserver, caplog):
    apiserver.status = 500
    att = attributor(kubelet.socket, kube_client(apiserver))
    with caplog.at_level(logging.WARNING, logger="burnrate.agent.attribution"):
        got = att.refresh()
        att.refresh()
    assert dict(att.errors) == {"kubelet": 0, "kubernetes": 2, "dra": 0}
    assert len([r for r in caplog.records if "kubernetes unavailable" in r.getMessage()]) == 1
    allocs = by_pod(got)
    # Unenriched: every kubelet allocation, no job names, node facts unknown.
    assert len(allocs) == 7
    assert {a.pod.training_job for a in got.allocations} == {""}
    assert got.node == NodeInfo(NODE)

    # Once the API has answered, an outage keeps serving what it said.
    apiserver.status = 200
    good = att.refresh()
    apiserver.status = 500
    assert att.refresh() == good
    assert by_pod(good)["llm-7b-worker-0"].pod.training_job == "llm-7b"
    assert att.errors["kubernetes"] == 3


def test_current_serves_the_cache_without_io(kubelet, apiserver):
    att = attributor(kubelet.socket, kube_client(apiserver))
    assert att.current() == Attribution((), NodeInfo(NODE))  # before any refresh
    refreshed = att.refresh()
    calls, requests = len(kubelet.calls), len(apiserver.requests)
    kubelet.server.stop(None).wait()
    apiserver.status = 500
    started = time.perf_counter()
    for _ in range(1000):
        assert att.current() is refreshed
    assert time.perf_counter() - started < 0.5
    assert (len(kubelet.calls), len(apiserver.requests)) == (calls, requests)


def test_start_refreshes_on_its_own_thread_until_stopped(kubelet, apiserver):
    att = Attributor(NODE, kubelet.socket, kube_client(apiserver), mig_devices=lambda: MIG_DEVICES,
                     refresh_s=0.05)
    att.start()
    try:
        deadline = time.monotonic() + 5
        while apiserver.pod_lists() < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert apiserver.pod_lists() >= 3
        assert by_pod(att.current())["llm-7b-worker-0"].pod.training_job == "llm-7b"
    finally:
        att.stop()
    settled = apiserver.pod_lists()
    time.sleep(0.2)
    assert apiserver.pod_lists() == settled
    assert dict(att.errors) == {"kubelet": 0, "kubernetes": 0, "dra": 0}


def test_static_attributor_serves_local_allocations():
    node = NodeInfo("workstation", "local", "on-demand", "local")
    alloc = Allocation(GPU_A, GPU_A, PodRef("local", "demo-trainer", "trainer", "demo"))
    static = StaticAttributor(node, lambda: [alloc])
    static.start()
    assert static.current() == Attribution((alloc,), node)
    assert dict(static.errors) == {}
    static.stop()


# --- dynamic resource allocation (DRA) ---------------------------------------------

DRA_GPU_0 = "GPU-0a1b2c3d-0000-4e5f-8a9b-000000000000"
DRA_GPU_1 = "GPU-0a1b2c3d-1111-4e5f-8a9b-111111111111"
DRA_GPU_3 = "GPU-0a1b2c3d-3333-4e5f-8a9b-333333333333"
DRA_GPU_BY_CDI = "GPU-0a1b2c3d-2222-4e5f-8a9b-222222222222"
# Minor numbers as NVML reports them; minors 2, 4 and 7 are unknown to the agent.
GPU_MINORS = {0: DRA_GPU_0, 1: DRA_GPU_1, 3: DRA_GPU_3}
STANDARD_CDI = "k8s.gpu.nvidia.com/device="

DRA_LISTED = api_pb2.ListPodResourcesResponse(pod_resources=[
    pod_resources("ml", "dra-train-0",
                  container("trainer", claims=(
                      claim("dra-train-0-gpus-4xq7z",
                            ("gpu-0", [STANDARD_CDI + "gpu-0"]),
                            # Two MIG devices of GPU 1: profiles 1g.10gb and 2g.20gb.
                            ("gpu-1-mig-1g10gb-19-0", [STANDARD_CDI + "gpu-1-mig-1g10gb-19-0",
                                                       "k8s.gpu.nvidia.com/claim=5f0c-gpu-1-mig-1g10gb-19-0"]),
                            ("gpu-1-mig-2g20gb-14-2", [STANDARD_CDI + "gpu-1-mig-2g20gb-14-2"]),
                            # A GPU whose minor NVML does not list: nothing maps it.
                            ("gpu-7", [STANDARD_CDI + "gpu-7"])),
                      # NVIDIA's IMEX channels come from another driver and are no GPUs.
                      claim("dra-train-0-imex-8jq2w", ("channel-0", ["k8s.compute-domain.nvidia.com/device=channel-0"]),
                            driver="compute-domain.nvidia.com"))),
                  container("log-shipper")),
    # CDI names that carry the UUID identify the device even where the minor is unknown.
    pod_resources("ml", "dra-infer-0",
                  container("server", claims=(
                      claim("infer-gpus",
                            ("gpu-2", [f"nvidia.com/gpu={DRA_GPU_BY_CDI}"]),
                            ("gpu-4-mig-1g10gb-19-1", [f"nvidia.com/gpu={MIG_KNOWN}"])),))),
    # One claim shared by two pods: each holds half of the GPU.
    pod_resources("research", "dra-notebook-a", container("jupyter", claims=(
        claim("shared-gpu", ("gpu-3", [STANDARD_CDI + "gpu-3"]), namespace="research"),))),
    pod_resources("research", "dra-notebook-b", container("jupyter", claims=(
        claim("shared-gpu", ("gpu-3", [STANDARD_CDI + "gpu-3"]), namespace="research"),))),
])
DRA_POD_LIST = pod_list(
    k8s_pod("dra-train-0", labels={"batch.kubernetes.io/job-name": "dra-train", "job-name": "dra-train"},
            owners=[("batch/v1", "Job", "dra-train")]),
    k8s_pod("dra-infer-0"),
    k8s_pod("dra-notebook-a", namespace="research"),
    k8s_pod("dra-notebook-b", namespace="research"),
)


def dra_device(name: str) -> str:
    return f"gpu.nvidia.com/{NODE}/{name}"


def test_dra_claims_are_attributed_to_their_gpus(kubelet, apiserver, caplog):
    kubelet.listed = DRA_LISTED
    apiserver.pod_list = DRA_POD_LIST
    att = Attributor(NODE, kubelet.socket, kube_client(apiserver), mig_devices=lambda: MIG_DEVICES,
                     gpu_minors=lambda: GPU_MINORS)
    with caplog.at_level(logging.WARNING, logger="burnrate.agent.attribution"):
        got = att.refresh()
        att.refresh()

    held = {(a.pod.pod, a.pod.container, a.gpu_uuid): a for a in got.allocations}
    assert {k: v.share for k, v in held.items()} == pytest.approx({
        ("dra-train-0", "trainer", DRA_GPU_0): 1.0,
        # Both MIG devices of GPU 1 in one series: 1/7 + 2/7.
        ("dra-train-0", "trainer", DRA_GPU_1): 3 / 7,
        ("dra-infer-0", "server", DRA_GPU_BY_CDI): 1.0,
        ("dra-infer-0", "server", MIG_DEVICES[MIG_KNOWN][0]): 1 / 7,
        ("dra-notebook-a", "jupyter", DRA_GPU_3): 0.5,
        ("dra-notebook-b", "jupyter", DRA_GPU_3): 0.5,
    })
    assert held[("dra-train-0", "trainer", DRA_GPU_0)].device_id == dra_device("gpu-0")
    assert held[("dra-train-0", "trainer", DRA_GPU_1)].device_id == dra_device("gpu-1-mig-1g10gb-19-0")
    assert held[("dra-train-0", "trainer", DRA_GPU_0)].pod.training_job == "dra-train"
    assert held[("dra-notebook-b", "jupyter", DRA_GPU_3)].pod.namespace == "research"

    # The unmappable device is counted on every refresh that lists it, and logged once.
    assert dict(att.errors) == {"kubelet": 0, "kubernetes": 0, "dra": 2}
    warned = [r.getMessage() for r in caplog.records if "DRA GPU devices" in r.getMessage()]
    assert len(warned) == 1 and dra_device("gpu-7") in warned[0]
    assert kubelet.calls == ["List", "List"]


def test_dra_gpu_names_without_known_minors_are_counted_not_guessed(kubelet):
    kubelet.listed = api_pb2.ListPodResourcesResponse(pod_resources=[DRA_LISTED.pod_resources[0]])
    att = attributor(kubelet.socket, None)  # no GPU minors known
    assert att.refresh().allocations == ()
    # gpu-0, the two MIG devices of gpu-1 and gpu-7; the IMEX channel is no GPU.
    assert att.errors["dra"] == 4


# --- MIG resources with profile attributes -----------------------------------------

MIG_SUFFIXED = {
    # resource name -> (MIG device the plugin hands out, share of its GPU)
    "nvidia.com/mig-1g.10gb.me": ("MIG-5c1b9a10-0001-5000-8000-000000000001", 1 / 7),
    "nvidia.com/mig-1g.10gb.me.all": ("MIG-5c1b9a10-0002-5000-8000-000000000002", 1 / 7),
    "nvidia.com/mig-1g.10gb-me": ("MIG-5c1b9a10-0003-5000-8000-000000000003", 1 / 7),
    "nvidia.com/mig-1g.10gb+me": ("MIG-5c1b9a10-0004-5000-8000-000000000004", 1 / 7),
    "nvidia.com/mig-2g.20gb+gfx": ("MIG-5c1b9a10-0005-5000-8000-000000000005", 2 / 7),
    "nvidia.com/mig-2g.20gb.gfx": ("MIG-5c1b9a10-0006-5000-8000-000000000006", 2 / 7),
    "nvidia.com/mig-1c.3g.40gb": ("MIG-5c1b9a10-0007-5000-8000-000000000007", 1 / 7),
    "nvidia.com/mig-1g.6gb.me": ("MIG-5c1b9a10-0008-5000-8000-000000000008", 1 / 4),  # A30
    "nvidia.com/mig-1g.10gb.me.shared": ("MIG-5c1b9a10-0009-5000-8000-000000000009", 1 / 7),
}


def test_mig_resources_with_attributes_are_attributed_with_their_share(kubelet):
    kubelet.listed = api_pb2.ListPodResourcesResponse(pod_resources=[
        pod_resources("ml", f"mig-{i}", container("train", (resource, [device])))
        for i, (resource, (device, _)) in enumerate(MIG_SUFFIXED.items())])
    got = attributor(kubelet.socket, None).refresh()
    # NVML knows none of these MIG devices: each stands in for its GPU with its profile's share.
    assert {a.pod.pod: (a.gpu_uuid, a.share) for a in got.allocations} == {
        f"mig-{i}": (device, pytest.approx(share)) for i, (device, share) in enumerate(MIG_SUFFIXED.values())}


def test_mig_devices_of_one_gpu_in_one_container_make_one_series(kubelet):
    parent = MIG_DEVICES[MIG_KNOWN][0]
    second = "MIG-1d2e3f40-5a6b-5c7d-8e9f-0a1b2c3d4e60"
    kubelet.listed = api_pb2.ListPodResourcesResponse(pod_resources=[pod_resources(
        "ml", "two-slices-0",
        container("train", ("nvidia.com/mig-1g.10gb", [MIG_KNOWN]), ("nvidia.com/mig-2g.20gb", [second])))])
    mig = {**MIG_DEVICES, second: (parent, 2 / 7)}
    got = Attributor(NODE, kubelet.socket, None, mig_devices=lambda: mig).refresh()
    assert [(a.gpu_uuid, a.device_id, a.pod.container) for a in got.allocations] == [(parent, MIG_KNOWN, "train")]
    assert got.allocations[0].share == pytest.approx(3 / 7)


@pytest.mark.parametrize("name", ["nvidia.com/mig-1g.10gbx", "nvidia.com/mig-foo", "example.com/mig-1g.10gb"])
def test_names_that_are_no_mig_profile_have_no_share(name):
    assert mig_profile_share(name) is None


# --- training_job of today's job controllers ---------------------------------------

JOB_KIND_PODS = [
    # (pod as its controller makes it, the training job)
    # Kubeflow Trainer v2: a TrainJob runs as a JobSet of the same name, whose Jobs own the pods.
    (k8s_pod("llama-ft-node-0-0-x2k9d",
             labels={"trainer.kubeflow.org/trainjob-name": "llama-ft",
                     "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
                     "jobset.sigs.k8s.io/jobset-name": "llama-ft",
                     "jobset.sigs.k8s.io/replicatedjob-name": "node",
                     "jobset.sigs.k8s.io/job-index": "0",
                     "batch.kubernetes.io/job-name": "llama-ft-node-0", "job-name": "llama-ft-node-0",
                     "batch.kubernetes.io/job-completion-index": "0"},
             owners=[("batch/v1", "Job", "llama-ft-node-0")]), "llama-ft"),
    (k8s_pod("pretrain-workers-1-0-7fkq2",
             labels={"jobset.sigs.k8s.io/jobset-name": "pretrain",
                     "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                     "jobset.sigs.k8s.io/job-index": "1",
                     "batch.kubernetes.io/job-name": "pretrain-workers-1", "job-name": "pretrain-workers-1"},
             owners=[("batch/v1", "Job", "pretrain-workers-1")]), "pretrain"),
    (k8s_pod("vc-llm-worker-0",
             labels={"volcano.sh/job-name": "vc-llm", "volcano.sh/job-namespace": "ml",
                     "volcano.sh/queue-name": "default", "volcano.sh/task-spec": "worker"},
             owners=[("batch.volcano.sh/v1alpha1", "Job", "vc-llm")]), "vc-llm"),
    (k8s_pod("rl-ray-gpu-group-worker-5bq8x",
             labels={"ray.io/cluster": "rl-ray", "ray.io/node-type": "worker", "ray.io/group": "gpu-group",
                     "ray.io/is-ray-node": "yes", "ray.io/identifier": "rl-ray-worker",
                     "app.kubernetes.io/created-by": "kuberay-operator"},
             owners=[("ray.io/v1", "RayCluster", "rl-ray")]), "rl-ray"),
    # A RayJob's pods name only the cluster it made for itself.
    (k8s_pod("ppo-q4m2x-head-8xk2j",
             labels={"ray.io/cluster": "ppo-q4m2x", "ray.io/node-type": "head", "ray.io/group": "headgroup",
                     "ray.io/is-ray-node": "yes"},
             owners=[("ray.io/v1", "RayCluster", "ppo-q4m2x")]), "ppo-q4m2x"),
    # LeaderWorkerSet under Kueue: the leader is owned by the set's StatefulSet, each group's
    # workers by a StatefulSet of their own; Kueue names a workload per group.
    (k8s_pod("lws-1",
             labels={"leaderworkerset.sigs.k8s.io/name": "lws", "leaderworkerset.sigs.k8s.io/group-index": "1",
                     "leaderworkerset.sigs.k8s.io/worker-index": "0",
                     "kueue.x-k8s.io/pod-group-name": "leaderworkerset-lws-1-617bf",
                     "kueue.x-k8s.io/prebuilt-workload-name": "leaderworkerset-lws-1-617bf",
                     "kueue.x-k8s.io/managed": "true", "kueue.x-k8s.io/queue-name": "lws-lq"},
             annotations={"kueue.x-k8s.io/workload": "leaderworkerset-lws-1-617bf"},
             owners=[("apps/v1", "StatefulSet", "lws")]), "lws"),
    (k8s_pod("lws-1-1",
             labels={"leaderworkerset.sigs.k8s.io/name": "lws", "leaderworkerset.sigs.k8s.io/group-index": "1",
                     "leaderworkerset.sigs.k8s.io/worker-index": "1",
                     "kueue.x-k8s.io/pod-group-name": "leaderworkerset-lws-1-617bf",
                     "kueue.x-k8s.io/managed": "true"},
             owners=[("apps/v1", "StatefulSet", "lws-1")]), "lws"),
    # Plain pods that Kueue admits as one group.
    (k8s_pod("batch-infer-0",
             labels={"kueue.x-k8s.io/pod-group-name": "batch-infer", "kueue.x-k8s.io/managed": "true",
                     "kueue.x-k8s.io/queue-name": "user-queue"},
             annotations={"kueue.x-k8s.io/pod-group-total-count": "2"}), "batch-infer"),
]


def test_training_job_of_each_job_controller(kubelet, apiserver):
    gpus = [f"GPU-7e57{i:04d}-0000-4000-8000-000000000000" for i in range(len(JOB_KIND_PODS))]
    kubelet.listed = api_pb2.ListPodResourcesResponse(pod_resources=[
        pod_resources("ml", pod["metadata"]["name"], container("main", ("nvidia.com/gpu", [gpu])))
        for (pod, _), gpu in zip(JOB_KIND_PODS, gpus)])
    apiserver.pod_list = pod_list(*(pod for pod, _ in JOB_KIND_PODS))
    got = attributor(kubelet.socket, kube_client(apiserver)).refresh()
    assert {a.pod.pod: (a.gpu_uuid, a.pod.training_job) for a in got.allocations} == {
        pod["metadata"]["name"]: (gpu, job) for (pod, job), gpu in zip(JOB_KIND_PODS, gpus)}


def test_job_label_precedence():
    # Every label at once, each naming its own controller: the first wins; take it away and the
    # next does. A TrainJob's pods carry the JobSet and batch Job labels too, and a
    # LeaderWorkerSet's pods Kueue's: the job's own label comes first.
    ordered = [("trainer.kubeflow.org/trainjob-name", "trainjob"),
               ("training.kubeflow.org/job-name", "pytorchjob"),
               ("jobset.sigs.k8s.io/jobset-name", "jobset"),
               ("leaderworkerset.sigs.k8s.io/name", "lws"),
               ("volcano.sh/job-name", "volcano"),
               ("ray.io/cluster", "raycluster"),
               ("batch.kubernetes.io/job-name", "batch-job"),
               ("job-name", "legacy-job"),
               ("kueue.x-k8s.io/pod-group-name", "kueue-group")]
    labels = dict(ordered)
    for key, job in ordered:
        assert training_job("p", labels, [owner("Job", "owner-job")]) == job
        del labels[key]
    assert training_job("p", labels, [owner("Job", "owner-job")]) == "owner-job"


# --- the API server's address and credentials -------------------------------------

def service_account(directory: Path, ca: str, token: str) -> Path:
    """A pod's mounted service account: its token and the cluster's CA."""
    directory.mkdir()
    (directory / "token").write_text(token + "\n")
    shutil.copy(ca, directory / "ca.crt")
    return directory


def in_cluster(server: FakeApiServer, account: Path) -> KubeClient:
    return KubeClient.from_environment(
        timeout_s=2.0, service_account=str(account),
        environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)})


def test_in_a_pod_the_api_is_read_over_tls_with_the_service_accounts_token_read_anew(tmp_path):
    cert, key = self_signed(tmp_path)
    account = service_account(tmp_path / "sa", cert, "token-1")
    with serving(FakeApiServer(tls=(cert, key))) as server:
        client = in_cluster(server, account)
        assert client.host == f"https://127.0.0.1:{server.port}"
        assert client.pods(NODE)[("ml", "llm-7b-worker-0")].training_job == "llm-7b"
        # The kubelet rotates a projected token in place: the next request carries the new one.
        (account / "token").write_text("token-2\n")
        assert client.node(NODE).capacity_type == "spot"
    assert server.authorizations == ["Bearer token-1", "Bearer token-2"]


def test_the_pods_proxy_settings_are_not_used_for_the_api_server(tmp_path, monkeypatch):
    # A proxy for the outside world must not carry the service account's token: the API
    # server is asked directly, as the kubernetes package's client does.
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")   # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    cert, key = self_signed(tmp_path)
    account = service_account(tmp_path / "sa", cert, "direct")
    with serving(FakeApiServer(tls=(cert, key))) as server:
        assert in_cluster(server, account).node(NODE).zone == "us-west-2b"
    assert server.authorizations == ["Bearer direct"]


def test_a_server_the_service_accounts_ca_did_not_sign_is_refused(tmp_path):
    (tmp_path / "server").mkdir()
    (tmp_path / "other").mkdir()
    cert, key = self_signed(tmp_path / "server")
    other_ca, _ = self_signed(tmp_path / "other")
    account = service_account(tmp_path / "sa", other_ca, "secret")
    with serving(FakeApiServer(tls=(cert, key))) as server:
        with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
            in_cluster(server, account).pods(NODE)
    assert server.authorizations == []   # the token never left


def test_out_of_a_cluster_the_kubeconfig_gives_the_server_and_the_token(tmp_path):
    with serving(FakeApiServer()) as server:
        kubeconfig = tmp_path / "config"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "dev",
            "clusters": [{"name": "dev", "cluster": {"server": server.url}}],
            "users": [{"name": "me", "user": {"token": "kubeconfig-token"}}],
            "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "me"}}]}))
        client = KubeClient.from_environment(timeout_s=2.0, environ={"KUBECONFIG": str(kubeconfig)},
                                             service_account=str(tmp_path / "none"))
        assert client.node(NODE).instance_type == "p4d.24xlarge"
    assert server.authorizations == ["Bearer kubeconfig-token"]


def test_a_kubeconfig_naming_another_tls_server_name_is_refused_in_one_line(tmp_path):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "dev", "cluster": {"server": "https://10.0.0.1:6443", "tls-server-name": "api.internal"}}],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "me"}}]}))
    with pytest.raises(ConfigError, match="tls-server-name is not supported"):
        KubeClient.from_environment(environ={"KUBECONFIG": str(kubeconfig)}, service_account=str(tmp_path / "none"))


def test_neither_a_service_account_nor_a_kubeconfig_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no service account and no usable kubeconfig"):
        KubeClient.from_environment(environ={"KUBECONFIG": str(tmp_path / "absent")},
                                    service_account=str(tmp_path / "none"))


def test_a_refusal_carries_the_api_servers_own_message(apiserver):
    apiserver.status = 500
    with pytest.raises(ApiError, match="HTTP 500: etcdserver: request timed out") as raised:
        kube_client(apiserver).pods(NODE)
    assert raised.value.status == 500


def test_an_answer_of_the_wrong_shape_is_an_error_not_an_empty_node(apiserver):
    apiserver.pod_list = {"kind": "PodList", "items": [{"metadata": {"name": 7}}]}
    with pytest.raises(Exception, match="Expected `str`, got `int`"):
        kube_client(apiserver).pods(NODE)


def test_in_a_pod_the_agent_never_imports_the_kubernetes_package(tmp_path):
    # The package's models cost the agent 35 MB; in a pod nothing of it is needed.
    cert, key = self_signed(tmp_path)
    account = service_account(tmp_path / "sa", cert, "t")
    with serving(FakeApiServer(tls=(cert, key))) as server:
        # The agent's own modules alone: the test module's imports would say nothing of the agent's.
        script = ("import sys\n"
                  "from burnrate.agent.attribution.attributor import Attributor\n"
                  "from burnrate.agent.attribution.kube import KubeClient\n"
                  f"client = KubeClient.from_environment(service_account={str(account)!r}, environ={{"
                  f"'KUBERNETES_SERVICE_HOST': '127.0.0.1', 'KUBERNETES_SERVICE_PORT': '{server.port}'}})\n"
                  f"print(len(client.pods({NODE!r})))\n"
                  "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n")
        out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(len(POD_LIST["items"])), "[]"]
