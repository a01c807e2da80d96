"""No job wastes more than it costs: findings that claim the same GPU-time (a GPU down
while its job stalls) count it once, and a finding claims no more than its job held over
its span, in every report: hand-made findings, the simulator's scenarios at the real and
the demo's thresholds, and fleets written from the contract read back from VictoriaMetrics."""
from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings

from burnrate.analyzer.costing.cost import job_costs
from burnrate.analyzer.detectors import DetectorConfig
from burnrate.analyzer.detectors.findings import KINDS, Finding
from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.output.report import analyze
from burnrate.analyzer.costing.cost import CLAIM_ORDER
from burnrate.analyzer.sources import RecordingSource
from burnrate.dashboard.aggregate import job_table
from burnrate.demo import live_config
from burnrate.simulator.simulate import Spec, simulate
from tests.contract_fleet import fleets, import_victoria
from tests.invariants import assert_waste_within_cost
from tests.processes import victoria_metrics
from tests.test_cost import P5_ON_DEMAND
from tests.test_detectors import STEP, T0, Fleet
from tests.test_real_clusters import SLOTS_FROM, analysis, mixed_cluster, shifted

CATALOG = load_catalog(None)
HOUR = 3600.0


def two_gpu_job() -> Fleet:
    """One job on two on-demand H100s for two hours: 4 GPU-hours."""
    f = Fleet()
    f.node("n")
    for gpu in (0, 1):
        f.gpu("n", gpu)
        f.alloc("n", gpu, f"job-{gpu}", "job")
    return f


def finding(kind: str, start_h: float, end_h: float, gpu_hours: float, **where) -> Finding:
    return Finding(kind, "critical", T0 + start_h * HOUR, T0 + end_h * HOUR, namespace="ml", training_job="job",
                   wasted_gpu_hours=gpu_hours, **where)


def priced(findings: list[Finding]):
    (job,), out = job_costs(two_gpu_job().frames(), CATALOG, findings)
    return job, {f.kind: f for f in out}


def assert_job_rows_within_cost(report) -> None:
    """The dashboard's Jobs table: no row's waste above its cost."""
    rows = job_table(report, report.views)
    priced_rows = rows[rows["cost_dollars"].notna()]
    assert (priced_rows["waste_dollars"] <= priced_rows["cost_dollars"] * (1 + 1e-6) + 1e-6).all(), priced_rows


def test_every_kind_has_its_place_in_the_claim_order():
    assert sorted(CLAIM_ORDER) == sorted(KINDS)


def test_a_gpu_down_while_its_job_stalls_is_counted_once():
    # The job stalls for its last hour (both GPUs: 2 GPU-h) while GPU 0 is down (1 GPU-h), and a
    # straggler claims a fifth of the whole run: the stall's hour is the job's only once.
    job, found = priced([finding("stalled", 1, 2, 2.0), finding("gpu_error", 1, 2, 1.0, hostname="n", gpu="0"),
                         finding("straggler", 0, 2, 0.8)])
    assert found["gpu_error"].wasted_gpu_hours == pytest.approx(1.0)
    assert found["stalled"].wasted_gpu_hours == pytest.approx(1.0)
    assert found["stalled"].evidence["waste_counted_under"] == ["gpu_error"]
    assert found["stalled"].evidence["gross_wasted_gpu_hours"] == pytest.approx(2.0)
    # The straggler's claim, where it is still free: the first hour holds all of it.
    assert found["straggler"].wasted_gpu_hours == pytest.approx(0.8)
    assert job.waste_dollars["stalled"] == pytest.approx(1.0 * P5_ON_DEMAND)
    assert sum(job.waste_dollars.values()) == pytest.approx(2.8 * P5_ON_DEMAND)
    assert job.cost_dollars == pytest.approx(4.0 * P5_ON_DEMAND)


