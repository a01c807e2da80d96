"""`burnrate agent`: wire the readers, the sampler, the recorder and the HTTP server."""
from __future__ import annotations

import argparse
import grp
import logging
import os
import signal
import socket
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from burnrate.exporter.errors import UserError
from burnrate.exporter.listen import listen_address
from burnrate.exporter.telemetry import DEFAULT_SOCKET_PATH, FORGET_AFTER_S, socket_path
from burnrate.exporter import counters as dcgm_counters
from burnrate.exporter import labels as L
from burnrate.exporter import webconfig
from burnrate.exporter.collector import SnapshotCollector
from burnrate.exporter.render import Exposition
from burnrate.exporter.server import MetricsServer

from .attribution.static import StaticAttributor
from .gpu import GpuReader
from .local import LocalHolders
from .sampler import Sampler
from burnrate.exporter.snapshot import NodeInfo, Snapshot

log = logging.getLogger("burnrate.agent")

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# --once on real GPUs: the interval its first read opens, as `nvidia-smi dmon` samples every second.
ONCE_INTERVAL_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("auto", "nvml", "simulated"), default="auto",
                   help="GPU reader: NVML, simulated GPUs, or NVML when a driver answers (default)")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs on this node (default 8)")
    p.add_argument("--seed", type=int, default=0, help="simulated backend seed (default 0)")
    p.add_argument("--listen", default="0.0.0.0:9400", metavar="HOST:PORT",
                   help="where /metrics and /healthz are served (default 0.0.0.0:9400, dcgm-exporter's port)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="collection interval (default 1 s)")
    p.add_argument("--telemetry-socket", default=socket_path(),
                   metavar="PATH", help=f"Unix datagram socket trainers send to (default {DEFAULT_SOCKET_PATH}; "
                   "'' disables)")
    p.add_argument("--telemetry-socket-mode", default="0666", metavar="OCTAL",
                   help="permissions of the telemetry socket (default 0666: any user on the node may send; "
                   "in Kubernetes each datagram is checked against its sending pod anyway)")
    p.add_argument("--telemetry-socket-group", metavar="GROUP",
                   help="group owning the telemetry socket, for a mode such as 0660 outside Kubernetes")
    p.add_argument("--telemetry-lock", metavar="PATH",
                   help="the lock that keeps a second agent off the telemetry socket (default: the socket's "
                   "path with .lock); in Kubernetes a path no pod mounts, since any process that can open "
                   "it can hold it")
    p.add_argument("--forget-after", type=float, default=FORGET_AFTER_S, metavar="S",
                   help="forget a rank silent this long, and a GPU or pod gone this long from the GPU-second "
                   "counters (default 300 s)")
    p.add_argument("--node", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                   help="this node's name (default $NODE_NAME, else the host name)")
    p.add_argument("--attribution", choices=("auto", "kubelet", "local"), default="auto",
                   help="who holds each GPU: the kubelet pod-resources API, or the local training ranks "
                   "(default: kubelet when its socket exists)")
    p.add_argument("--kubelet-socket", default=DEFAULT_KUBELET_SOCKET, metavar="PATH")
    p.add_argument("--refresh", type=float, default=10.0, metavar="S", help="attribution refresh (default 10 s)")
    p.add_argument("--record", metavar="DIR", help="also append every snapshot to a local recording")
    p.add_argument("--web-config", metavar="FILE", help="TLS and basic auth, exporter-toolkit format")
    p.add_argument("--cluster", default=os.environ.get("BURNRATE_CLUSTER"), metavar="NAME",
                   help="put NAME on every series as --cluster-label, for many clusters in one store "
                   "(default $BURNRATE_CLUSTER; none when unset)")
    p.add_argument("--cluster-label", default="cluster", metavar="LABEL",
                   help="the label --cluster sets (default cluster)")
    p.add_argument("--collectors", "-f", metavar="FILE",
                   help="dcgm-exporter counters file (field, type, help per line) choosing the DCGM series "
                   "exported (default: dcgm-exporter's default set)")
    p.add_argument("--once", action="store_true",
                   help="take one sample (after draining pending telemetry), print the exposition, exit; on real GPUs "
                   "two samples a second apart, since activity and rates cover the time between two")


def _cluster(name: str | None, label: str) -> dict[str, str]:
    if not name:
        return {}
    problem = L.not_a_cluster_label(label)
    if problem:
        raise UserError(problem)
    if label in dcgm_counters.LABELS_IN_USE:
        raise UserError(f"--cluster-label {label!r} is a label the agent's series already carry; choose another")
    return {label: name}


def _counters(path: str | None) -> dcgm_counters.Counters:
    if path is None:
        return dcgm_counters.DEFAULT
    try:
        chosen = dcgm_counters.read(path)
    except dcgm_counters.CountersError as exc:
        raise UserError(str(exc)) from exc
    missing = dcgm_counters.left_out(chosen)
    if missing:
        log.warning("%s leaves out %s: burnrate's findings that read them will say the data is missing",
                    path, ", ".join(missing))
    return chosen


def _socket_access(args: argparse.Namespace) -> dict[str, int | None]:
    try:
        mode = int(args.telemetry_socket_mode, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise UserError(f"--telemetry-socket-mode {args.telemetry_socket_mode!r} is not a mode such as 0660")
    group = args.telemetry_socket_group
    if group is None:
        return {"mode": mode, "group": None}
    try:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise UserError(f"--telemetry-socket-group: no group {group!r} on this machine") from None
    return {"mode": mode, "group": gid}


def _shared(lock: Path, socket_path: Path) -> bool:
    """Whether `lock` lies in the socket's directory or below it."""
    return socket_path.absolute().parent in lock.absolute().parents


def _reader(args: argparse.Namespace, telemetry) -> GpuReader:
    if args.backend in ("auto", "nvml"):
        try:
            from .gpu.nvml import NvmlReader
            return NvmlReader()
        except Exception as exc:  # no driver, no libnvidia-ml: the usual case off GPU nodes
            if args.backend == "nvml":
                raise UserError(f"NVML is not available: {exc}") from exc
            log.info("NVML not available (%s): serving %d simulated GPUs", exc, args.gpus)
    from .gpu.simulated import RankWorkload, SimulatedReader
    if args.gpus < 1:
        raise UserError("--gpus must be at least 1")
    workload = RankWorkload(telemetry.ranks, args.gpus) if telemetry else None
    return SimulatedReader(args.gpus, seed=args.seed, workload=workload, idle_when_undriven=workload is not None)


def _attribution(args: argparse.Namespace, reader: GpuReader, telemetry, sampler_ref: list):
    use_kubelet = args.attribution == "kubelet" or (
        args.attribution == "auto" and os.path.exists(args.kubelet_socket))
    if use_kubelet:
        from .attribution.attributor import Attributor
        from .attribution.kube import KubeClient
        try:
            kube = KubeClient.from_environment()
        except Exception as exc:  # no service account and no kubeconfig: allocations stay unenriched
            log.warning("Kubernetes API not configured (%s): pods are not enriched", exc)
            kube = None
        attributor = Attributor(args.node, args.kubelet_socket, kube, mig_devices=reader.mig_devices,
                                gpu_minors=reader.gpu_minors, refresh_s=args.refresh)
        if telemetry and kube is not None:
            # Datagrams are checked against the pod that sent them, and dropped where the agent
            # cannot place their sender in a listed pod (docs/security.md).
            telemetry.senders.pods = attributor.pods
        return attributor

    # Where the kernel names no rank's process, a rank silent for a few intervals has let go.
    holders = LocalHolders(held_for_s=max(3 * args.interval, 5.0))

    def allocations():
        latest = sampler_ref[0].latest if sampler_ref else None
        return holders(telemetry.ranks() if telemetry else (), latest.gpus if latest else ())

    return StaticAttributor(NodeInfo(args.node), allocations)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.interval <= 0:
        raise UserError("--interval must be positive")
    host, port = listen_address(args.listen)
    web = None
    if args.web_config:
        try:
            web = webconfig.load(args.web_config)
        except webconfig.WebConfigError as exc:
            raise UserError(str(exc)) from exc
    counters = _counters(args.collectors)
    constant = _cluster(args.cluster, args.cluster_label)

    from .gpu_time import GpuClock
    from .host import HostReader
    from .telemetry.inbox import TelemetryInbox

    with ExitStack() as stack:
        telemetry = None
        if args.telemetry_socket:
            try:
                telemetry = TelemetryInbox(args.telemetry_socket, forget_after_s=args.forget_after,
                                           lock=args.telemetry_lock, **_socket_access(args))
            except OSError as exc:
                raise UserError(f"cannot open the telemetry socket {args.telemetry_socket}: {exc.strerror or exc}"
                                " (pick another with --telemetry-socket PATH, or '' to disable)") from exc
            stack.callback(telemetry.close)
        reader = _reader(args, telemetry)
        stack.callback(reader.close)
        sampler_ref: list[Sampler] = []
        attribution = _attribution(args, reader, telemetry, sampler_ref)
        in_cluster = not isinstance(attribution, StaticAttributor)
        if telemetry and in_cluster and _shared(telemetry.lock_path, telemetry.path):
            log.warning("the telemetry lock %s is in the socket's directory, which training pods mount: any of "
                        "them can hold it and keep the agent from starting (--telemetry-lock PATH elsewhere)",
                        telemetry.lock_path)
        registry = CollectorRegistry()
        registry.register(SnapshotCollector(lambda: sampler_ref[0].latest, counters, constant))
        ProcessCollector(registry=registry)
        exposition = Exposition(registry, version=lambda: sampler_ref[0].latest)
        sinks: dict[str, Callable[[Snapshot], object]] = {}
        if args.record:
            from .recording import Recorder
            recorder = Recorder(args.record)
            stack.callback(recorder.close)
            sinks["record"] = recorder.write
        sampler = Sampler(node_name=args.node, reader=reader, attribution=attribution, telemetry=telemetry,
                          host=HostReader(), sinks=sinks, gpu_clock=GpuClock(args.interval, args.forget_after))
        sampler_ref.append(sampler)

        if args.once:
            if telemetry:
                telemetry.wait_idle(timeout=2.0)
            if in_cluster:
                attribution.refresh()
            if reader.needs_interval:
                # The first read only starts the intervals that GPM activity and the rates cover.
                sampler.collect()
                time.sleep(ONCE_INTERVAL_S)
            sampler.collect()
            sys.stdout.buffer.write(exposition.plain())
            return 0

        try:
            server = MetricsServer(host, port, exposition, _health(sampler, args.interval, telemetry), web)
        except OSError as exc:
            raise UserError(f"cannot listen on {args.listen}: {exc.strerror or exc} "
                            "(choose another with --listen HOST:PORT)") from exc
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        attribution.start()
        stack.callback(attribution.stop)
        sampler.collect()
        server.start()
        stack.callback(server.stop)
        log.info("serving http%s://%s:%d/metrics (%s, %d GPUs)", "s" if web and web.tls else "",
                 host, server.port, type(reader).__name__, len(sampler.latest.gpus))
        sampler.run(args.interval, stop)
    return 0


def _health(sampler: Sampler, interval: float, telemetry=None):
    def health() -> tuple[bool, str]:
        snap = sampler.latest
        if snap is None:
            return False, "no snapshot yet"
        if telemetry is not None:
            ok, why = telemetry.alive()
            if not ok:
                return False, why
        age = time.time() - snap.time
        if age > max(3 * interval, 10.0):
            return False, f"last snapshot is {age:.0f}s old"
        down = [g.identity.index for g in snap.gpus if not g.up]
        return True, "ok" + (f" (GPUs down: {down})" if down else "")

    return health
