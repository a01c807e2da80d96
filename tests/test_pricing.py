"""The default price catalog: coverage of common GPU instances, model-name matching,
dated sources, and the sentence an unpriced node gets."""
from __future__ import annotations

import datetime as dt
import re

import pytest
import yaml

from burnrate.analyzer.costing.pricing import DEFAULT_CATALOG, Catalog, Price, load_catalog

CATALOG = load_catalog()

INSTANCE_TYPES = [
    "g4dn.xlarge", "g4dn.12xlarge", "g4dn.metal",
    "g5.xlarge", "g5.12xlarge", "g5.48xlarge",
    "g6.xlarge", "g6.12xlarge", "g6.48xlarge",
    "g6e.xlarge", "g6e.12xlarge", "g6e.48xlarge",
    "p3.2xlarge", "p3.8xlarge", "p3.16xlarge",
    "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge",
    "a2-highgpu-1g", "a2-highgpu-8g", "a2-ultragpu-8g",
    "a3-highgpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g", "a4-highgpu-8g",
    "g2-standard-4", "g2-standard-48",
    "Standard_NC24ads_A100_v4", "Standard_NC48ads_A100_v4", "Standard_NC96ads_A100_v4",
    "Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5",
    "Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4", "Standard_ND96isr_H100_v5",
    "Standard_ND96isr_H200_v5", "Standard_ND96isr_MI300X_v5",
]

# Model names as NVML / amdsmi report them, and the catalog entry each must fall back to.
MODEL_NAMES = [
    ("Tesla T4", "T4"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 NVL", "H100"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("AMD Instinct MI300X", "MI300X"),
]


def _model_rate(entry: dict) -> tuple[float, float]:
    return entry["on_demand"].dollars, entry["spot"].dollars


def _gpu_hour(entry: dict) -> tuple[float, float]:
    gpus = entry.get("gpus", 1.0)      # model prices are already per GPU-hour
    return entry["on_demand"].dollars / gpus, entry["spot"].dollars / gpus


ENTRIES = [*CATALOG.instance_types.items(), *CATALOG.gpu_models.items()]
ENTRY_IDS = [name for name, _ in ENTRIES]


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_common_gpu_instance_types_are_priced_on_demand_and_spot(instance_type):
    rate = CATALOG.rate("node-1", instance_type, "")
    assert rate is not None and rate.basis == "instance_type"
    assert rate.on_demand > 0 and rate.spot > 0


@pytest.mark.parametrize("model_name, key", MODEL_NAMES)
def test_real_model_names_match_their_fallback(model_name, key):
    rate = CATALOG.rate("node-1", "", model_name)
    assert rate is not None and rate.basis == "gpu_model"
    assert (rate.on_demand, rate.spot) == _model_rate(CATALOG.gpu_models[key])


@pytest.mark.parametrize("short, longer", [
    ("A10", "NVIDIA A100-SXM4-80GB"),
    ("L4", "NVIDIA L40S"),
    ("H100", "NVIDIA GH200 480GB"),
])
def test_a_model_token_never_matches_a_longer_model_name(short, longer):
    price = Price(1.0, "2026-11", "test")
    catalog = Catalog(gpu_models={short: {"on_demand": price, "spot": price}})
    assert catalog.rate("node-1", "", longer) is None


def test_every_instance_types_gpu_model_has_a_fallback():
    with open(DEFAULT_CATALOG, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)["instance_types"]
    unmatched = [name for name, entry in raw.items() if CATALOG.rate("", "", entry["gpu_model"]) is None]
    assert unmatched == []


@pytest.mark.parametrize("name, entry", ENTRIES, ids=ENTRY_IDS)
def test_every_price_is_dated_and_sourced(name, entry):
    for capacity in ("on_demand", "spot"):
        price = entry[capacity]
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", price.date or ""), (name, capacity, price.date)
        dt.date.fromisoformat(price.date if len(price.date) == 10 else price.date + "-01")
        assert price.source and price.source.strip(), (name, capacity)


@pytest.mark.parametrize("name, entry", ENTRIES, ids=ENTRY_IDS)
def test_gpu_hour_prices_are_sane_and_spot_is_cheaper(name, entry):
    on_demand, spot = _gpu_hour(entry)
    assert 0.10 <= on_demand <= 20.0, (name, on_demand)
    assert 0 < spot <= on_demand, (name, spot, on_demand)


@pytest.mark.parametrize("spelling", [
    "Standard_ND96isr_H100_v5", "ND96isr_H100_v5", "standard_nd96isr_h100_v5", "ND96ISR_H100_V5",
])
def test_azure_names_resolve_with_or_without_the_standard_prefix(spelling):
    rate = CATALOG.rate("node-1", spelling, "")
    assert rate is not None and rate.on_demand == pytest.approx(98.32 / 8)


def test_an_override_without_the_prefix_amends_the_default_entry(tmp_path):
    path = tmp_path / "pricing.yaml"
    path.write_text("instance_types:\n  ND96asr_v4: {on_demand: 16.0}\n")
    catalog = load_catalog(str(path))
    assert [name for name in catalog.instance_types if "nd96asr" in name.lower()] == ["Standard_ND96asr_v4"]
    rate = catalog.rate("node-1", "Standard_ND96asr_v4", "")
    assert rate.on_demand == pytest.approx(2.0) and rate.spot == pytest.approx(2.9917 / 8)


def test_why_unpriced_is_none_for_a_priced_node():
    assert CATALOG.why_unpriced("node-1", "p5.48xlarge", "NVIDIA H100 80GB HBM3") is None
    assert CATALOG.why_unpriced("node-1", "x1.big", "NVIDIA H100 80GB HBM3") is None


def test_why_unpriced_names_a_node_with_nothing_to_look_up():
    why = CATALOG.why_unpriced("node-1", "", "")
    assert "'node-1'" in why and "no instance type and no GPU model" in why and "--pricing" in why


def test_why_unpriced_names_the_unknown_instance_type_and_model():
    why = CATALOG.why_unpriced("node-1", "x1.big", "Foo GPU")
    assert why == ("instance type 'x1.big' is not in the price catalog and GPU model 'Foo GPU' "
                   "matches no model price; add it to a --pricing file")


def test_why_unpriced_names_the_unknown_model_of_a_node_without_instance_type():
    why = CATALOG.why_unpriced("node-1", "", "Foo GPU")
    assert "no instance type" in why and "GPU model 'Foo GPU' matches no model price" in why
    assert "\n" not in why
