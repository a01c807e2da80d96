"""The analyzer on data shaped like real clusters', through real time-series databases.

The fleets come from tests/contract_fleet.py, written from the metric contract alone
(not from `burnrate simulate`): any scrape interval from 10 to 120 s, jitter, missed
scrapes, exporter restarts, pod churn, burnrate's agent beside older agents and
dcgm-exporter 4.8, 4.8.3 (`hostname`) and 4.9 (DCGM 4.7 names and base units).
They are imported into a real VictoriaMetrics and back-filled into a real Prometheus,
and the analysis is held to the generator's exact truth.

A job's GPU-hours can be off by at most one scrape interval at each end (the first
and last samples fall somewhere inside the interval that holds them), so jobs are
compared within 1 % or that quantization, whichever is larger (plus one interval per
scrape the generator dropped, which may fall at an edge); fleet totals likewise.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze, to_document
from burnrate.analyzer.sources import PrometheusSource
from tests.contract_fleet import (BASE_TIME, Fleet, Node, Series, Workload, backfill_prometheus, fleets, generate,
                                  import_victoria)
from tests.processes import prometheus, victoria_metrics

pytestmark = pytest.mark.slow
CATALOG = load_catalog(None)
SHIFT = 60 * 86400.0          # the fixed scenarios each get a window of their own in the shared database
SLOTS_FROM = 1104537600.0     # 2005-01-01T00:00:00Z: where the generated examples' slots begin
_slots = itertools.count()


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    with victoria_metrics(tmp_path_factory.mktemp("vm")) as server:
        yield server


def shifted(fleet: Fleet, by: float) -> Fleet:
    return replace(fleet, start=fleet.start + by, end=fleet.end + by,
                   series=[replace(s, t=s.t + by) for s in fleet.series])


def analysis(url: str, fleet: Fleet, **source):
    frames = PrometheusSource(url, **source).frames(Window(fleet.start, fleet.end))
    return analyze(frames, CATALOG)


def assert_matches_truth(report, fleet: Fleet) -> None:
    a, truth = report.accounting, fleet.truth
    # The identity, exactly (up to rounding).
    assert a.observed_gpu_hours == pytest.approx(a.allocated_gpu_hours + a.unallocated_gpu_hours, abs=1e-6)
    assert a.allocated_gpu_hours == pytest.approx(a.busy_gpu_hours + a.idle_gpu_hours, abs=1e-6)
    assert sum(j.gpu_hours for j in report.jobs) == pytest.approx(a.allocated_gpu_hours, abs=1e-6)
    # Against the truth, which counts time exactly: the samples can miss what lies
    # between an edge (the window's, a job's) and the first or last sample, one
    # interval and every scrape missed there (the `edge` allowance, per GPU and edge).
    edge = {n.name: ((1 + len(n.missed)) * (n.scrape_interval_s + n.jitter_s) + 15.0) / 3600 for n in fleet.nodes}
    observed_margin = sum(2 * n.gpus * edge[n.name] for n in fleet.nodes)
    held_margin = sum(2 * w.share * len(g) * edge[n] for w in fleet.workloads for n, g in w.placements)
    assert a.observed_gpu_hours == pytest.approx(truth.observed_gpu_hours, rel=0.01, abs=observed_margin)
    assert a.allocated_gpu_hours == pytest.approx(truth.allocated_gpu_hours, rel=0.01, abs=held_margin)
    assert a.idle_gpu_hours == pytest.approx(truth.idle_gpu_hours, rel=0.01, abs=held_margin)
    assert a.coverage is not None and a.coverage > 0.99
    jobs = {(j.namespace, j.training_job): j for j in report.jobs}
    assert set(jobs) == set(truth.job_gpu_hours)
    for w in fleet.workloads:
        got, want = jobs[(w.namespace, w.name)], truth.job_gpu_hours[(w.namespace, w.name)]
        if want == 0:
            continue
        margin = sum(2 * w.share * len(g) * edge[n] for n, g in w.placements)
        assert got.gpu_hours == pytest.approx(want, rel=0.01, abs=margin), w.name
        assert got.cost_dollars is not None and got.cost_dollars > 0, w.name
        if w.kind != "interactive":     # a notebook runs as a StatefulSet: serving, unless its namespace is set
            assert got.workload_class == w.kind, (w.name, got.class_basis)
    assert report.unpriced_jobs == []


@given(fleet=fleets())
# A fixed set of examples in CI; BURNRATE_EXAMPLES=N draws N new ones each run.
# No example database: tests leave nothing behind in the tree.
@settings(max_examples=int(os.environ.get("BURNRATE_EXAMPLES", "25")), deadline=None,
          derandomize=not os.environ.get("BURNRATE_EXAMPLES"), database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_any_fleet_in_victoria_metrics_accounts_like_its_truth(vm, fleet):
    # Each example in a slot of its own (a fleet spans at most a day and a few hours),
    # counted from 2005: over a thousand examples stay in the past.
    fleet = shifted(fleet, SLOTS_FROM + next(_slots) * 3 * 86400.0 - fleet.start)
    import_victoria(fleet, vm.url)
    assert_matches_truth(analysis(vm.url, fleet), fleet)


def mixed_cluster(interval: float) -> Fleet:
    """A rollout in progress: every kind of exporter at one scrape interval, with
    training, serving, an idle and a busy notebook and a batch job, and GPUs nobody holds."""
    # Each interval in a window of its own: the databases are shared by the tests.
    start = BASE_TIME + 400 * 86400.0 + interval * 86400.0
    end = start + 8 * 3600.0
    nodes = (Node("gpu-a", 8, "agent", interval, jitter_s=interval * 0.1, phase_s=3.0, missed=(start + 7200.0,)),
             Node("gpu-b", 8, "agent-old", interval, phase_s=interval / 2, restarts=(start + 3 * 3600.0,)),
             Node("gpu-c", 4, "dcgm-4.8", interval, jitter_s=2.0, instance_type="g6e.12xlarge",
                  gpu_model="NVIDIA L40S"),
             Node("gpu-d", 4, "dcgm-4.8.3", interval, phase_s=1.0, instance_type="g5.12xlarge",
                  gpu_model="NVIDIA A10G"),
             Node("gpu-e", 8, "dcgm-4.9", interval, phase_s=7.0, instance_type="p5.48xlarge",
                  gpu_model="NVIDIA H100 80GB HBM3"))
    workloads = (
        Workload("ml", "llm-pretrain", "training", "PyTorchJob", (("gpu-a", tuple(range(8))), ("gpu-e", tuple(range(8)))),
                 start - 3600.0, end + 3600.0, telemetry=True, tokens_per_step=5e5),
        Workload("ml", "finetune", "training", "PyTorchJob", (("gpu-b", (0, 1, 2, 3)),), start + 3600.0,
                 start + 5 * 3600.0),
        Workload("inference", "chat-api", "serving", "Deployment", (("gpu-c", (0, 1)),), start, end + 600.0),
        Workload("inference", "rerank", "serving", "Deployment", (("gpu-d", (0,)),), start + 1800.0, end),
        Workload("research", "nb-alice", "interactive", "Notebook", (("gpu-d", (2,)),), start, start + 6 * 3600.0,
                 util_pct=0.0),
        Workload("data", "embed-corpus", "batch", "Job", (("gpu-b", (4, 5)),), start + 600.0, start + 4 * 3600.0),
        Workload("research", "nb-bob", "interactive", "Notebook", (("gpu-d", (3,)),), start, start + 5 * 3600.0,
                 util_pct=15.0),
    )
    return generate(nodes, workloads, start, end, seed=int(interval))


@pytest.mark.parametrize("interval", [15.0, 30.0, 60.0])
def test_prometheus_and_victoria_metrics_agree_on_a_mixed_cluster(tmp_path, vm, interval):
    fleet = mixed_cluster(interval)
    import_victoria(fleet, vm.url)
    with prometheus(tmp_path, storage=backfill_prometheus(fleet, tmp_path)) as prom:
        from_prometheus = analysis(prom.url, fleet)
    from_victoria = analysis(vm.url, fleet)
    for report in (from_prometheus, from_victoria):
        assert_matches_truth(report, fleet)
    # The two databases give the same document, to the cent.
    a, b = to_document(from_prometheus), to_document(from_victoria)
    assert a["accounting"] == b["accounting"]
    assert [(j["training_job"], j["gpu_hours"], j["cost_dollars"]) for j in a["jobs"]] == \
           [(j["training_job"], j["gpu_hours"], j["cost_dollars"]) for j in b["jobs"]]
    assert sorted((f["kind"], f["training_job"]) for f in a["findings"]) == \
           sorted((f["kind"], f["training_job"]) for f in b["findings"])
    # Where allocation came from, per node, and nothing priced at null.
    kinds = {f["kind"] for f in a["findings"]}
    assert "idle_gpu" in kinds and "unallocated_gpu" in kinds
    # The idle notebook is one finding for its job, with advice for what holds it.
    [idle] = [f for f in a["findings"] if f["kind"] == "idle_gpu"]
    assert idle["training_job"] == "nb-alice" and idle["evidence"]["gpus"] == [2]
    assert idle["wasted_gpu_hours"] == pytest.approx(6.0, abs=0.1)
    # A notebook using a sixth of its GPU is underused (a StatefulSet's pods read as serving).
    [under] = [f for f in a["findings"] if f["kind"] == "underused_gpu"]
    assert under["training_job"] == "nb-bob" and under["evidence"]["mean_util_pct"] == pytest.approx(15.0, abs=2.0)
    assert under["wasted_dollars"] > 0
    # Unallocated capacity is one finding per node.
    free = [f["Hostname"] for f in a["findings"] if f["kind"] == "unallocated_gpu"]
    assert len(free) == len(set(free))
    # No training cause is named for the serving or notebook pods.
    training_causes = {"dataloader_starvation", "straggler", "stalled", "diverging", "low_mfu"}
    assert not [f for f in a["findings"] if f["kind"] in training_causes
                and f["training_job"] in ("chat-api", "rerank", "nb-alice", "nb-bob")]


def test_a_scrape_interval_hint_reads_the_same_hours(vm):
    fleet = shifted(mixed_cluster(60.0), SHIFT / 2)
    import_victoria(fleet, vm.url)
    default, hinted = analysis(vm.url, fleet), analysis(vm.url, fleet, min_step_s=60.0)
    assert hinted.accounting.allocated_gpu_hours == pytest.approx(default.accounting.allocated_gpu_hours, rel=0.005)
    hours = {j.training_job: j.gpu_hours for j in default.jobs}
    assert {j.training_job for j in hinted.jobs} == set(hours)
    for job in hinted.jobs:
        assert job.gpu_hours == pytest.approx(hours[job.training_job], rel=0.01)


def test_an_older_signals_sample_counts_are_asked_only_where_it_has_series(vm, monkeypatch):
    """At steps longer than the scrape the store is also asked how many samples each step
    held. `burnrate_gpu_allocated` is read only where no share ratio exists for its GPU (older
    agents): its counts are asked after it and only where it answered series, so a fleet of
    current agents spends no store time on them and older agents' GPUs keep their counts."""
    fleet = shifted(mixed_cluster(30.0), SHIFT / 4)
    import_victoria(fleet, vm.url)
    asked, real = [], PrometheusSource.query_range

    def spy(self, promql, *rest):
        answer = real(self, promql, *rest)
        asked.append((promql, {series["metric"].get("Hostname") for series in answer}))
        return answer

    monkeypatch.setattr(PrometheusSource, "query_range", spy)
    window = Window(fleet.start, fleet.end)

    def counted_allocations(source):
        asked.clear()
        frames = source.frames(window, step=600.0)
        return frames, [hosts for q, hosts in asked if "count_over_time(burnrate_gpu_allocated" in q]

    frames, counts = counted_allocations(PrometheusSource(vm.url))
    # One chunk (8 h at 10-minute steps): the older agents' node's GPUs, counted.
    assert counts == [{"gpu-b"}]
    assert set(frames.alloc.loc[frames.alloc["signal"] == "allocated", "Hostname"].astype(str)) == {"gpu-b"}
    # The current agent's node alone: its GPUs have share ratios, the older signal no series.
    frames, counts = counted_allocations(PrometheusSource(vm.url).on_hosts(["gpu-a"]))
    assert counts == [] and set(frames.alloc["signal"]) == {"share_ratio"}
    assert any("last_over_time(burnrate_gpu_allocated" in q for q, _ in asked)


