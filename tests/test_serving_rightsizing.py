"""Serving right-sizing (`oversized_serving`, docs/findings.md) against a fleet whose demand is known.

A Deployment of 16 one-GPU pods, scraped as dcgm-exporter is (tests/contract_fleet.py), whose
traffic follows a known hourly curve spread evenly over the replicas: each GPU's utilization is
the hour's busy GPU-equivalents / 16. The truth is computed from the curve alone: the GPUs each
hour needs at the documented 60% target, the peak, the quiet hours, and what each schedule saves.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.report import analyze, render_table, to_document
from burnrate.analyzer.sources import PrometheusSource
from tests.contract_fleet import BASE_TIME, Node, Workload, generate, import_victoria
from tests.processes import victoria_metrics

pytestmark = pytest.mark.slow

REPLICAS = 16
TARGET = 0.60                     # underused_gpu.target_util_pct, docs/findings.md
# GPUs needed in each UTC hour of the day: none at night, a peak of 13 around noon.
NEEDED = [0, 0, 0, 0, 0, 0, 2, 4, 7, 10, 12, 13, 13, 12, 11, 10, 9, 9, 10, 11, 8, 5, 3, 1]
# The busy GPU-equivalents that need exactly that many at the target: half a GPU below the
# step up, so that sampling cannot tip an hour over. Hour 23's 0.3 GPU leaves each GPU at
# 1.9%, which idle_gpu alone would call idle.
DEMAND = [TARGET * (n - 0.5) if n else 0.0 for n in NEEDED]
HELD = REPLICAS * 24.0


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    with victoria_metrics(tmp_path_factory.mktemp("vm")) as server:
        yield server


def serving_fleet(interval: float, day: int):
    start = BASE_TIME + day * 86400.0
    nodes = tuple(Node(f"gpu-{i:02d}", 1, "dcgm-4.8", interval, instance_type="g5.xlarge",
                       gpu_model="NVIDIA A10G") for i in range(REPLICAS))
    chat = Workload("inference", "chat", "serving", "Deployment", tuple((n.name, (0,)) for n in nodes),
                    start, start + 86400.0, util_pct=50.0)
    fleet = generate(nodes, (chat,), start, start + 86400.0, seed=int(interval))
    series = [replace(s, v=utilization(s.t)) if s.name == "DCGM_FI_DEV_GPU_UTIL" else s for s in fleet.series]
    return replace(fleet, series=series)


def utilization(t: np.ndarray) -> np.ndarray:
    """Each replica's share of the hour's traffic, in percent."""
    hour = (np.floor(t / 3600) % 24).astype(int)
    return np.asarray(DEMAND)[hour] * 100 / REPLICAS


@pytest.mark.parametrize("interval,day", [(15.0, 0), (60.0, 2)])
def test_the_needed_replicas_and_savings_match_the_demand_curve(vm, interval, day):
    fleet = serving_fleet(interval, day)
    import_victoria(fleet, vm.url)
    report = analyze(PrometheusSource(vm.url).frames(Window(fleet.start, fleet.end)), load_catalog(None))
    doc = to_document(report)

    [block] = doc["serving"]
    assert (block["namespace"], block["training_job"]) == ("inference", "chat")
    assert block["peak_gpus"] == block["peak_replicas"] == max(NEEDED)
    assert block["fleet_replicas"] == REPLICAS and block["gpus_per_replica"] == 1
    assert (block["autoscale_min_replicas"], block["autoscale_max_replicas"]) == (1, 13)
    assert block["zero_hours_of_day"] == [0, 1, 2, 3, 4, 5]
    by_hour = block["needed_gpus_by_hour_of_day"]
    assert sorted(by_hour) == [f"{h:02d}" for h in range(24)]
    assert all(abs(by_hour[f"{h:02d}"] - n) <= 1 for h, n in enumerate(NEEDED)), by_hour
    assert list(block["needed_gpus_by_hour"].values()) == list(by_hour.values())

    # What each schedule saves against 16 GPUs held all day, at the job's own rate.
    [job] = [j for j in doc["jobs"] if j["training_job"] == "chat"]
    assert job["gpu_hours"] == pytest.approx(HELD, rel=1e-3)
    rate = job["cost_dollars"] / job["gpu_hours"]
    assert rate == pytest.approx(1.006)            # g5.xlarge on demand, docs/pricing.md
    truth = {"fixed_at_peak": HELD - max(NEEDED) * 24,
             "autoscaled": HELD - sum(max(n, 1) for n in NEEDED),
             "scale_to_zero": HELD - sum(NEEDED)}
    for schedule, hours in truth.items():
        saved = block["savings"][schedule]
        assert saved["gpu_hours"] == pytest.approx(hours, rel=0.01), schedule
        assert saved["dollars"] == pytest.approx(hours * 1.006, rel=0.01), schedule

    # One finding to act on, its waste what the fleet held beyond its need, counted once:
    # the idle replicas at night are the surplus, not a finding of their own.
    kinds = sorted(f["kind"] for f in doc["findings"] if f["training_job"] == "chat")
    assert kinds == ["oversized_serving"]
    [finding] = [f for f in doc["findings"] if f["kind"] == "oversized_serving"]
    assert finding["wasted_gpu_hours"] == pytest.approx(truth["scale_to_zero"], rel=0.01)
    assert finding["wasted_dollars"] == pytest.approx(truth["scale_to_zero"] * 1.006, rel=0.01)
    assert sum(job["waste_dollars"].values()) <= job["cost_dollars"]
    advice = finding["recommendation"]
    assert "Run 13 replicas at the peak, not 16" in advice and "between 1 and 13 replicas" in advice
    assert "00-06h UTC" in advice and "delete" not in advice
    assert finding["evidence"]["needed_gpus_by_hour"] == block["needed_gpus_by_hour"]

    table = " ".join(render_table(report).split())      # as read, whatever width it wraps at
    assert ("inference/chat: 16 replicas held, peak needs 13, autoscale 1..13, zero 00-06h UTC; saves "
            f"fixed at peak {truth['fixed_at_peak']:,.1f} GPU-h") in table



def test_a_minute_of_an_hour_at_the_window_s_edge_sets_no_floor(vm):
    """The window opens a minute before 10:00 UTC: that minute's traffic (hour 9 needs 10) is no
    hour's, so the autoscaling floor is the quietest whole hour's (12, at 10:00 and 13:00)."""
    fleet = serving_fleet(60.0, 4)
    import_victoria(fleet, vm.url)
    start = fleet.start + 10 * 3600.0 - 60.0
    report = analyze(PrometheusSource(vm.url).frames(Window(start, fleet.start + 14 * 3600.0)),
                     load_catalog(None))
    [block] = to_document(report)["serving"]
    assert list(block["needed_gpus_by_hour"].values())[0] == NEEDED[9]      # the minute is still priced
    assert (block["autoscale_min_replicas"], block["autoscale_max_replicas"]) == (12, 13)
    assert block["needed_gpus_by_hour_of_day"] == {"10": 12, "11": 13, "12": 13, "13": 12}
