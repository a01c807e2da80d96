"""The detectors: one module per finding kind (docs/findings.md), each a pure function
`detect(frames_or_views, config) -> list[Finding]` with its thresholds in that
module's `Config` dataclass.

`detect_all` runs them over one shared set of views and drops findings another
finding already explains, so that one problem is reported (and its waste counted)
once: a hung job's idle GPUs are the stall. It then merges what is left into
episodes (analyzer.detectors.episodes): one finding per problem, not per GPU and stretch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from . import episodes
from ..grid import workers
from .findings import Finding
from ..grid.frames import Frames
from . import (dataloader_starvation, diverging, gpu_error, idle_gpu, ledger_thresholds, low_mfu, oversized_serving,
               stalled, straggler, thermal_throttle, unallocated_gpu, underused_gpu)
from ..grid.workloads import TRAINING
from ..grid.views import Views

DETECTORS: dict[str, Callable[..., list[Finding]]] = {
    "dataloader_starvation": dataloader_starvation.detect,
    "idle_gpu": idle_gpu.detect,
    "unallocated_gpu": unallocated_gpu.detect,
    "straggler": straggler.detect,
    "stalled": stalled.detect,
    "diverging": diverging.detect,
    "thermal_throttle": thermal_throttle.detect,
    "gpu_error": gpu_error.detect,
    "low_mfu": low_mfu.detect,
    "underused_gpu": underused_gpu.detect,
    "oversized_serving": oversized_serving.detect,
}
# kind -> the detectors whose settings it reads as well as its own: one definition of a
# threshold (serving's target utilization, what idle is), overridden in one place.
SHARED_SETTINGS: dict[str, tuple[str, ...]] = {
    "oversized_serving": ("underused_gpu", "idle_gpu"),
}

WORKERS = min(4, os.cpu_count() or 1)

TRAINING_CAUSES = ("dataloader_starvation", "straggler", "stalled", "diverging", "low_mfu")
# kind -> kinds whose waste, on the same job and overlapping in time, is part of its own:
# a starving job's MFU is low because it waits, so only what lies beyond is counted again.
WASTE_WITHIN: dict[str, tuple[str, ...]] = {
    "low_mfu": ("dataloader_starvation", "stalled", "straggler"),
}
# kind -> kinds that, on the same job and overlapping in time, explain it.
EXPLAINED_BY: dict[str, tuple[str, ...]] = {
    "idle_gpu": ("stalled", "held_after_exit", "oversized_serving"),
    "underused_gpu": ("idle_gpu", "oversized_serving"),
}


@dataclass(frozen=True)
class DetectorConfig:
    dataloader_starvation: dataloader_starvation.Config = field(default_factory=dataloader_starvation.Config)
    idle_gpu: idle_gpu.Config = field(default_factory=idle_gpu.Config)
    unallocated_gpu: unallocated_gpu.Config = field(default_factory=unallocated_gpu.Config)
    straggler: straggler.Config = field(default_factory=straggler.Config)
    stalled: stalled.Config = field(default_factory=stalled.Config)
    diverging: diverging.Config = field(default_factory=diverging.Config)
    thermal_throttle: thermal_throttle.Config = field(default_factory=thermal_throttle.Config)
    gpu_error: gpu_error.Config = field(default_factory=gpu_error.Config)
    low_mfu: low_mfu.Config = field(default_factory=low_mfu.Config)
    underused_gpu: underused_gpu.Config = field(default_factory=underused_gpu.Config)
    oversized_serving: oversized_serving.Config = field(default_factory=oversized_serving.Config)
    episodes: episodes.Config = field(default_factory=episodes.Config)
    ledger: ledger_thresholds.Config = field(default_factory=ledger_thresholds.Config)


def detect_all(data: Frames | Views, config: DetectorConfig = DetectorConfig()) -> list[Finding]:
    views = Views.of(data)
    views.build()
    # Detectors are pure and spend their time in numpy, which runs without the GIL.
    with workers.pool(views.frames, WORKERS) as pool:
        each = pool.map(lambda kind: DETECTORS[kind](views, getattr(config, kind),
                                                     *(getattr(config, o) for o in SHARED_SETTINGS.get(kind, ()))),
                        DETECTORS)
        found = _in_window([f for fs in each for f in fs], views)
    kept = [f for f in found if not _explained(f, found) and _has_evidence(f, views)]
    kept = [_net_of_causes(f, kept) for f in kept]
    # One finding per problem and episode, once the duplicates of other problems are gone.
    merged = episodes.merge_episodes(kept, config.episodes)
    return sorted(merged, key=order)


def ended_with_their_processes(views: Views, found: list[Finding], process_ends: Mapping[tuple[str, str], float],
                               held_after_exit: list[Finding], config: DetectorConfig = DetectorConfig()
                               ) -> list[Finding]:
    """`found` once the ledger has told when jobs' last processes ended (`process_ends`): their
    stalls found again, ending there, and the GPUs they held after (`held_after_exit`,
    analyzer.costing.ledger_findings) explaining idle GPUs as a stall does."""
    if not process_ends:
        return found
    again = [f for f in _in_window(stalled.detect(views, config.stalled, process_ends), views)
             if _has_evidence(f, views)]
    kept = [f for f in found if not (f.kind == stalled.KIND and f.job in process_ends)]
    # Episodes as detect_all makes them, with their basis in the evidence.
    kept += episodes.merge_episodes(again, config.episodes) + _in_window(held_after_exit, views)
    return sorted((f for f in kept if not _explained(f, kept)), key=order)


def _in_window(findings: list[Finding], views: Views) -> list[Finding]:
    """Runs end one sample interval after their last sample; never past the window."""
    last = views.frames.window.end
    return [replace(f, end=max(min(f.end, last), f.start)) for f in findings]


def order(f: Finding) -> tuple:
    """Findings in time, then by what they name: the order every report lists them in."""
    return (f.start, f.kind, f.namespace or "", f.training_job or "", f.hostname or "", f.gpu or "",
            f.rank if f.rank is not None else -1)


def _has_evidence(finding: Finding, views: Views) -> bool:
    """A training cause is named only for a workload known to train: a serving pod's
    saw-tooth utilization is its traffic, not a starving loader."""
    if finding.kind not in TRAINING_CAUSES or finding.job is None:
        return True
    known = views.classes.get(finding.job)
    return known is not None and known.name == TRAINING


def _net_of_causes(finding: Finding, found: list[Finding]) -> Finding:
    """The finding with only the waste that its overlapping causes do not already count."""
    causes = [other for other in found if other.kind in WASTE_WITHIN.get(finding.kind, ())
              and other.job == finding.job and finding.job is not None
              and other.start < finding.end and finding.start < other.end]
    if not causes or finding.wasted_gpu_hours is None:
        return finding
    counted = sum(other.wasted_gpu_hours or 0.0 for other in causes)
    return replace(finding, wasted_gpu_hours=max(finding.wasted_gpu_hours - counted, 0.0),
                   evidence={**finding.evidence, "waste_counted_under": sorted({o.kind for o in causes}),
                             "gross_wasted_gpu_hours": finding.wasted_gpu_hours})


def _explained(finding: Finding, found: list[Finding]) -> bool:
    causes = EXPLAINED_BY.get(finding.kind, ())
    return finding.job is not None and any(
        other.kind in causes and other.job == finding.job
        and other.start < finding.end and finding.start < other.end
        for other in found)


__all__ = ["DETECTORS", "DetectorConfig", "Views", "detect_all", "ended_with_their_processes"]
