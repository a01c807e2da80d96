"""`burnrate analyze --detector-config FILE`: the detectors' thresholds from a YAML file.

    idle_gpu:
      min_minutes: 60
    straggler:
      slowdown: 1.3

Each top-level key names a detector (or `episodes`), each key under it a field of that
detector's `Config`; what the file leaves out keeps its default. The alert rules and
Grafana thresholds in manifests/ are rendered from the defaults; a team renders its own
from the same file (docs/thresholds.md), so that its rules fire where its findings do.
"""
from __future__ import annotations

import dataclasses
import math
import typing

import yaml

from ..sources.yamlfile import read_yaml
from . import DetectorConfig


class DetectorConfigError(ValueError):
    """A detector config file that cannot be used; the message is one line."""


def load_detector_config(path: str) -> DetectorConfig:
    return detector_config(read_yaml(path, "detector config", DetectorConfigError) or {}, path)


def dump_detector_config(config: DetectorConfig) -> str:
    """Every threshold of `config` as a file `load_detector_config` reads back."""
    return yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)


def detector_config(doc: object, path: str = "the detector config") -> DetectorConfig:
    """A DetectorConfig with the defaults overridden by `doc` (a file's parsed YAML)."""
    if not isinstance(doc, dict):
        raise DetectorConfigError(f"{path}: expected a mapping of detector names to their settings")
    defaults = DetectorConfig()
    names = [f.name for f in dataclasses.fields(DetectorConfig)]
    changed = {}
    for name, settings in doc.items():
        if name not in names:
            raise DetectorConfigError(f"{path}: unknown detector {name!r} (known: {', '.join(names)})")
        changed[name] = _settings(getattr(defaults, name), settings, f"{path}: {name}")
    return dataclasses.replace(defaults, **changed)


def _settings(default: object, settings: object, where: str) -> object:
    if not isinstance(settings, dict):
        raise DetectorConfigError(f"{where}: expected a mapping of settings to values")
    types = typing.get_type_hints(type(default))
    values = {}
    for key, value in settings.items():
        if key not in types:
            raise DetectorConfigError(f"{where}: unknown setting {key!r} (known: {', '.join(types)})")
        kind = types[key]
        # bool is an int, but `true` is never a threshold.
        ok = (not isinstance(value, bool) and isinstance(value, int if kind is int else (int, float))
              and math.isfinite(value) and value >= 0)
        if not ok:
            raise DetectorConfigError(f"{where}.{key}: expected a non-negative {kind.__name__}, got {value!r}")
        values[key] = kind(value)
    return dataclasses.replace(default, **values)