def test_claims_on_more_time_than_the_job_held_are_cut_to_what_it_held():
    job, found = priced([finding("idle_gpu", 0, 0.5, 5.0, hostname="n", gpu="1"), finding("stalled", 0.5, 2, 4.0),
                         finding("dataloader_starvation", 0, 2, 3.0)])
    # The first half hour held 1 GPU-h and the rest 3 (the sample at the half hour is in both
    # spans); the starving loader finds nothing left.
    assert found["idle_gpu"].wasted_gpu_hours == pytest.approx(1.0, abs=2 * STEP / HOUR)
    assert found["stalled"].wasted_gpu_hours == pytest.approx(3.0, abs=2 * STEP / HOUR)
    assert found["stalled"].evidence["waste_counted_under"] == []
    assert found["dataloader_starvation"].wasted_gpu_hours == pytest.approx(0.0, abs=1e-9)
    assert sum(job.waste_dollars.values()) == pytest.approx(job.cost_dollars)


def test_findings_apart_in_time_keep_their_whole_waste():
    job, found = priced([finding("stalled", 0, 1, 2.0), finding("diverging", 1, 2, 1.5)])
    assert [found[k].wasted_gpu_hours for k in ("stalled", "diverging")] == pytest.approx([2.0, 1.5])
    assert "gross_wasted_gpu_hours" not in found["stalled"].evidence
    assert found["diverging"].wasted_dollars == pytest.approx(1.5 * P5_ON_DEMAND)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> list:
    """The simulator's fleets (every scenario it plants, three seeds) at the real and the demo's thresholds."""
    reports = []
    for seed in (0, 1, 2):
        root = str(tmp_path_factory.mktemp(f"fleet{seed}"))
        simulate(root, Spec(nodes=4, gpus_per_node=8, hours=2.0, seed=seed, end=T0))
        frames = RecordingSource(root).frames()
        reports += [analyze(frames, CATALOG), analyze(frames, CATALOG, live_config(DetectorConfig()))]
    return reports


def test_no_job_of_the_simulators_scenarios_wastes_more_than_it_costs(scenarios):
    for report in scenarios:
        assert_waste_within_cost(report)
        assert_job_rows_within_cost(report)
        for j in report.jobs:
            # A job's waste is its findings' dollars, no more and no less.
            mine = [f.wasted_dollars or 0.0 for f in report.findings if f.job == (j.namespace, j.training_job)]
            assert sum(j.waste_dollars.values()) == pytest.approx(sum(mine), abs=1e-9)
    # A hung job with a GPU lost (STALL_HUNG) is in them: its two findings share the stall's time.
    shared = [f for r in scenarios for f in r.findings if "gpu_error" in f.evidence.get("waste_counted_under", ())]
    assert shared and all(f.wasted_gpu_hours < f.evidence["gross_wasted_gpu_hours"] for f in shared)


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    with victoria_metrics(tmp_path_factory.mktemp("vm")) as server:
        yield server


_slots = itertools.count()


@pytest.mark.slow
@given(fleet=fleets())
@settings(max_examples=int(os.environ.get("BURNRATE_EXAMPLES", "25")), deadline=None,
          derandomize=not os.environ.get("BURNRATE_EXAMPLES"), database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_no_job_of_a_contract_fleet_wastes_more_than_it_costs(vm, fleet):
    fleet = shifted(fleet, SLOTS_FROM + next(_slots) * 3 * 86400.0 - fleet.start)
    import_victoria(fleet, vm.url)
    report = analysis(vm.url, fleet)
    assert report.jobs
    assert_waste_within_cost(report)
    assert_job_rows_within_cost(report)


@pytest.mark.slow
def test_no_job_of_the_mixed_contract_cluster_wastes_more_than_it_costs(vm):
    fleet = mixed_cluster(15.0)
    import_victoria(fleet, vm.url)
    report = analysis(vm.url, fleet)
    assert any(j.waste_dollars and sum(j.waste_dollars.values()) > 0 for j in report.jobs)
    assert_waste_within_cost(report)
    assert_job_rows_within_cost(report)
