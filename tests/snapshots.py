"""Snapshots built from the real simulated reader and sampler: a fixed, fully deterministic
one, and a node recorded by the real Recorder."""
import itertools

from burnrate.agent.attribution.static import StaticAttributor
from burnrate.agent.gpu.simulated import SimulatedReader
from burnrate.agent.gpu_time import GpuClock
from burnrate.agent.recording import Recorder
from burnrate.agent.sampler import Sampler
from burnrate.exporter.snapshot import Allocation, NodeInfo, PodRef, RankKey, RankState, frozen
from burnrate.exporter.catalog import RANK_FIELDS


class FixedTelemetry:
    received = 12
    rejected = {"malformed": 2}
    relabelled = 1

    def ranks(self):
        values = dict(zip(RANK_FIELDS, (120, 60.0, 3.0, 55.5, 960, 983040, 7.2e14, 0.41, 2.75,
                                        1.5, 1700000000.0, 1700000001.5, 1700000001.5, 2, 1699999000.0, 4.5, 1.25, 1120,
                                        1699990000.0, 1000)))
        return tuple(RankState(RankKey("ml", f"llm-worker-{r}", "llm", r), frozen(values), r, 1700000000.0)
                     for r in range(2))


def fixed_snapshot(gpus: int = 2):
    ticks = itertools.count(0.0, 15.0)
    reader = SimulatedReader(gpus, seed=7, clock=lambda: next(ticks), hot_gpus=[1])
    reader.inject_xid(1, 79)
    node = NodeInfo("gpu-node-1", "p5.48xlarge", "spot", "us-east-1a")
    uuid0 = reader.read()[0].identity.uuid
    attribution = StaticAttributor(node, lambda: [Allocation(uuid0, uuid0, PodRef("ml", "llm-worker-0", "trainer", "llm"))])
    collected = itertools.count(1700000000.0 - 19 * 15.0, 15.0)
    sampler = Sampler(node_name="gpu-node-1", reader=reader, attribution=attribution, telemetry=FixedTelemetry(),
                      gpu_clock=GpuClock(interval_s=15.0, keep_s=300.0), clock=lambda: next(collected))
    for _ in range(20):
        snap = sampler.collect()
    # Durations are wall-clock measurements: pin them so the text is reproducible.
    stats = snap.stats.__class__(**{**snap.stats.__dict__, "collection_seconds": frozen({"gpu": 0.001})})
    return snap.__class__(**{**snap.__dict__, "stats": stats})


def record_live_node(root: str, start: float, seconds: int, every_s: float, job: str = "live") -> None:
    """The agent's own path, as in the demo: its simulated GPUs, held by one job, sampled
    by the real Sampler every `every_s` and appended by the real Recorder."""
    now = [start]
    reader = SimulatedReader(2, seed=3, clock=lambda: now[0])
    node = NodeInfo("live-node", "p5.48xlarge", "on-demand", "us-east-1a")
    uuids = [g.identity.uuid for g in reader.read()]
    holders = [Allocation(u, u, PodRef("demo", f"live-{i}", "trainer", job)) for i, u in enumerate(uuids)]
    sampler = Sampler(node_name="live-node", reader=reader, attribution=StaticAttributor(node, lambda: holders),
                      clock=lambda: now[0])
    recorder = Recorder(root)
    for k in range(1, int(seconds / every_s) + 1):
        now[0] = start + k * every_s
        recorder.write(sampler.collect())
    recorder.close()
