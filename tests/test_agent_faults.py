"""A failing GPU or collector degrades one part of the snapshot, never the rest."""
from prometheus_client import CollectorRegistry

from burnrate.agent.attribution.static import StaticAttributor
from burnrate.agent.gpu.simulated import SimulatedReader
from burnrate.agent.sampler import Sampler
from burnrate.exporter.snapshot import NodeInfo
from burnrate.exporter.collector import SnapshotCollector
from burnrate.exporter.render import Exposition


def serve(sampler):
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: sampler.latest))
    return Exposition(registry, version=lambda: sampler.latest)


def lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_gpu_lost_mid_run_others_keep_being_served():
    reader = SimulatedReader(4, seed=3)
    sampler = Sampler(node_name="n", reader=reader, attribution=StaticAttributor(NodeInfo("n"), list))
    exposition = serve(sampler)
    sampler.collect()
    assert len(lines(exposition.plain().decode(), "DCGM_FI_DEV_GPU_UTIL")) == 4

    reader.lose(2)
    sampler.collect()
    text = exposition.plain().decode()
    up = {line.split('gpu="')[1][0]: line.rsplit(" ", 1)[1] for line in lines(text, "burnrate_gpu_up")}
    assert up == {"0": "1", "1": "1", "2": "0", "3": "1"}
    util = lines(text, "DCGM_FI_DEV_GPU_UTIL")
    assert sorted(line.split('gpu="')[1][0] for line in util) == ["0", "1", "3"]
    assert len(lines(text, "DCGM_FI_DEV_POWER_USAGE")) == 3


class BrokenHost:
    def read(self, pods):
        raise OSError("cgroup filesystem went away")


def test_a_broken_collector_is_counted_and_the_rest_is_served():
    sampler = Sampler(node_name="n", reader=SimulatedReader(2), host=BrokenHost(),
                      attribution=StaticAttributor(NodeInfo("n"), list))
    for _ in range(3):
        snap = sampler.collect()
    assert snap.stats.collection_errors["host"] == 3
    assert snap.stats.collection_errors["gpu"] == 0
    assert len(snap.gpus) == 2 and all(g.up for g in snap.gpus)
    text = serve(sampler).plain().decode()
    assert 'burnrate_agent_collection_errors_total{Hostname="n",collector="host"} 3' in text


class FlakyHost:
    """Fails with the same error, then another, then recovers."""
    def __init__(self):
        self.calls = 0

    def read(self, pods):
        self.calls += 1
        if self.calls <= 100:
            raise OSError("cgroup filesystem went away")
        if self.calls <= 101:
            raise OSError("permission denied")
        return []


def test_a_collector_failing_every_second_logs_once_per_change_not_each_time(caplog):
    """At one sample a second, a traceback per failure would drown the log for as long as
    the fault lasts: the first failure logs its traceback, a different error one line, a
    repeat nothing (the counter has it), and the recovery one line with the count."""
    sampler = Sampler(node_name="n", reader=SimulatedReader(1), host=FlakyHost(),
                      attribution=StaticAttributor(NodeInfo("n"), list))
    with caplog.at_level("INFO", logger="burnrate.agent.sampler"):
        for _ in range(102):
            snap = sampler.collect()
    assert snap.stats.collection_errors["host"] == 101
    records = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert records == [
        ("ERROR", "collector host failed: OSError: cgroup filesystem went away", True),
        ("ERROR", "collector host failed: OSError: permission denied", False),
        ("INFO", "collector host recovered after 101 failures", False),
    ]


def test_xid_events_are_counted_per_code():
    reader = SimulatedReader(1)
    for code in (79, 79, 48):
        reader.inject_xid(0, code)
    sampler = Sampler(node_name="n", reader=reader, attribution=StaticAttributor(NodeInfo("n"), list))
    sampler.collect()
    text = serve(sampler).plain().decode()
    counts = {line.split('xid="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
              for line in lines(text, "burnrate_gpu_xid_errors_total")}
    assert counts == {"48": "1", "79": "2"}
    assert lines(text, "DCGM_FI_DEV_XID_ERRORS")[0].endswith(" 48")
