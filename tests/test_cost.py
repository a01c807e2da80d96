"""Cost arithmetic checked by hand: two hours (480 samples × 15 s) on one GPU."""
from __future__ import annotations

import math

import numpy as np
import pytest

from burnrate.analyzer.costing.cost import AdviceConfig, job_costs, spot_or_on_demand
from burnrate.analyzer.costing.ledger_findings import advised_interval
from burnrate.analyzer.detectors import detect_all
from burnrate.analyzer.output.report import analyze
from burnrate.analyzer.costing.pricing import PricingError, load_catalog
from test_detectors import Fleet

P5_ON_DEMAND = 55.04 / 8      # $ per GPU-hour
P5_SPOT = 18.00 / 8


def one_job(capacity: str = "on-demand", share: float = 1.0, instance_type: str = "p5.48xlarge",
            model: str = "NVIDIA H100 80GB HBM3", telemetry: bool = False) -> Fleet:
    f = Fleet()
    f.node("n", instance_type, capacity, model=model)
    f.gpu("n", 0, model=model)
    f.alloc("n", 0, "job-0", "job", share=share)
    if telemetry:
        f.rank("job", 0, "n", steps=10.0, tokens=40960.0)
    return f


def costs(f: Fleet, pricing: str | None = None, advice: AdviceConfig = AdviceConfig()):
    frames = f.frames()
    jobs, priced = job_costs(frames, load_catalog(pricing), detect_all(frames), advice)
    return {(j.namespace, j.training_job): j for j in jobs}, priced


def test_on_demand_gpu_hours_and_dollars():
    job = costs(one_job())[0][("ml", "job")]
    assert job.gpus == 1 and job.gpu_hours == pytest.approx(2.0)
    assert job.capacity_type == "on-demand"
    assert job.cost_dollars == pytest.approx(2 * P5_ON_DEMAND)
    assert job.on_demand_cost_dollars == pytest.approx(2 * P5_ON_DEMAND)


def test_spot_is_priced_at_spot_with_its_on_demand_equivalent():
    job = costs(one_job("spot"))[0][("ml", "job")]
    assert job.capacity_type == "spot"
    assert job.cost_dollars == pytest.approx(2 * P5_SPOT)
    assert job.on_demand_cost_dollars == pytest.approx(2 * P5_ON_DEMAND)


def test_mig_slice_costs_its_fraction():
    job = costs(one_job(share=1 / 7))[0][("ml", "job")]
    assert job.gpu_hours == pytest.approx(2 / 7, rel=1e-6)
    assert job.cost_dollars == pytest.approx(2 / 7 * P5_ON_DEMAND, rel=1e-6)


def test_time_sliced_replicas_split_the_gpu():
    f = Fleet()
    f.node("n")
    f.gpu("n", 0)
    f.alloc("n", 0, "svc-a", "svc-a", share=0.5)
    f.alloc("n", 0, "svc-b", "svc-b", share=0.5)
    jobs = costs(f)[0]
    assert [round(jobs[("ml", j)].cost_dollars, 4) for j in ("svc-a", "svc-b")] == [round(P5_ON_DEMAND, 4)] * 2