def test_opencost_prices_a_node_where_it_runs(vm):
    """OpenCost's node_gpu_hourly_cost in the same store is the node's price (it knows
    negotiated and spot rates); the list price stays the on-demand comparison."""
    fleet = shifted(mixed_cluster(30.0), SHIFT / 3)
    times = np.arange(fleet.start, fleet.end, 60.0)
    price = Series("node_gpu_hourly_cost", {"node": "gpu-c", "instance_type": "g6e.12xlarge", "job": "opencost",
                                             "instance": "opencost:9003"}, times, np.full(len(times), 1.234))
    import_victoria(replace(fleet, series=fleet.series + [price]), vm.url)
    report = analysis(vm.url, fleet)
    chat = next(j for j in report.jobs if j.training_job == "chat-api")
    assert chat.cost_dollars == pytest.approx(chat.gpu_hours * 1.234)
    # A dcgm-exporter node does not say whether it is spot: the list price is the comparison.
    listed = CATALOG.rate("gpu-c", "", "NVIDIA L40S").on_demand
    assert chat.on_demand_cost_dollars == pytest.approx(chat.gpu_hours * listed) and listed != 1.234
    nodes = report.accounting.per_node
    assert nodes["gpu-c"]["price_basis"] == "opencost"
    assert nodes["gpu-c"]["gpu_hour_dollars"] == pytest.approx(1.234)
    assert nodes["gpu-a"]["price_basis"] == "instance_type"


def test_a_job_costs_the_same_in_every_window_that_holds_it(tmp_path):
    """Read over a day, a month or a year around it (where a year would be 48-minute
    steps, cut to the data's own span): every job's GPU-hours and dollars are the same.
    A database of its own, so that no other test's fleet shares the year."""
    fleet = mixed_cluster(30.0)
    with victoria_metrics(tmp_path) as vm:
        import_victoria(fleet, vm.url)
        reports = {days: analyze(PrometheusSource(vm.url).frames(
            Window(fleet.end + 3600.0 - days * 86400.0, fleet.end + 3600.0)), CATALOG) for days in (1, 30, 365)}
    day = {j.training_job: j for j in reports[1].jobs}
    assert len(day) == len(fleet.workloads)
    for days in (30, 365):
        jobs = {j.training_job: j for j in reports[days].jobs}
        assert set(jobs) == set(day)
        for name, job in day.items():
            assert jobs[name].gpu_hours == pytest.approx(job.gpu_hours, rel=1e-6), (days, name)
            assert jobs[name].cost_dollars == pytest.approx(job.cost_dollars, rel=1e-6), (days, name)
