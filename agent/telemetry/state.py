"""Per-rank accumulation of telemetry, bounded whatever the pods send.

Deltas become cumulative counters (what Prometheus counters need: a trainer restart
in the same pod keeps them monotonic) and gauges keep their last reported value.
Field keys are exactly catalog RANK_FIELDS, so the collector finds them.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from exporter.catalog import RANK_FIELDS

from ..snapshot import RankKey, RankState, frozen
from .schema import Record

# Message deltas summed into counters; a delta the catalog has no series for is not kept.
COUNTER_FIELDS = tuple(
    name for name in ("steps", "step_s", "data_wait_s", "compute_s", "samples", "tokens", "flops",
                      "checkpoint_s")
    if name in RANK_FIELDS
)


@dataclass
class _Rank:
    values: dict[str, float]
    local_rank: int | None = None
    last_seen: float = 0.0


@dataclass
class RankTable:
    """Not thread-safe: the inbox holds its lock around every call."""

    max_ranks: int
    max_ranks_per_job: int
    max_jobs: int
    forget_after_s: float
    # Least recently updated first, so forgetting silent ranks only looks at the front.
    _ranks: OrderedDict[RankKey, _Rank] = field(default_factory=OrderedDict, init=False)
    _job_ranks: dict[tuple[str, str], int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if min(self.max_ranks, self.max_ranks_per_job, self.max_jobs) < 1 or self.forget_after_s <= 0:
            raise ValueError("telemetry limits must be positive")

    def add(self, record: Record, now: float) -> bool:
        """Fold one message in. False when it would start a rank beyond the limits."""
        self.forget_silent(now)
        key = record.key
        rank = self._ranks.get(key)
        if rank is None:
            job = (key.namespace, key.training_job)
            held = self._job_ranks.get(job)
            if len(self._ranks) >= self.max_ranks or (
                    held is None and len(self._job_ranks) >= self.max_jobs) or (
                    held is not None and held >= self.max_ranks_per_job):
                return False
            rank = self._ranks[key] = _Rank({name: 0.0 for name in COUNTER_FIELDS})
            self._job_ranks[job] = (held or 0) + 1
        else:
            self._ranks.move_to_end(key)
        _apply(rank, record)
        rank.last_seen = now
        return True

    def forget_silent(self, now: float) -> None:
        # Amortized O(1) per message. If the clock steps back, a rank behind a fresher one
        # waits until that one is forgotten too: late, never wrong about live ranks.
        cutoff = now - self.forget_after_s
        while self._ranks:
            key, rank = next(iter(self._ranks.items()))
            if rank.last_seen > cutoff:
                return
            del self._ranks[key]
            job = (key.namespace, key.training_job)
            self._job_ranks[job] -= 1
            if not self._job_ranks[job]:
                del self._job_ranks[job]

    def states(self) -> tuple[RankState, ...]:
        ordered = sorted(self._ranks.items(), key=_by_job_then_rank)
        return tuple(RankState(key, frozen(rank.values), rank.local_rank, rank.last_seen)
                     for key, rank in ordered)


def _by_job_then_rank(item: tuple[RankKey, _Rank]) -> tuple[str, str, int, str]:
    key = item[0]
    return key.namespace, key.training_job, key.rank, key.pod


def _apply(rank: _Rank, record: Record) -> None:
    values = rank.values
    for name in COUNTER_FIELDS:
        values[name] += getattr(record, name)
    values["world_size"] = float(record.world_size)
    if record.steps > 0:
        values["last_step_time"] = record.time
    # None means "not known": keep the last value rather than erase it.
    for name, value in (("loss", record.loss), ("grad_norm", record.grad_norm), ("mfu", record.mfu),
                        ("last_checkpoint_time", record.checkpoint_time)):
        if value is not None:
            values[name] = value
    if record.local_rank is not None:
        rank.local_rank = record.local_rank
