"""The synthetic fleet `burnrate simulate` writes: nodes, GPUs, jobs and the faults
injected into them. Everything here is per node, GPU or job (small); the per-sample
signals are built from it, vectorized, in `simulator.simulate`.

The plan is deterministic from the seed. One block of scenarios (every fault kind
at least once) is placed per 256 GPUs, in priority order so that small fleets get
the most important ones; the rest of the capacity runs healthy jobs, and a few
GPUs per block stay unallocated.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from burnrate.agent.gpu.simulated import H100_SXM, GpuModelSpec
from burnrate.exporter.labels import SIMULATED

# What each scenario injects (finding kinds of docs/findings.md are in `GroundTruth.kind`).
HEALTHY = "healthy"
STARVATION = "starvation"
STRAGGLER = "straggler"
STALL_IDLE = "stall_idle"        # the job hangs with its GPUs at 0% (deadlocked loader, lost storage)
STALL_HUNG = "stall_hung"        # one GPU is lost, the others spin at 100% in a hung collective
DIVERGING = "diverging"
THERMAL = "thermal"
XID = "xid"                      # a healthy job whose GPU logs transient XID errors
LOW_MFU = "low_mfu"
IDLE = "idle"                    # a notebook holding GPUs and doing nothing
EXITED = "exited"                # the trainer ends (finished or crashed); its pods hold the GPUs, idle, on
SHARED = "shared"                # a time-sliced GPU held by two replicas of a service

BLOCK_GPUS = 256
# Realized MFU of every simulated job is either below the first figure or above the
# second, so any low-MFU floor between them finds exactly the jobs listed as low_mfu.
LOW_MFU_BELOW = 0.15
HEALTHY_MFU_ABOVE = 0.30


@dataclass(frozen=True)
class GpuModel(GpuModelSpec):
    """The agent's simulated-GPU physics, plus what a fleet of them needs."""

    peak_flops: float             # dense BF16, the MFU denominator
    thermal_c_per_w: float        # steady-state heating per watt on a healthy node


H100 = GpuModel(**vars(H100_SXM), peak_flops=989e12, thermal_c_per_w=0.072)
A100 = GpuModel("NVIDIA A100-SXM4-40GB", 40960, 50.0, 400.0, 1410.0, 210.0, 1215.0, 300e9, 85.0, 467, 312e12, 0.11)


@dataclass(frozen=True)
class InstanceType:
    name: str
    model: GpuModel
    zones: tuple[str, ...]


INSTANCE_TYPES = (
    InstanceType("p5.48xlarge", H100, ("us-east-1a", "us-east-1b")),
    InstanceType("p4d.24xlarge", A100, ("us-west-2b", "us-west-2c")),
    InstanceType("a3-highgpu-8g", H100, ("us-central1-a", "us-central1-c")),
    InstanceType("ND96isr_H100_v5", H100, ("eastus-1", "eastus-2")),
)

NAMESPACES = ("ml-research", "nlp", "vision", "recsys")
JOB_NAMES = ("llama-pretrain", "gpt-sft", "bert-large", "vit-huge", "t5-xl", "mixtral-ft", "resnet152",
             "clip-contrastive", "dlrm", "whisper-ft", "diffusion-xl", "code-lm")
VISION = ("vit", "resnet", "diffusion")    # jobs that count samples, not tokens
USERS = ("alice", "bob", "carol", "dave", "erin", "frank")


@dataclass(frozen=True)
class Gpu:
    node: int
    index: int
    uuid: str
    pci_bus_id: str


@dataclass(frozen=True)
class Node:
    hostname: str
    instance_type: InstanceType
    capacity_type: str
    zone: str

    @property
    def model_name(self) -> str:
        return f"{self.instance_type.model.name} {SIMULATED}"


@dataclass(frozen=True)
class Holder:
    """A pod holding a GPU: a training rank, a notebook, or a time-sliced replica."""

    namespace: str
    pod: str
    container: str
    training_job: str
    rank: int | None
    share: float = 1.0


