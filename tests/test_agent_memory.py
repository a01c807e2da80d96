"""An agent runs for months while job names come and go: what it holds must follow what is
live, not what has been seen. The agent's parts, wired as `burnrate agent` wires them, are
driven through many job-name turnovers with forgetting on a simulated clock; bench/soak.py
measures the same on the real process in real time."""
from __future__ import annotations

import gc
import tracemalloc

from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.metrics_core import Metric

from burnrate.agent.attribution.static import StaticAttributor
from burnrate.agent.gpu.simulated import RankWorkload, SimulatedReader
from burnrate.agent.gpu_time import GpuClock
from burnrate.agent.host import HostReader
from burnrate.agent.local import LocalHolders
from burnrate.agent.sampler import Sampler
from burnrate.agent.telemetry.inbox import TelemetryInbox
from burnrate.exporter.collector import SnapshotCollector
from burnrate.exporter.exposition import LabelTexts, encode
from burnrate.exporter.render import Exposition
from burnrate.exporter.snapshot import NodeInfo
from burnrate.exporter.telemetry import TelemetrySink

GPUS = 8
RANKS = 16                 # two jobs of eight ranks
TURNOVER_S = 2             # every job is renamed this often
FORGET_AFTER_S = 4.0


class Node:
    """An agent's sampler, telemetry inbox and exposition on one simulated clock, and its trainers."""

    def __init__(self, tmp_path) -> None:
        self.now = 1_700_000_000.0
        clock = lambda: self.now  # noqa: E731
        sock = str(tmp_path / "telemetry.sock")
        self.inbox = TelemetryInbox(sock, forget_after_s=FORGET_AFTER_S, clock=clock)
        reader = SimulatedReader(GPUS, clock=clock, workload=RankWorkload(self.inbox.ranks, GPUS),
                                 idle_when_undriven=True)
        holders = LocalHolders(held_for_s=5.0)
        gpus = lambda: self.sampler.latest.gpus if self.sampler.latest else ()  # noqa: E731
        attribution = StaticAttributor(NodeInfo("node-1"),
                                       lambda: holders(self.inbox.ranks(), gpus(), now=clock()))
        self.clock = GpuClock(1.0, FORGET_AFTER_S)
        self.sampler = Sampler(node_name="node-1", reader=reader, attribution=attribution, telemetry=self.inbox,
                               host=HostReader(), gpu_clock=self.clock, clock=clock)
        registry = CollectorRegistry()
        registry.register(SnapshotCollector(lambda: self.sampler.latest))
        ProcessCollector(registry=registry)
        self.exposition = Exposition(registry, version=lambda: self.sampler.latest)
        self.trainers = [TelemetrySink(sock) for _ in range(RANKS)]
        self.step = 0

    def run(self, seconds: int) -> None:
        """One report per rank, one collection and one scrape per simulated second."""
        for _ in range(seconds):
            self.step += 1
            generation = int(self.now // TURNOVER_S)
            for rank, trainer in enumerate(self.trainers):
                report = {"v": 1, "training_job": f"job-{rank // 8}-{generation}", "namespace": "ml",
                          "pod": f"trainer-{rank}", "rank": rank % 8, "world_size": 8, "local_rank": rank % 8,
                          "step": self.step, "time": self.now, "steps": 1, "step_s": 0.1, "data_wait_s": 0.004,
                          "compute_s": 0.09, "samples": 8, "tokens": 8192, "flops": 6e12, "loss": 2.5,
                          "grad_norm": 1.0, "mfu": 0.4}
                # The kernel queues about ten datagrams per socket: past that the send is dropped.
                if not trainer.send(report):
                    self.inbox.wait_idle(timeout=5.0)
                    assert trainer.send(report)
            assert self.inbox.wait_idle(timeout=5.0)
            self.sampler.collect()
            self.exposition.plain()
            self.exposition.gzipped()
            self.now += 1.0

    def close(self) -> None:
        for trainer in self.trainers:
            trainer.close()
        self.inbox.close()


def test_memory_returns_to_its_level_through_job_turnovers(tmp_path):
    node = Node(tmp_path)
    tracemalloc.start()
    try:
        node.run(3 * int(FORGET_AFTER_S))   # warm-up: the first ranks forgotten, and those after
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        node.run(60 * TURNOVER_S)           # 60 more turnovers, 960 rank names never seen again
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        node.close()
    assert node.inbox.received == RANKS * node.step and not node.inbox.rejected
    # What remains is the ranks heard from within forget-after: two or three generations of two jobs.
    live_jobs = {state.key.training_job for state in node.sampler.latest.ranks}
    assert 2 <= len(live_jobs) <= 2 * (FORGET_AFTER_S / TURNOVER_S + 1)
    holders = sum(len(entry.holders) for entry in node.sampler.latest.gpu_seconds)
    assert GPUS <= holders <= GPUS * (FORGET_AFTER_S / TURNOVER_S + 1)
    # While the exposition kept the text of every label set it had rendered (up to 16,384),
    # this grew by 1.9 MiB; since it keeps the last render's only, by about 10 KiB.
    assert grown < 128 * 1024, f"{grown / 1024:.0f} KiB more after 60 job turnovers"


def _family(**labels: str) -> Metric:
    family = Metric("burnrate_train_loss", "loss", "gauge")
    family.add_sample("burnrate_train_loss", labels, 1.0)
    return family


def test_the_exposition_keeps_the_text_of_the_label_sets_it_rendered_last_only():
    texts = LabelTexts()
    assert encode([_family(training_job="job-a", rank="0")], texts) == \
        b'# HELP burnrate_train_loss loss\n# TYPE burnrate_train_loss gauge\n' \
        b'burnrate_train_loss{rank="0",training_job="job-a"} 1\n'
    assert list(texts.last.values()) == ['{rank="0",training_job="job-a"}']
    assert encode([_family(training_job="job-b", rank="0")], texts).endswith(
        b'burnrate_train_loss{rank="0",training_job="job-b"} 1\n')
    assert list(texts.last.values()) == ['{rank="0",training_job="job-b"}']
