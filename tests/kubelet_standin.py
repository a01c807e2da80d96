"""A stand-in kubelet: the real pod-resources gRPC service on a Unix socket, listing one pod
that holds the GPUs it is given, for a real `burnrate agent --attribution kubelet` where no
kubelet runs (here, or on a GPU machine outside Kubernetes). The pod holds its GPUs from
`hold()` on, across its trainer's restarts, as a PyTorchJob's pod does while its container
restarts."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from concurrent import futures
from typing import Iterator

import grpc

from burnrate.agent.attribution.podresources.v1 import api_pb2, api_pb2_grpc


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The pod-resources service; after `hold()`, it lists one pod holding the given GPUs."""

    def __init__(self) -> None:
        self.listed = api_pb2.ListPodResourcesResponse()
        self.gpus: list[str] = []
        self.socket = ""

    def hold(self, namespace: str, pod: str, gpus: list[str]) -> None:
        self.gpus = gpus
        devices = [api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=gpus)]
        self.listed = api_pb2.ListPodResourcesResponse(pod_resources=[api_pb2.PodResources(
            namespace=namespace, name=pod, containers=[api_pb2.ContainerResources(name="trainer", devices=devices)])])

    def List(self, request, context):
        return self.listed

    def GetAllocatableResources(self, request, context):
        return api_pb2.AllocatableResourcesResponse(
            devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=self.gpus)])


@contextlib.contextmanager
def serving() -> Iterator[Kubelet]:
    """A Kubelet served on a socket of its own (`.socket`) until the block ends."""
    # Unix socket paths are limited to ~108 bytes; a test's tmp_path can be longer.
    directory = tempfile.mkdtemp(prefix="kl", dir="/tmp")
    servicer = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    servicer.socket = os.path.join(directory, "kubelet.sock")
    server.add_insecure_port(f"unix://{servicer.socket}")
    server.start()
    try:
        yield servicer
    finally:
        server.stop(None)
        shutil.rmtree(directory, ignore_errors=True)