def test_on_prem_node_override(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("nodes:\n  n: {gpu_hour: {price: 1.5, date: '2026-01', source: 'amortized DGX'}}\n")
    job = costs(one_job(instance_type="on-prem", capacity="unknown"), str(prices))[0][("ml", "job")]
    assert job.cost_dollars == pytest.approx(3.0)
    assert job.on_demand_cost_dollars == pytest.approx(3.0)


def test_instance_type_override_and_gpu_model_fallback(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("instance_types:\n  p5.48xlarge: {on_demand: 40.0}\n")
    assert costs(one_job(), str(prices))[0][("ml", "job")].cost_dollars == pytest.approx(2 * 40.0 / 8)
    job = costs(one_job(instance_type="custom", model="NVIDIA A100-SXM4-80GB"))[0][("ml", "job")]
    rate = load_catalog(None).rate("", "custom", "NVIDIA A100-SXM4-80GB")
    assert rate.basis == "gpu_model" and job.cost_dollars == pytest.approx(2 * rate.on_demand)
    assert rate.on_demand > load_catalog(None).rate("", "custom", "NVIDIA A100-SXM4-40GB").on_demand


def test_unpriceable_node_gives_null_dollars_not_a_guess():
    frames = one_job(instance_type="custom", model="Foo GPU 9000")
    job = costs(frames)[0][("ml", "job")]
    assert job.cost_dollars is None and job.on_demand_cost_dollars is None
    assert job.to_dict()["cost_per_step"] is None
    # The report says which job went unpriced and why.
    report = analyze(frames.frames(), load_catalog(None))
    [unpriced] = report.unpriced_jobs
    assert (unpriced["namespace"], unpriced["training_job"]) == ("ml", "job")
    assert "'custom'" in unpriced["reason"] and "'Foo GPU 9000'" in unpriced["reason"]


def test_unit_costs_and_mfu_from_telemetry():
    job = costs(one_job(telemetry=True))[0][("ml", "job")]
    # The first sample has no interval before it: 479 intervals of 10 steps.
    assert job.steps == 4790 and job.tokens == pytest.approx(479 * 40960)
    assert job.cost_per_step == pytest.approx(2 * P5_ON_DEMAND / 4790)
    assert job.cost_per_billion_tokens == pytest.approx(2 * P5_ON_DEMAND / (479 * 40960 / 1e9))
    assert job.mfu == pytest.approx(0.45)


def test_no_telemetry_means_null_steps_tokens_mfu():
    d = costs(one_job())[0][("ml", "job")].to_dict()
    assert d["steps"] is None and d["tokens"] is None and d["mfu"] is None


def test_waste_by_cause_and_finding_dollars():
    f = Fleet()
    f.node("n", capacity="spot")
    f.gpu("n", 0, util=0.0)
    f.alloc("n", 0, "nb-0", "nb")
    jobs, priced = costs(f)
    assert [p.kind for p in priced] == ["idle_gpu"]
    assert priced[0].wasted_dollars == pytest.approx(2 * P5_SPOT)
    assert jobs[("ml", "nb")].waste_dollars["idle_gpu"] == pytest.approx(2 * P5_SPOT)


def test_dalys_interval_from_the_expected_or_the_measured_time_between_interruptions():
    # Daly's first-order optimum: Young's sqrt(2CM), less the save itself.
    assert advised_interval(60.0, 100 * 3600.0) == pytest.approx(math.sqrt(2 * 60 * 360000) - 60)
    job = costs(one_job(), advice=AdviceConfig(checkpoint_seconds=60.0))[0][("ml", "job")]
    mtbf_s = job.advice["mtbf_hours_on_spot"] * 3600
    assert job.advice["checkpoint_interval_s"] == pytest.approx(math.sqrt(2 * 60 * mtbf_s) - 60, rel=0.01)
    measured = costs(one_job(), advice=AdviceConfig(checkpoint_seconds=60.0, mtbf_seconds=3600.0))[0][("ml", "job")]
    assert measured.advice["checkpoint_interval_s"] == round(math.sqrt(2 * 60 * 3600) - 60)


def test_spot_advice_weighs_interruptions_against_the_discount():
    calm = spot_or_on_demand(10, 8, 1, P5_SPOT, P5_ON_DEMAND, 900, AdviceConfig())
    assert calm["capacity"] == "spot"
    # Interrupted every ~7 minutes and losing hours each time: retries eat the discount.
    stormy = spot_or_on_demand(10, 8, 1, P5_SPOT, P5_ON_DEMAND, 5 * 3600, AdviceConfig(6000.0))
    assert stormy["capacity"] == "on-demand"
    assert stormy["expected_spot_dollars"] > stormy["on_demand_dollars"]


@pytest.mark.parametrize("text, message", [
    ("instance_types: [1, 2]", "must be a mapping"),
    ("instance_types:\n  x: {on_demand: -1, gpus: 8}", "must not be negative"),
    ("instance_types:\n  x: {on_demand: 3}", "`gpus`"),
    ("nodes:\n  n: {price: 1}", "gpu_hour"),
    ("prices: {}", "unknown sections"),
    ("a: [", "not valid YAML"),
])
def test_bad_pricing_files_fail_with_one_line(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PricingError, match=message) as info:
        load_catalog(str(path))
    assert "\n" not in str(info.value)


def test_default_catalog_records_date_and_source_for_every_price():
    catalog = load_catalog()
    for section in (catalog.instance_types, catalog.gpu_models):
        for name, entry in section.items():
            for capacity in ("on_demand", "spot"):
                price = entry[capacity]
                assert price.dollars > 0 and price.date and price.source, (name, capacity)
    p5 = catalog.instance_types["p5.48xlarge"]
    assert p5["on_demand"].dollars == 55.04 and 0.15 <= p5["spot"].dollars / 55.04 <= 0.40
    assert np.isclose(catalog.rate("h", "a3-highgpu-8g", "").on_demand, 88.49 / 8)