@dataclass
class Job:
    scenario: str
    namespace: str
    name: str
    gpus: list[int] = field(default_factory=list)     # indexes into Fleet.gpus, rank order
    holders: list[Holder] = field(default_factory=list)
    # training parameters (unused for notebooks and services)
    step_s: float = 1.0            # nominal wall time of one step
    compute_share: float = 0.9     # of the nominal step, the GPU's own compute
    wait_share: float = 0.02       # of the nominal step, waiting for the next batch
    mfu: float = 0.45              # MFU at the nominal step time
    samples_per_step: int = 16     # per rank
    tokens_per_sample: int = 0
    start_steps: int = 0
    checkpoint_every_s: float = 1800.0
    # faults, as sample indexes (None: not injected)
    extra_wait: float = 0.0        # starvation: extra loader wait, in nominal steps
    sawtooth_period: int = 6
    straggler_rank: int | None = None
    straggler_factor: float = 1.0
    stall_at: int | None = None
    lost_rank: int | None = None
    diverge_at: int | None = None
    nan_at: int | None = None
    thermal_rank: int | None = None
    thermal_from: int | None = None
    thermal_to: int | None = None
    xid_rank: int | None = None
    xid_at: tuple[int, ...] = ()
    exit_at: int | None = None     # the process ends here; the pods keep the GPUs to the end

    @property
    def training(self) -> bool:
        return self.scenario not in (IDLE, SHARED)

    def allocations(self) -> list[tuple[int, Holder]]:
        """(GPU, holder) pairs: a rank per GPU, a notebook on all its GPUs, replicas on one GPU."""
        if self.scenario == SHARED:
            return [(self.gpus[0], h) for h in self.holders]
        if self.scenario == IDLE:
            return [(g, self.holders[0]) for g in self.gpus]
        return list(zip(self.gpus, self.holders))


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    jobs: tuple[Job, ...]
    unallocated: tuple[int, ...]   # GPU indexes nobody holds


def _scenario_block(gpus_per_node: int) -> list[tuple[str, int]]:
    """Every fault kind once, most important first; sizes as GPUs."""
    g = gpus_per_node
    return [(STRAGGLER, min(8, g)), (STARVATION, min(4, g)), (STALL_HUNG, min(4, g)), (DIVERGING, min(2, g)),
            (THERMAL, 1), (IDLE, 1), (STALL_IDLE, min(2, g)), (XID, min(2, g)), (LOW_MFU, min(2, g)),
            (SHARED, 1), (HEALTHY, 2 * g), (HEALTHY, min(4, g)), (EXITED, min(2, g))]


class _Placer:
    """First fit for multi-node jobs (whole nodes), best fit for jobs within one node."""

    def __init__(self, nodes: int, gpus_per_node: int) -> None:
        self.g = gpus_per_node
        self.free = [list(range(n * gpus_per_node, (n + 1) * gpus_per_node)) for n in range(nodes)]

    def place(self, size: int) -> list[int] | None:
        if size > self.g:
            whole = [n for n, f in enumerate(self.free) if len(f) == self.g][: math.ceil(size / self.g)]
            if len(whole) * self.g < size:
                return None
            taken = [gpu for n in whole for gpu in self.free[n]][:size]
        else:
            fits = [n for n, f in enumerate(self.free) if len(f) >= size]
            if not fits:
                return None
            node = min(fits, key=lambda n: len(self.free[n]))
            taken = self.free[node][:size]
        for n, f in enumerate(self.free):
            self.free[n] = [gpu for gpu in f if gpu not in taken]
        return taken


def _nodes(rng: np.random.Generator, count: int) -> list[Node]:
    nodes = []
    for i in range(count):
        itype = INSTANCE_TYPES[int(rng.integers(len(INSTANCE_TYPES)))]
        # Both capacity types whenever there are two nodes: the cost model needs both.
        capacity = ("on-demand", "spot")[i] if i < 2 else ("spot" if rng.random() < 0.4 else "on-demand")
        zone = itype.zones[int(rng.integers(len(itype.zones)))]
        nodes.append(Node(f"gpu-node-{i}", itype, capacity, zone))
    return nodes


def _gpus(rng: np.random.Generator, nodes: int, gpus_per_node: int) -> list[Gpu]:
    return [Gpu(n, i, "GPU-" + str(uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | int(rng.integers(0, 2**63)),
                                             version=4)),
                f"00000000:{0x18 + 0x10 * i:02X}:00.0")
            for n in range(nodes) for i in range(gpus_per_node)]


def _pod(job: str, rank: int) -> str:
    # PyTorchJob naming: the master is rank 0, worker-N is rank N+1.
    return f"{job}-master-0" if rank == 0 else f"{job}-worker-{rank - 1}"


