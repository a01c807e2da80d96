"""Findings as episodes: one finding per problem, not per GPU and per stretch.

Detectors report what their runs find: one idle stretch of one GPU, one free
stretch of one GPU. A pod holding 8 idle GPUs whose utilization blips now and then
is one problem to a person, not dozens of rows. `merge_episodes` joins findings of
one kind that name the same thing (`identity`) and lie within a gap of each other
into one finding spanning them all, with the waste summed and the basis in its
evidence: `episodes` (stretches of time merged), `hours` (their total length, not
end - start) and `gpus` (the GPU indices, sorted). Durations of the condition
(`idle_hours`, `unallocated_hours`) are totals over the members, so over GPUs too:
GPU-hours for a finding on several GPUs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Hashable, Iterable

from .findings import SEVERITIES, Finding

JOB = ("namespace", "training_job")
GPU = ("hostname", "gpu")
# kind -> the Finding fields that name one problem of that kind: findings with the
# same values are the same problem seen in several stretches or on several GPUs.
KEYS: dict[str, tuple[str, ...]] = {
    # A job's problem is the job's, whichever pods and GPUs it shows on.
    "idle_gpu": JOB, "dataloader_starvation": JOB, "stalled": JOB, "diverging": JOB, "low_mfu": JOB,
    "underused_gpu": JOB, "oversized_serving": JOB,
    # The ledger's findings are one per job already, from its whole window.
    "lost_progress": JOB, "checkpoint_overhead": JOB, "slow_startup": JOB, "held_after_exit": JOB,
    # Free capacity is released (or filled) per node: the node pool scales by node.
    "unallocated_gpu": ("hostname",),
    # A hardware fault is the GPU's, whoever held it at the time.
    "gpu_error": GPU, "thermal_throttle": GPU,
    # A straggler is a rank of a job (`identity` falls back to its GPU without telemetry).
    "straggler": JOB + ("rank",),
}
# Evidence that measures how long (or how often) the condition held: the merged
# finding's figure is the total over its members. Other figures (shares, means,
# ratios) describe one stretch and stay those of the most wasteful member.
SUMMED = ("idle_hours", "unallocated_hours", "stalled_minutes", "down_minutes")
COUNTED = ("xid_events",)           # {code: events}, added code by code
# Fields kept on a merged finding only when every member agrees.
SHARED = ("namespace", "training_job", "hostname", "pod", "rank")


@dataclass(frozen=True)
class Config:
    gap_minutes: float = 30.0
    """Findings of one problem closer than this are one episode. 30 minutes is the idle
    detector's shortest reported stretch: a pause in a problem that is shorter than the
    shortest problem worth reporting does not make it two problems (a notebook's
    health check, a pod restart). Further apart, they are separate episodes (idle two
    nights running), each with its own start, end and waste."""


def identity(finding: Finding) -> tuple[Hashable, ...]:
    """What a finding is about: findings with equal identities may merge."""
    if finding.kind == "straggler" and finding.rank is None:
        # Stragglers found from GPU signals alone have no rank: the GPU is the straggler.
        names = JOB + GPU
    else:
        names = KEYS[finding.kind]
    return (finding.kind,) + tuple(getattr(finding, name) for name in names)


def merge_episodes(findings: Iterable[Finding], config: Config = Config()) -> list[Finding]:
    """One finding per (identity, episode): members that overlap or lie within
    `config.gap_minutes` of each other merge (chained: a, b and c merge when a-b and
    b-c are close). Every finding, merged or not, gets `episodes` and `hours` in its
    evidence, and `gpus` when it names GPUs. Unsorted: detect_all sorts."""
    groups: dict[tuple[Hashable, ...], list[Finding]] = {}
    for f in findings:
        groups.setdefault(identity(f), []).append(f)
    gap_s = config.gap_minutes * 60
    return [merge(chain) for members in groups.values() for chain in clusters(members, gap_s)]


def clusters(findings: Iterable[Finding], gap_s: float) -> list[list[Finding]]:
    """Findings in chains whose consecutive members (by start) are at most `gap_s`
    apart; with gap 0, the stretches of time the findings cover."""
    out: list[list[Finding]] = []
    end = -math.inf
    for f in sorted(findings, key=lambda f: (f.start, f.end)):
        if not out or f.start > end + gap_s:
            out.append([])
        out[-1].append(f)
        end = max(end, f.end)
    return out


def merge(members: list[Finding]) -> Finding:
    """One finding for one episode of one problem (a single member gets its basis added)."""
    lead = max(members, key=lambda f: f.wasted_gpu_hours if f.wasted_gpu_hours is not None else -math.inf)
    worst = max(members, key=lambda f: SEVERITIES.index(f.severity))
    stretches = clusters(members, 0.0)
    gpus = gpu_indices(f.gpu for f in members)
    evidence = {**lead.evidence, **totals(members), "episodes": len(stretches),
                "hours": sum(max(f.end for f in s) - min(f.start for f in s) for s in stretches) / 3600}
    if gpus:
        evidence["gpus"] = [number(g) for g in gpus]
    hosts = {f.hostname for f in members if f.hostname is not None}
    if len(hosts) > 1:
        # The finding names no single node, so say which GPUs were on which.
        evidence["nodes"] = {h: [number(g) for g in gpu_indices(f.gpu for f in members if f.hostname == h)]
                             for h in sorted(hosts)}
    known = [f.wasted_gpu_hours for f in members if f.wasted_gpu_hours is not None]
    return replace(lead, severity=worst.severity, recommendation=worst.recommendation,
                   start=min(f.start for f in members), end=max(f.end for f in members),
                   gpu=",".join(gpus) if gpus else None, wasted_gpu_hours=sum(known) if known else None,
                   evidence=evidence, **{name: common(members, name) for name in SHARED})


def gpu_indices(values: Iterable[str | None]) -> list[str]:
    """The distinct GPU indices named, in numeric order ("2" before "10")."""
    return sorted({g for g in values if g is not None}, key=natural)


def natural(label: str) -> tuple[bool, int, str]:
    """Sort key of a numeric label ("2" before "10"), other labels after them."""
    return not label.isdigit(), int(label) if label.isdigit() else 0, label


def number(label: str) -> int | str:
    return int(label) if label.isdigit() else label


def totals(members: list[Finding]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in SUMMED:
        values = [f.evidence[name] for f in members if f.evidence.get(name) is not None]
        if values:
            out[name] = sum(values)
    for name in COUNTED:
        counts: dict[str, int] = {}
        for f in members:
            for code, n in f.evidence.get(name, {}).items():
                counts[code] = counts.get(code, 0) + n
        if counts:
            out[name] = {code: counts[code] for code in sorted(counts, key=natural)}
    return out


def common(members: list[Finding], name: str) -> Any:
    """The members' value of a field when they all agree, else None (unknown, not invented)."""
    values = {getattr(f, name) for f in members}
    return values.pop() if len(values) == 1 else None


__all__ = ["Config", "KEYS", "identity", "merge_episodes"]
