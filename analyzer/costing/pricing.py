"""GPU prices: the default catalog (`prices.yaml`, each price with its date and
source) merged with a user's `--pricing FILE`, resolved per node.

Resolution order for a node: a per-node price (on-premises GPUs), then its instance
type, then its GPU model. A node none of them prices gets no price: its dollars are
null, never guessed, and `Catalog.why_unpriced` says what was tried.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..sources.yamlfile import read_yaml

DEFAULT_CATALOG = os.path.join(os.path.dirname(__file__), "prices.yaml")
SPOT = "spot"
ON_DEMAND = "on-demand"


class PricingError(ValueError):
    """An unreadable or malformed price file; the message is one line."""


@dataclass(frozen=True)
class Price:
    dollars: float            # per hour of the priced unit
    date: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class Rate:
    """What one GPU-hour on a node costs."""

    on_demand: float | None
    spot: float | None
    basis: str                # "node", "instance_type" or "gpu_model"
    fixed: bool = False       # an on-premises price: the same whatever the capacity type

    def at(self, capacity_type: str) -> float | None:
        """At the node's capacity type; unknown capacity is priced on-demand, the list price."""
        if self.fixed:
            return self.on_demand
        return self.spot if capacity_type == SPOT else self.on_demand


@dataclass(frozen=True)
class Catalog:
    instance_types: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpu_models: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def rate(self, hostname: str, instance_type: str, gpu_model: str) -> Rate | None:
        node = self.nodes.get(hostname)
        if node is not None:
            price = node["gpu_hour"]
            return Rate(price.dollars, price.dollars, "node", fixed=True)
        itype = self._instance_type(instance_type)
        if itype is not None:
            gpus = itype["gpus"]
            return Rate(_per(itype.get("on_demand"), gpus), _per(itype.get("spot"), gpus), "instance_type")
        entry = self._model(gpu_model)
        if entry is not None:
            return Rate(_per(entry.get("on_demand"), 1), _per(entry.get("spot"), 1), "gpu_model")
        return None

    def why_unpriced(self, hostname: str, instance_type: str, gpu_model: str) -> str | None:
        """None when `rate` prices the node, else one sentence naming what was looked up."""
        if self.rate(hostname, instance_type, gpu_model) is not None:
            return None
        itype, model = _text(instance_type), _text(gpu_model)
        if not itype and not model:
            return (f"node {hostname!r} reports no instance type and no GPU model, so there is nothing "
                    "to look up; give it a `nodes:` price in a --pricing file")
        by_type = (f"instance type {itype!r} is not in the price catalog" if itype
                   else "the node reports no instance type")
        by_model = f"GPU model {model!r} matches no model price" if model else "it reports no GPU model"
        return f"{by_type} and {by_model}; add {'it' if itype else 'the model'} to a --pricing file"

    def _instance_type(self, name: str) -> dict[str, Any] | None:
        exact = self.instance_types.get(name)
        if exact is not None or not _itype_key(name):
            return exact
        return next((entry for known, entry in self.instance_types.items()
                     if _itype_key(known) == _itype_key(name)), None)

    def _model(self, gpu_model: str) -> dict[str, Any] | None:
        have = set(_tokens(_text(gpu_model)))
        best, score = None, 0
        for name, entry in self.gpu_models.items():
            want = _tokens(name)
            if want and set(want) <= have and len(want) > score:
                best, score = entry, len(want)
        return best


def _per(price: Price | None, gpus: float) -> float | None:
    return None if price is None else price.dollars / gpus


def _tokens(text: str) -> list[str]:
    return [t for t in re.split(r"[^A-Z0-9]+", text.upper()) if t]


def _text(value: Any) -> str:
    # Node labels arrive through pandas: a missing one is NaN or None, not "".
    return value if isinstance(value, str) else ""


def _itype_key(name: Any) -> str:
    """Instance types compare case-insensitively, and Azure's may come with or without the
    "Standard_" prefix that its node labels carry (Standard_ND96isr_H100_v5)."""
    key = _text(name).strip().lower()
    return key.removeprefix("standard_")


def _price(value: Any, where: str) -> Price:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        dollars, date, source = float(value), None, None
    elif isinstance(value, dict) and "price" in value:
        dollars, date, source = value["price"], value.get("date"), value.get("source")
        if not isinstance(dollars, (int, float)) or isinstance(dollars, bool):
            raise PricingError(f"{where}: price must be a number, got {dollars!r}")
        dollars = float(dollars)
    else:
        raise PricingError(f"{where}: expected a number or {{price, date, source}}, got {value!r}")
    if dollars < 0:
        raise PricingError(f"{where}: price must not be negative")
    return Price(dollars, None if date is None else str(date), None if source is None else str(source))


def _section(doc: dict, name: str, path: str) -> dict[str, dict[str, Any]]:
    raw = doc.get(name) or {}
    if not isinstance(raw, dict):
        raise PricingError(f"{path}: `{name}` must be a mapping")
    out = {}
    for key, entry in raw.items():
        where = f"{path}: {name}.{key}"
        if not isinstance(entry, dict):
            raise PricingError(f"{where}: expected a mapping")
        parsed: dict[str, Any] = {}
        if name == "nodes":
            if "gpu_hour" not in entry:
                raise PricingError(f"{where}: a node needs `gpu_hour` (its price per GPU-hour)")
            parsed["gpu_hour"] = _price(entry["gpu_hour"], where + ".gpu_hour")
        else:
            for capacity in ("on_demand", "spot"):
                if capacity in entry:
                    parsed[capacity] = _price(entry[capacity], f"{where}.{capacity}")
            if not parsed:
                raise PricingError(f"{where}: needs `on_demand` and/or `spot`")
        if name == "instance_types" and "gpus" in entry:
            gpus = entry["gpus"]
            if not isinstance(gpus, (int, float)) or isinstance(gpus, bool) or gpus <= 0:
                raise PricingError(f"{where}: `gpus` must be a positive number")
            parsed["gpus"] = float(gpus)
        out[str(key)] = parsed
    return out


def _read(path: str) -> dict:
    doc = read_yaml(path, "pricing file", PricingError)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise PricingError(f"{path}: expected a mapping with instance_types, gpu_models or nodes")
    unknown = set(doc) - {"instance_types", "gpu_models", "nodes"}
    if unknown:
        raise PricingError(f"{path}: unknown sections {sorted(unknown)} "
                           "(expected instance_types, gpu_models, nodes)")
    return doc


def _same_instance_type(known: dict[str, dict[str, Any]], key: str) -> str:
    """The name `key` already has in `known`, so an override spelled "ND96asr_v4" amends
    the default "Standard_ND96asr_v4" (keeping its GPU count) instead of adding a second entry."""
    return next((name for name in known if _itype_key(name) == _itype_key(key)), key)


def load_catalog(override: str | None = None) -> Catalog:
    """The default catalog, with `override`'s entries replacing same-named ones."""
    sections: dict[str, dict] = {}
    for path in (DEFAULT_CATALOG, override):
        if path is None:
            continue
        doc = _read(path)
        for name in ("instance_types", "gpu_models", "nodes"):
            merged = sections.setdefault(name, {})
            for key, entry in _section(doc, name, path).items():
                if name == "instance_types":
                    key = _same_instance_type(merged, key)
                merged[key] = {**merged.get(key, {}), **entry}
    for key, entry in sections.get("instance_types", {}).items():
        if "gpus" not in entry:
            raise PricingError(f"{override}: instance_types.{key}: `gpus` (GPUs per instance) is required")
    return Catalog(sections.get("instance_types", {}), sections.get("gpu_models", {}), sections.get("nodes", {}))