def _training_job(rng: np.random.Generator, scenario: str, name: str, namespace: str, gpus: list[int],
                  samples: int) -> Job:
    size = len(gpus)
    job = Job(scenario, namespace, name, gpus,
              [Holder(namespace, _pod(name, r), "pytorch", name, r) for r in range(size)],
              step_s=float(rng.uniform(0.6, 2.0)), compute_share=float(rng.uniform(0.86, 0.92)),
              wait_share=float(rng.uniform(0.005, 0.02)), mfu=float(rng.uniform(0.38, 0.55)),
              samples_per_step=int(rng.choice([8, 16, 32])),
              tokens_per_sample=0 if name.startswith(VISION) else int(rng.choice([2048, 4096])),
              start_steps=int(rng.integers(0, 200_000)), checkpoint_every_s=float(rng.choice([900, 1800, 3600])))
    at = lambda lo, hi: int(samples * rng.uniform(lo, hi))  # noqa: E731 - a fraction of the window
    if scenario == STARVATION:
        job.extra_wait, job.sawtooth_period = float(rng.uniform(2.8, 4.0)), int(rng.integers(4, 9))
    elif scenario == STRAGGLER:
        job.mfu = float(rng.uniform(0.46, 0.55))
        job.straggler_rank, job.straggler_factor = int(rng.integers(size)), float(rng.uniform(1.35, 1.5))
    elif scenario == STALL_IDLE:
        job.stall_at = at(0.35, 0.6)
    elif scenario == STALL_HUNG:
        job.stall_at = at(0.35, 0.6)
        job.lost_rank = int(rng.integers(size))
    elif scenario == DIVERGING:
        job.diverge_at = at(0.4, 0.6)
        job.nan_at = job.diverge_at + max(4, int((samples - job.diverge_at) * rng.uniform(0.3, 0.5)))
    elif scenario == THERMAL:
        job.thermal_rank, job.thermal_from, job.thermal_to = 0, at(0.2, 0.35), at(0.6, 0.8)
    elif scenario == XID:
        job.xid_rank = int(rng.integers(size))
        job.xid_at = (at(0.25, 0.45), at(0.55, 0.75))
    elif scenario == LOW_MFU:
        job.mfu = float(rng.uniform(0.06, 0.12))
    elif scenario == EXITED:
        job.exit_at = at(0.3, 0.5)
    return job


def plan(seed: int, nodes: int, gpus_per_node: int, samples: int, healthy_only: bool = False) -> Fleet:
    """Where every job runs and what goes wrong with it, from the seed alone."""
    rng = np.random.default_rng(seed)
    node_list = _nodes(rng, nodes)
    gpu_list = _gpus(rng, nodes, gpus_per_node)
    placer = _Placer(nodes, gpus_per_node)
    capacity = nodes * gpus_per_node
    blocks = max(1, round(capacity / BLOCK_GPUS))
    # A few GPUs nobody holds: the tail of some nodes, as a drained or just-freed node looks.
    unallocated: list[int] = []
    if not healthy_only and capacity >= 4:
        for node in rng.choice(nodes, size=min(nodes, 2 * blocks), replace=False):
            take = placer.free[node][-1:]
            placer.free[node] = placer.free[node][:-1]
            unallocated += take
    block = _scenario_block(gpus_per_node)
    if healthy_only:
        block = [(HEALTHY, size) for _, size in block]
    wanted = [entry for _ in range(blocks) for entry in block]
    jobs: list[Job] = []
    names: dict[str, int] = {}

    def name(base: str) -> str:
        names[base] = names.get(base, 0) + 1
        return f"{base}-{names[base]}"

    def add(scenario: str, gpus: list[int]) -> None:
        if scenario == STRAGGLER and len(gpus) < 2:
            scenario = HEALTHY    # a straggler needs peers
        namespace = NAMESPACES[int(rng.integers(len(NAMESPACES)))]
        if scenario == IDLE:
            user = USERS[int(rng.integers(len(USERS)))]
            owner = name(f"jupyter-{user}")
            jobs.append(Job(IDLE, "notebooks", owner, gpus,
                            [Holder("notebooks", f"{owner}-0", "notebook", owner, None)]))
        elif scenario == SHARED:
            owner = name("embedding-svc")
            pods = [f"{owner}-7d9f8c-{suffix}" for suffix in ("x2k4p", "q8m1z")]
            jobs.append(Job(SHARED, "inference", owner, gpus,
                            [Holder("inference", p, "server", owner, None, 0.5) for p in pods]))
        else:
            base = JOB_NAMES[int(rng.integers(len(JOB_NAMES)))]
            jobs.append(_training_job(rng, scenario, name(base), namespace, gpus, samples))

    for scenario, size in wanted:
        gpus = placer.place(size)
        if gpus is not None:
            add(scenario, gpus)
    # The rest of the capacity runs healthy jobs of usual sizes.
    for node in range(nodes):
        while placer.free[node]:
            free = len(placer.free[node])
            size = int(rng.choice([s for s in (1, 2, 4, 8) if s <= free]))
            gpus, placer.free[node] = placer.free[node][:size], placer.free[node][size:]
            add(HEALTHY, gpus)
    return Fleet(tuple(node_list), tuple(gpu_list), tuple(jobs), tuple(sorted(unallocated)))


