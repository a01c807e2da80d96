"""Per-rank accumulation of telemetry, bounded whatever the pods send.

Deltas become cumulative counters (what Prometheus counters need: a trainer restart
in the same pod keeps them monotonic) and gauges keep their last reported value.
Field keys are exactly catalog RANK_FIELDS, so the collector finds them.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from operator import add, attrgetter

from burnrate.exporter.catalog import RANK_FIELDS
from burnrate.exporter.telemetry import FIELDS

from burnrate.exporter.snapshot import RankKey, RankState, frozen
from .schema import Record

# The contract's deltas, summed into counters; a delta the catalog has no series for is not kept.
COUNTER_FIELDS = tuple(f.name for f in FIELDS if f.delta and f.name in RANK_FIELDS)
_deltas = attrgetter(*COUNTER_FIELDS)
_identity = attrgetter("namespace", "pod", "training_job", "rank")

# (namespace, pod, training_job, rank): a plain tuple hashes and compares in C, where
# RankKey's dataclass __hash__ and __eq__ would run Python code for every message.
_Identity = tuple[str, str, str, int]


@dataclass(slots=True)
class _Rank:
    key: RankKey
    counters: list[float]              # in COUNTER_FIELDS order
    gauges: dict[str, float] = field(default_factory=dict)
    sender: str = ""
    local_rank: int | None = None
    last_seen: float = 0.0
    pid: int = 0
    # The agent reads the table several times per interval (sampler, simulated GPUs, local
    # attribution); a rank that sent nothing in between keeps its copy.
    state: RankState | None = None

    def snapshot(self) -> RankState:
        if self.state is None:
            values = frozen(dict(zip(COUNTER_FIELDS, self.counters), **self.gauges, last_report_time=self.last_seen))
            self.state = RankState(self.key, values, self.local_rank, self.last_seen, self.pid)
        return self.state


@dataclass
class RankTable:
    """Not thread-safe: the inbox holds its lock around every call. Silent ranks are
    forgotten when a new rank needs room and before every read (the inbox's ranks())."""

    max_ranks: int                # on the node
    max_ranks_per_job: int
    forget_after_s: float
    # What one sender (a pod, or a user outside pods) may start, so that a flood of made-up
    # names costs only its sender: a real pod runs about one rank per GPU, for one job.
    max_ranks_per_sender: int = 256
    max_jobs_per_sender: int = 32
    # Least recently updated first, so forgetting silent ranks only looks at the front.
    _ranks: OrderedDict[_Identity, _Rank] = field(default_factory=OrderedDict, init=False)
    _job_ranks: dict[tuple[str, str], int] = field(default_factory=dict, init=False)
    _sender_ranks: dict[str, int] = field(default_factory=dict, init=False)
    _sender_jobs: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        limits = (self.max_ranks, self.max_ranks_per_job, self.max_ranks_per_sender, self.max_jobs_per_sender)
        if min(limits) < 1 or self.forget_after_s <= 0:
            raise ValueError("telemetry limits must be positive")

    def add(self, record: Record, now: float, sender: str = "", pid: int = 0) -> bool:
        """Fold one message in. False when it would start a rank beyond the limits; `sender`
        is the budget key of whoever sent it, `pid` its process (0: unknown)."""
        identity = _identity(record)
        rank = self._ranks.get(identity)
        if rank is None or rank.last_seen <= now - self.forget_after_s:
            # Forgetting silent ranks makes room for a new one, and a rank silent that long
            # starts afresh. Updating a live rank, the usual case, needs neither.
            self.forget_silent(now)
            rank = self._ranks.get(identity) or self._start(identity, sender)
            if rank is None:
                return False
        self._ranks.move_to_end(identity)
        _apply(rank, record)
        rank.last_seen = now
        if record.final:
            # Kept after a later message (a new process of the rank): its last report is then later.
            rank.gauges["closed_time"] = now
        rank.pid = pid
        rank.state = None
        return True

    def _start(self, identity: _Identity, sender: str) -> _Rank | None:
        namespace, _, training_job, _ = identity
        job = (namespace, training_job)
        held = self._job_ranks.get(job, 0)
        jobs = self._sender_jobs.get(sender, {})
        if len(self._ranks) >= self.max_ranks or held >= self.max_ranks_per_job or (
                self._sender_ranks.get(sender, 0) >= self.max_ranks_per_sender) or (
                job not in jobs and len(jobs) >= self.max_jobs_per_sender):
            return None
        self._job_ranks[job] = held + 1
        self._sender_ranks[sender] = self._sender_ranks.get(sender, 0) + 1
        self._sender_jobs[sender] = jobs
        jobs[job] = jobs.get(job, 0) + 1
        rank = self._ranks[identity] = _Rank(RankKey(*identity), [0.0] * len(COUNTER_FIELDS), sender=sender)
        return rank

    def forget_silent(self, now: float) -> None:
        # Amortized O(1): each rank is forgotten once. If the clock steps back, a rank behind a
        # fresher one waits until that one is forgotten too: late, never wrong about live ranks.
        cutoff = now - self.forget_after_s
        while self._ranks:
            identity, rank = next(iter(self._ranks.items()))
            if rank.last_seen > cutoff:
                return
            del self._ranks[identity]
            job = (rank.key.namespace, rank.key.training_job)
            _release(self._job_ranks, job)
            _release(self._sender_ranks, rank.sender)
            jobs = self._sender_jobs[rank.sender]
            _release(jobs, job)
            if not jobs:
                del self._sender_jobs[rank.sender]

    def states(self) -> tuple[RankState, ...]:
        return tuple(rank.snapshot() for rank in sorted(self._ranks.values(), key=_by_job_then_rank))


def _release(counts: dict, key: object) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]


def _by_job_then_rank(rank: _Rank) -> tuple[str, str, int, str]:
    key = rank.key
    return key.namespace, key.training_job, key.rank, key.pod


def _apply(rank: _Rank, record: Record) -> None:
    rank.counters = list(map(add, rank.counters, _deltas(record)))
    gauges = rank.gauges
    gauges["world_size"] = float(record.world_size)
    gauges["global_step"] = float(record.step)
    if record.steps > 0:
        gauges["last_step_time"] = record.time
    # None means "not known": keep the last value rather than erase it.
    if record.loss is not None:
        gauges["loss"] = record.loss
    if record.grad_norm is not None:
        gauges["grad_norm"] = record.grad_norm
    if record.mfu is not None:
        gauges["mfu"] = record.mfu
    if record.checkpoint_time is not None:
        gauges["last_checkpoint_time"] = record.checkpoint_time
    if record.start_time is not None:
        gauges["start_time"] = record.start_time
    if record.resumed_from is not None:
        gauges["resumed_from"] = float(record.resumed_from)
    if record.local_rank is not None:
        rank.local_rank = record.local_rank