def _truth(kind: str, job: Job | None, start: str, end: str, fleet: Fleet, gpu: int | None = None,
           rank: int | None = None) -> dict:
    host = fleet.nodes[fleet.gpus[gpu].node].hostname if gpu is not None else None
    holder = job.holders[rank if rank is not None else 0] if job is not None and gpu is not None else None
    return {"kind": kind, "namespace": job.namespace if job else None, "training_job": job.name if job else None,
            "Hostname": host, "gpu": str(fleet.gpus[gpu].index) if gpu is not None else None,
            "pod": holder.pod if holder else None, "rank": rank, "start": start, "end": end}


# GPUs held longer than this after their job's last process ended are a finding (docs/findings.md).
HELD_AFTER_EXIT_S = 600.0


def ground_truth(fleet: Fleet, time_of: Callable[[int], str], samples: int, low_mfu: set[str],
                 step_s: float) -> list[dict]:
    """The injected faults as finding kinds (docs/findings.md): {"kind", "namespace", "training_job",
    "Hostname", "gpu", "pod", "rank", "start", "end"}, null where not applicable.

    Job-wide faults (starvation, stalled, diverging, low_mfu) name the job only; faults
    of one GPU name its node, index and, when a pod holds it, the pod and rank. `end`
    is the last sample the fault shows in; an XID event starts and ends at its sample.
    `low_mfu` lists every job whose realized MFU is below LOW_MFU_BELOW (starving
    jobs among them: waiting for data is low utilization of the FLOPs paid for). A job
    whose trainer ended is `held_after_exit` once its pods have held the GPUs
    HELD_AFTER_EXIT_S after it: from the end on.
    """
    first, last = time_of(0), time_of(samples - 1)
    out = [_truth("unallocated_gpu", None, first, last, fleet, g) for g in fleet.unallocated]
    for job in fleet.jobs:
        if job.scenario == STARVATION:
            out.append(_truth("dataloader_starvation", job, first, last, fleet))
        elif job.scenario == STRAGGLER:
            r = job.straggler_rank
            out.append(_truth("straggler", job, first, last, fleet, job.gpus[r], r))
        elif job.scenario in (STALL_IDLE, STALL_HUNG):
            out.append(_truth("stalled", job, time_of(job.stall_at), last, fleet))
            if job.lost_rank is not None:
                r = job.lost_rank
                out.append(_truth("gpu_error", job, time_of(job.stall_at), last, fleet, job.gpus[r], r))
        elif job.scenario == DIVERGING:
            out.append(_truth("diverging", job, time_of(job.diverge_at), last, fleet))
        elif job.scenario == THERMAL:
            r = job.thermal_rank
            out.append(_truth("thermal_throttle", job, time_of(job.thermal_from), time_of(job.thermal_to - 1),
                              fleet, job.gpus[r], r))
        elif job.scenario == XID:
            r = job.xid_rank
            out += [_truth("gpu_error", job, time_of(at), time_of(at), fleet, job.gpus[r], r) for at in job.xid_at]
        elif job.scenario == IDLE:
            out += [dict(_truth("idle_gpu", job, first, last, fleet, g, 0), rank=None) for g in job.gpus]
        elif job.scenario == EXITED and (samples - 1 - job.exit_at) * step_s > HELD_AFTER_EXIT_S:
            out.append(_truth("held_after_exit", job, time_of(job.exit_at), last, fleet))
        if job.name in low_mfu:
            out.append(_truth("low_mfu", job, first, last, fleet))
    return out
