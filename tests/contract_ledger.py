"""Training jobs whose every GPU-hour has a known destination: ground truth for the ledger.

Written from the ledger's interface definition ALONE (the burnrate_train_* metric names and
meanings, the agent's rule that a rank silent for --forget-after seconds is forgotten and its
counters start again from 0, and the ledger's category definitions). Nothing here reads or
imports burnrate's analyzer, agent, exporter or simulator. The device and allocation side
(DCGM fields, burnrate_gpu_allocated, the GPU-second counters, burnrate_node_info,
kube_pod_owner) comes from tests/contract_fleet.py's samplers, which follow the same rule.

A job holds W whole GPUs (one rank each) on one or two nodes and runs one or more runs back to
back. The generator lays each run out on an exact timeline (process start, start-up, steps with
per-rank compute / data-wait / sync splits, checkpoint saves and evaluations outside step
time, an optional stall, a crash right after its last step), computes the truth of every
ledger category from those exact intervals (never from samples), and only then samples what
the agent would export: the trainer reports about once a second, the agent's state at a
scrape holds what was reported up to REPORT_LAG_S before it, a held rank's counters stay
monotonic across trainer restarts in the same pod, and a rank silent for FORGET_AFTER_S is
forgotten (its series vanish; seen again, its counters start from 0).

Choices the interface leaves open, made here and named so that a disagreement can be traced:
- a process reports once more when it ends (crash or clean exit), so its last step is seen;
  its end, for the truth, is the completion of its last step (the brief: "a crash at its last
  step"), or for a hung process the moment its pod is deleted;
- a stall happens between steps (outside step, checkpoint and evaluation time), so it
  lengthens no step; the process keeps reporting (unchanged counters) while stalled;
- gauges the trainer only knows after a step (last step time, global step, loss, MFU) are
  first reported with the first step of a process; until then the agent either keeps the
  previous process's values where it still holds the rank (last value wins:
  JobSpec.stale_step_gauges, the default) or drops them when the new process first reports;
- a hung process keeps reporting (unchanged counters) until it ends, as a live process does;
- a job may save, or evaluate, from rank 0 alone (JobSpec.saves_on_rank0, evals_on_rank0:
  nanoGPT's `if master_process:` block), the others waiting for it in a barrier right after:
  their wait is in no save or evaluation of theirs but in the time to their next step, and the
  truth is the same as where every rank takes part (the whole job was blocked for it); a final
  save's or evaluation's wait is in no step at all;
- a run's model may blow up (RunSpec.diverge_after): from that step on its loss is not finite
  (reported as +inf) and its steps trained nothing: `diverged`, unless a later run resumed from
  before them (then `lost_progress`); a later run resumes from the last checkpoint saved before
  the blow-up;
- a last run may end, as the Hugging Face Trainer and torchtitan end training, with a save
  and (where the job evaluates) an evaluation after its last step (RunSpec.final_save): that
  time is `checkpoint` and `evaluation`, each reported once it is over; the process ends
  when they do (or hangs after them);
- a run that finishes (or a final hang, 10 minutes or more, that ends in the process's death)
  leaves its pods holding GPUs either not at all (a hang's pods are deleted together) or for
  longer than FORGET_AFTER_S plus two scrape intervals: a shorter tail after a process's end
  is in the exported series indistinguishable from a hang (the agent keeps exporting a silent
  rank for FORGET_AFTER_S), so the truth of such a case would not be decidable from the
  interface;
- a run that hangs before a restart is ended by its pods' deletion (an eviction), so that its
  end is seen as the end of their allocation; the hang counts as `restart`, which the
  definition makes everything between a run's last step and the next run's start.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import strategies as st

from tests.contract_fleet import (BASE_TIME, Node, Series, Workload, _Hold, _K8S_ALPHABET, _Scraped, _Sink,
                                  _sample_gpu, _sample_pod_owners, _scrape_times)

FORGET_AFTER_S = 300.0   # the agent's --forget-after default
REPORT_LAG_S = 1.0       # the agent's counters at a scrape hold what was reported up to this long before it
REPORT_PERIOD_S = 1.0    # the trainer reports about once a second
CATEGORIES = ("productive", "data_wait", "sync_wait", "checkpoint", "evaluation", "startup", "restart",
              "lost_progress", "diverged", "stalled", "no_process")
SAMPLES_PER_RANK_STEP = 8
TOKENS_PER_SAMPLE = 2048
H = 3600.0


# ---------------------------------------------------------------------------------------------
# what is drawn

@dataclass(frozen=True)
class RunSpec:
    """One run: a process from its start to its crash (or, for the last run, its end)."""
    steps: int                        # optimizer steps this run completes (>= 1)
    step_s: float                     # mean wall time of a step (each step varies by JobSpec.step_jitter)
    startup_s: float                  # process start -> its first step begins (load, restore)
    compute: tuple[float, ...]        # per rank: the share of a step spent computing
    data_wait: tuple[float, ...]      # per rank: the share of a step waiting for data (rest: sync)
    stall_after: int | None = None    # a stall after this step of the run (0-based, < steps - 1)
    stall_s: float = 0.0
    hang_s: float = 0.0               # alive after its last step with no step (a last run: until its pods go, or keep_s before)
    final_save: bool = False          # a last run: a save, then an evaluation (if the job evaluates), after its last step
    diverge_after: int | None = None  # the model blows up at this step of the run (0-based): this loss and later ones not finite
    # how this run follows the one before (ignored for the first run)
    new_pods: bool = False            # False: the same pods, the trainer restarts in them
    gap_s: float = 60.0               # same pods: previous process's end -> this process's start
    release_s: float = 10.0           # new pods: old process end -> old pods release their GPUs
    pending_s: float = 60.0           # new pods: old pods released -> new pods allocated
    pull_s: float = 30.0              # new pods: allocated -> process starts
    same_names: bool = False          # new pods under the old ones' names, as a PyTorchJob re-creates a failed pod


@dataclass(frozen=True)
class JobSpec:
    nodes: tuple[tuple[str, int], ...]    # (node name, ranks on it); one pod per node, one GPU per rank
    interval_s: float
    runs: tuple[RunSpec, ...]
    checkpoint_every: int                 # steps (global step numbers divisible by it)
    checkpoint_s: float
    eval_every: int | None
    eval_s: float
    alloc_start: float                    # A0: the first pod's allocation
    pod_skew_s: tuple[float, ...] = ()    # per pod, allocation (and release, but a hang's) later by this much
    schedule_s: float = 120.0             # last pod allocated -> first process starts
    keep_s: float = 0.0                   # last run's process ended: pods keep their GPUs this long after
    before_s: float = 600.0               # window start = A0 - before_s
    after_s: float = 600.0                # window end = A1 + after_s
    jitter_s: float = 0.0
    phase_s: float = 0.0
    namespace: str = "ml"
    name: str = "llm-pretrain"
    telemetry: bool = True                # ranks report burnrate_train_* at all
    report_resumed_from: bool = True      # burnrate_train_resumed_from_step is exported
    report_last_heard: bool = True        # burnrate_train_last_report_timestamp_seconds exported (an older agent: not)
    # a last run that ends (does not hang) closes its monitor as it ends, and its last report says
    # so: burnrate_train_closed_timestamp_seconds (an older monitor or agent: not)
    report_closed: bool = True
    bystander: bool = False               # a serving Deployment on one more GPU of the first node
    step_jitter: float = 0.1              # each step's wall time within +-this share of its run's mean
    saves_on_rank0: bool = False          # rank 0 alone saves (and reports it); the others wait for it
    evals_on_rank0: bool = False          # rank 0 alone evaluates; the others wait for it
    stale_step_gauges: bool = True        # a restarted trainer's step gauges read the previous process's until its first step
    seed: int = 0

    @property
    def world_size(self) -> int:
        return sum(n for _, n in self.nodes)


# ---------------------------------------------------------------------------------------------
# the exact timeline

@dataclass
class Process:
    """One run's trainer process (the same process on every rank: ranks step in lockstep)."""
    index: int
    start: float                      # S_k
    end: float                        # D_k: last step's completion (and final save), or later for a hang
    resumed_from: int                 # r_k (0: a fresh start)
    first_begin: float                # B_k: the first step begins
    step_begin: np.ndarray
    step_end: np.ndarray
    step_d: np.ndarray
    global_step: np.ndarray           # r_k + 1 .. r_k + steps
    ckpt: np.ndarray                  # per step: checkpoint seconds after it
    ckpt_end: np.ndarray
    evals: np.ndarray
    eval_end: np.ndarray
    stall: np.ndarray
    compute: tuple[float, ...]
    data_wait: tuple[float, ...]
    pods: tuple[str, ...]             # per node
    report_phase: float = 0.0
    blown_from: float = math.inf      # the first global step whose loss is NaN (the model blew up there)

    @property
    def last_step(self) -> int:
        return int(self.global_step[-1])

    @property
    def last_step_at(self) -> float:
        return float(self.step_end[-1])


@dataclass(frozen=True)
class PodHold:
    pod: str
    node: str
    gpus: tuple[int, ...]
    ranks: tuple[int, ...]
    start: float
    end: float


@dataclass
class Truth:
    gpu_hours: float
    ledger: dict[str, float]              # category -> GPU-hours
    goodput: float
    runs: list[dict]                      # per run: process_start, first_step_begin, first_step, last_step, resumed_from, last_step_number
    edges: dict[str, int]                 # per category: how many edges bound it (for tolerances)
    per_rank: list[dict[str, float]]      # rank -> category -> seconds
    held_s: list[float]                   # rank -> seconds held


@dataclass
class LedgerCase:
    spec: JobSpec
    start: float                          # the window
    end: float
    nodes: tuple[Node, ...]
    processes: list[Process]
    holds: list[PodHold]
    series: list[Series]
    truth: Truth

    @property
    def alloc_start(self) -> float:
        return min(h.start for h in self.holds)

    @property
    def alloc_end(self) -> float:
        return max(h.end for h in self.holds)

    def describe(self) -> str:
        s = self.spec
        lines = [f"job {s.namespace}/{s.name}: W={s.world_size} on {s.nodes}, scrape {s.interval_s:g} s "
                 f"(jitter {s.jitter_s:.1f}, phase {s.phase_s:.1f}), window [A0-{s.before_s:.0f}s, A1+{s.after_s:.0f}s], "
                 f"checkpoint every {s.checkpoint_every} steps ({s.checkpoint_s:.0f} s), "
                 f"eval every {s.eval_every} steps ({s.eval_s:.0f} s), keep {s.keep_s:.0f} s, "
                 f"telemetry={s.telemetry}, resumed_from exported={s.report_resumed_from}, "
                 f"last report exported={s.report_last_heard}, close exported={s.report_closed}, "
                 f"stale step gauges={s.stale_step_gauges}, saves on rank 0 alone={s.saves_on_rank0}, evaluations on rank 0 alone={s.evals_on_rank0}, "
                 f"seed={s.seed}"]
        a0 = self.alloc_start
        for h in self.holds:
            lines.append(f"  pod {h.pod} on {h.node} GPUs {h.gpus}: held [{h.start - a0:.0f}, {h.end - a0:.0f}] s after A0")
        for p, r in zip(self.processes, s.runs):
            stall = f", stall {r.stall_s:.0f} s after step {int(p.global_step[r.stall_after])}" \
                if r.stall_after is not None else ""
            lines.append(
                f"  run {p.index + 1} ({'new pods' if r.new_pods else 'same pods'}): start {p.start - a0:.0f} s, "
                f"first step begins {p.first_begin - a0:.0f} s, steps {p.resumed_from + 1}..{p.last_step} "
                f"(~{r.step_s:.2f} s), last step at {p.last_step_at - a0:.0f} s, end {p.end - a0:.0f} s, "
                f"resumed from {p.resumed_from}{stall}, hang {r.hang_s:.0f} s"
                + (f", loss not finite from step {int(p.blown_from)}" if math.isfinite(p.blown_from) else ""))
        lines.append("  truth (GPU-h): " + ", ".join(f"{c}={v:.4f}" for c, v in self.truth.ledger.items())
                     + f"; gpu_hours={self.truth.gpu_hours:.4f}, goodput={self.truth.goodput:.4f}")
        return "\n".join(lines)


def _suffix(rng: np.random.Generator, n: int) -> str:
    return "".join(rng.choice(list(_K8S_ALPHABET), n))


def _pod_names(spec: JobSpec, attempt: int, rng: np.random.Generator) -> tuple[str, ...]:
    """PyTorchJob-style names; a job re-created after an eviction gets a new attempt suffix."""
    base = spec.name if attempt == 0 else f"{spec.name}-{_suffix(rng, 5)}"
    return tuple(f"{base}-master-0" if i == 0 else f"{base}-worker-{i - 1}" for i in range(len(spec.nodes)))


def _lay_out(spec: JobSpec, run: RunSpec, index: int, start: float, resumed_from: int,
             rng: np.random.Generator, pods: tuple[str, ...]) -> Process:
    n = run.steps
    d = run.step_s * rng.uniform(1.0 - spec.step_jitter, 1.0 + spec.step_jitter, n)
    g = resumed_from + 1 + np.arange(n)
    ck = np.where(g % spec.checkpoint_every == 0, spec.checkpoint_s, 0.0)
    ev = np.where(g % spec.eval_every == 0, spec.eval_s, 0.0) if spec.eval_every else np.zeros(n)
    # a run ends right at its last step's completion, or a finishing one after its final save
    # and evaluation
    ck[-1] = spec.checkpoint_s if run.final_save else 0.0
    ev[-1] = spec.eval_s if run.final_save and spec.eval_every else 0.0
    stall = np.zeros(n)
    if run.stall_after is not None:
        stall[run.stall_after] = run.stall_s
    begin0 = start + run.startup_s
    block = d + ck + ev + stall
    begin = begin0 + np.concatenate([[0.0], np.cumsum(block)[:-1]])
    end = begin + d
    ckpt_end = end + ck
    eval_end = ckpt_end + ev
    last = float(eval_end[-1])
    return Process(index=index, start=start, end=last + run.hang_s, resumed_from=resumed_from, first_begin=begin0,
                   step_begin=begin, step_end=end, step_d=d, global_step=g, ckpt=ck, ckpt_end=ckpt_end, evals=ev,
                   eval_end=eval_end, stall=stall, compute=run.compute, data_wait=run.data_wait, pods=pods,
                   report_phase=float(rng.uniform(0.0, REPORT_PERIOD_S)),
                   blown_from=math.inf if run.diverge_after is None else float(g[run.diverge_after]))


def timeline(spec: JobSpec) -> tuple[list[Process], list[PodHold]]:
    """Every run's process and every pod's hold, in exact times."""
    rng = np.random.default_rng([spec.seed, 1])
    if not spec.runs:
        raise ValueError("a job needs at least one run")
    skew = spec.pod_skew_s or tuple(0.0 for _ in spec.nodes)
    ranks, first = [], 0
    for _, n in spec.nodes:
        ranks.append(tuple(range(first, first + n)))
        first += n
    gpus = [tuple(range(n)) for _, n in spec.nodes]
    processes: list[Process] = []
    holds: list[PodHold] = []
    pods = _pod_names(spec, 0, rng)
    alloc = [spec.alloc_start + s for s in skew]
    start = max(alloc) + spec.schedule_s
    resumed_from = 0
    for k, run in enumerate(spec.runs):
        if run.steps < 1 or len(run.compute) != spec.world_size or len(run.data_wait) != spec.world_size:
            raise ValueError(f"run {k}: needs >= 1 step and a compute and data-wait share per rank")
        if run.stall_after is not None and not 0 <= run.stall_after < run.steps - 1:
            raise ValueError(f"run {k}: a stall comes after a step that is not the last")
        if run.diverge_after is not None and not 0 <= run.diverge_after < run.steps:
            raise ValueError(f"run {k}: the model blows up at a step the run makes")
        if k > 0:
            prev = processes[-1]
            # the previous run resumes from here: its last checkpoint saved before its model blew
            # up, else where it resumed from
            saved = prev.global_step[(prev.ckpt > 0) & (prev.global_step < prev.blown_from)]
            resumed_from = int(saved[-1]) if saved.size else prev.resumed_from
            if run.new_pods:
                released = prev.end + run.release_s
                for i, (node, _) in enumerate(spec.nodes):
                    holds.append(PodHold(pods[i], node, gpus[i], ranks[i], alloc[i], released + skew[i]))
                pods = pods if run.same_names else _pod_names(spec, k, rng)
                alloc = [released + max(skew) + run.pending_s + s for s in skew]
                start = max(alloc) + run.pull_s
            else:
                if spec.runs[k - 1].hang_s:
                    raise ValueError("a run that hangs before a restart ends with its pods (new_pods)")
                start = prev.end + run.gap_s
        processes.append(_lay_out(spec, run, k, start, resumed_from, rng, pods))
    last = processes[-1]
    # A last run that hangs ends with its pods, deleted together, or dies (a collective's
    # timeout) and leaves its pods holding on for keep_s.
    for i, (node, _) in enumerate(spec.nodes):
        release = last.end + (0.0 if spec.runs[-1].hang_s and not spec.keep_s else spec.keep_s + skew[i])
        holds.append(PodHold(pods[i], node, gpus[i], ranks[i], alloc[i], release))
    for p in processes:
        for pod in p.pods:
            if not any(_within(p, h) for h in holds if h.pod == pod):
                raise ValueError(f"process {p.index} runs outside its pod {pod}'s hold")
    return processes, holds


# ---------------------------------------------------------------------------------------------
# the truth, from the exact intervals

def _within(p: Process, h: PodHold) -> bool:
    """Whether process `p` ran inside hold `h` (a re-created pod of the same name is another hold)."""
    return h.start <= p.start and p.end <= h.end


def _clip(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def compute_truth(spec: JobSpec, processes: list[Process], holds: list[PodHold]) -> Truth:
    W = spec.world_size
    per_rank = [dict.fromkeys(CATEGORIES, 0.0) for _ in range(W)]
    held = [0.0] * W
    # which steps count: all of the last run's; of an earlier run, those up to where the next resumed
    counted_to = [processes[k + 1].resumed_from for k in range(len(processes) - 1)] + [math.inf]
    for h in holds:
        for r in h.ranks:
            held[r] += h.end - h.start
            cat = per_rank[r]
            # no process alive: before the first run, between runs, after the last
            alive = sorted((p.start, p.end) for p in processes if h.pod in p.pods and _within(p, h))
            cursor = h.start
            free = []
            for a, b in alive:
                free.append((cursor, a))
                cursor = b
            free.append((cursor, h.end))
            for a, b in free:
                if b <= a:
                    continue
                s1 = processes[0].start
                cat["startup"] += _clip(a, b, -math.inf, s1)
                # restart: up to the next run's process start after the time; else no_process
                for k in range(len(processes) - 1):
                    cat["restart"] += _clip(a, b, processes[k].end, processes[k + 1].start)
                cat["no_process"] += _clip(a, b, processes[-1].end, math.inf)
    for p, upto in zip(processes, counted_to):
        counts = p.global_step <= upto
        # a step that trained a blown-up model is diverged, unless it was computed again anyway
        good, blown = counts & (p.global_step < p.blown_from), counts & (p.global_step >= p.blown_from)
        for r in range(W):
            cat = per_rank[r]
            fc, fd = p.compute[r], p.data_wait[r]
            d = p.step_d
            cat["startup"] += p.first_begin - p.start
            cat["productive"] += float(np.sum(d[good] * fc))
            cat["data_wait"] += float(np.sum(d[good] * fd))
            cat["sync_wait"] += float(np.sum(d[good] * (1.0 - fc - fd)))
            cat["diverged"] += float(np.sum(d[blown]))
            cat["lost_progress"] += float(np.sum(d[~counts]))
            cat["checkpoint"] += float(np.sum(p.ckpt))
            cat["evaluation"] += float(np.sum(p.evals))
            # After the last step: a hang of the last run is a stall; of an earlier run, the
            # ledger's definition makes it restart (its last step to the next run's start).
            tail = "stalled" if p is processes[-1] else "restart"
            cat["stalled"] += float(np.sum(p.stall))
            cat[tail] += p.end - float(p.eval_end[-1])
    ledger = {c: sum(r[c] for r in per_rank) / H for c in CATEGORIES}
    gpu_hours = sum(held) / H
    n = len(processes)
    new_pod_restarts = sum(1 for r in spec.runs[1:] if r.new_pods)
    stalls = sum(1 for r in spec.runs if r.stall_after is not None) + sum(1 for r in spec.runs if r.hang_s)
    blowups = sum(1 for r in spec.runs if r.diverge_after is not None)
    steps_edges = 2 * n + 2 * blowups
    edges = {"startup": 2 * n, "restart": 2 * (n - 1) + 2 * new_pod_restarts, "productive": steps_edges,
             "data_wait": steps_edges, "sync_wait": steps_edges, "checkpoint": 2 * n, "evaluation": 2 * n,
             "lost_progress": 2 * (n - 1), "diverged": 2 * blowups, "stalled": 2 * stalls, "no_process": 2}
    edges["sum"] = 2 * len(holds) + 2 * n
    runs = [{"process_start": p.start, "first_step_begin": p.first_begin, "first_step": float(p.step_end[0]),
             "last_step": p.last_step_at, "resumed_from": p.resumed_from, "last_step_number": p.last_step}
            for p in processes]
    return Truth(gpu_hours=gpu_hours, ledger=ledger, goodput=ledger["productive"] / gpu_hours, runs=runs,
                 edges=edges, per_rank=per_rank, held_s=held)


# ---------------------------------------------------------------------------------------------
# what the agent exports

TRAIN_COUNTERS = ("burnrate_train_steps_total", "burnrate_train_step_seconds_total",
                  "burnrate_train_data_wait_seconds_total", "burnrate_train_compute_seconds_total",
                  "burnrate_train_checkpoint_seconds_total", "burnrate_train_eval_seconds_total",
                  "burnrate_train_samples_total", "burnrate_train_tokens_total", "burnrate_train_flops_total")
# reported from the process's start
START_GAUGES = ("burnrate_train_start_timestamp_seconds", "burnrate_train_resumed_from_step",
                "burnrate_train_world_size")
# reported from the process's first step
STEP_GAUGES = ("burnrate_train_last_step_timestamp_seconds", "burnrate_train_global_step", "burnrate_train_loss",
               "burnrate_train_mfu_ratio")
FLOPS_PER_SAMPLE = 6 * 7e9 * TOKENS_PER_SAMPLE
LAST_HEARD = "burnrate_train_last_report_timestamp_seconds"
CLOSED = "burnrate_train_closed_timestamp_seconds"


def _last_report(p: Process, v: np.ndarray) -> np.ndarray:
    """The time of the process's last report at or before each of `v` (NaN before its first):
    every REPORT_PERIOD_S from start + phase while alive, and once more as it ends."""
    first = p.start + p.report_phase
    regular = first + REPORT_PERIOD_S * np.floor((v - first) / REPORT_PERIOD_S)
    x = np.where(v >= p.end, p.end, np.minimum(regular, p.end))
    return np.where(v >= first, x, np.nan)


def _cumulative(p: Process, rank: int, x: np.ndarray, waits_for_saves: bool = False,
                waits_for_evals: bool = False) -> dict[str, np.ndarray]:
    """This process's own counters (from 0 at its start) as reported at times `x` (no NaN).
    `waits_for_saves` (`waits_for_evals`): the rank saves (evaluates) nothing and waits for each
    save (evaluation) in the time to its next step."""
    k = np.searchsorted(p.step_end, x, side="right")

    def upto(values: np.ndarray, done: np.ndarray) -> np.ndarray:
        c = np.concatenate([[0.0], np.cumsum(values)])
        return c[done]

    d = p.step_d
    ck_done = np.searchsorted(p.ckpt_end, x, side="right")
    ev_done = np.searchsorted(p.eval_end, x, side="right")
    waits = (p.ckpt if waits_for_saves else 0.0) + (p.evals if waits_for_evals else 0.0)
    waited = np.concatenate([[0.0], np.broadcast_to(waits, p.ckpt.shape)[:-1]])
    # a save or evaluation counts once it is over; ckpt_end/eval_end are step-ordered and increasing
    return {
        "burnrate_train_steps_total": k.astype(float),
        "burnrate_train_step_seconds_total": upto(d + waited, k),
        "burnrate_train_data_wait_seconds_total": upto(d * p.data_wait[rank], k),
        "burnrate_train_compute_seconds_total": upto(d * p.compute[rank], k),
        "burnrate_train_checkpoint_seconds_total": upto(np.zeros_like(p.ckpt) if waits_for_saves else p.ckpt, ck_done),
        "burnrate_train_eval_seconds_total": upto(np.zeros_like(p.evals) if waits_for_evals else p.evals, ev_done),
        "burnrate_train_samples_total": k * float(SAMPLES_PER_RANK_STEP),
        "burnrate_train_tokens_total": k * float(SAMPLES_PER_RANK_STEP * TOKENS_PER_SAMPLE),
        "burnrate_train_flops_total": k * float(SAMPLES_PER_RANK_STEP) * FLOPS_PER_SAMPLE,
    }


def _gauges(p: Process, rank: int, x: np.ndarray, world: int) -> dict[str, np.ndarray]:
    k = np.searchsorted(p.step_end, x, side="right")
    stepped = k >= 1
    last = np.where(stepped, p.step_end[np.maximum(k - 1, 0)], np.nan)
    step = np.where(stepped, p.resumed_from + k, np.nan)
    return {
        "burnrate_train_start_timestamp_seconds": np.full(x.size, p.start),
        "burnrate_train_resumed_from_step": np.full(x.size, float(p.resumed_from)),
        "burnrate_train_world_size": np.full(x.size, float(world)),
        "burnrate_train_last_step_timestamp_seconds": last,
        "burnrate_train_global_step": step,
        # not finite once the model has blown up: +inf here, as an overflow gives it (NaN here
        # means not exported; the definition reads either as not finite)
        "burnrate_train_loss": np.where(stepped, np.where(step >= p.blown_from, np.inf,
                                                          1.6 + 2.4 * np.exp(-np.nan_to_num(step) / 4000.0)), np.nan),
        "burnrate_train_mfu_ratio": np.where(stepped, 0.55 * p.compute[rank], np.nan),
    }


def agent_view(processes: list[Process], rank: int, world: int, tau: np.ndarray,
               stale_step_gauges: bool = True, closes: bool = False,
               waits_for_saves: bool = False, waits_for_evals: bool = False) -> dict[str, np.ndarray]:
    """One rank key's exported values at scrape times `tau` (NaN where not exported), as the
    agent keeps them: counters summed over the processes reporting to it while it holds the
    rank, gauges last value wins, everything gone FORGET_AFTER_S after the last report.
    `closes`: the last of `processes` closed its monitor as it ended; `waits_for_saves`
    (`waits_for_evals`): the rank saves (evaluates) nothing, rank 0 does while it waits
    (JobSpec.saves_on_rank0, evals_on_rank0)."""
    v = tau - REPORT_LAG_S
    x = [_last_report(p, v) for p in processes]
    # epochs: the agent forgets the rank when a gap between reports reaches FORGET_AFTER_S
    epoch = [0]
    for a, b in zip(processes, processes[1:]):
        epoch.append(epoch[-1] + int(b.start + b.report_phase - a.end >= FORGET_AFTER_S))
    latest = np.full(tau.size, -1)
    last_seen = np.full(tau.size, np.nan)
    for i, xi in enumerate(x):
        seen = ~np.isnan(xi)
        latest[seen] = i
        last_seen[seen] = xi[seen]
    held = (latest >= 0) & (tau - np.nan_to_num(last_seen, nan=-np.inf) < FORGET_AFTER_S)
    cur_epoch = np.where(latest >= 0, np.array(epoch)[np.maximum(latest, 0)], -1)
    out = {name: np.zeros(tau.size) for name in TRAIN_COUNTERS}
    gauges = {name: np.full(tau.size, np.nan) for name in START_GAUGES + STEP_GAUGES}
    for i, (p, xi) in enumerate(zip(processes, x)):
        mine = ~np.isnan(xi) & (cur_epoch == epoch[i])
        if not mine.any():
            continue
        xs = np.where(mine, xi, p.start)
        cum = _cumulative(p, rank, xs, waits_for_saves, waits_for_evals)
        for name in TRAIN_COUNTERS:
            out[name] += np.where(mine, cum[name], 0.0)
        g = _gauges(p, rank, xs, world)
        if not stale_step_gauges:
            # the process's first report clears what an earlier one left of the step gauges
            for name in STEP_GAUGES:
                gauges[name][mine] = np.nan
        for name in START_GAUGES + STEP_GAUGES:
            # a later process's report replaces an earlier one's; one not reported yet keeps it
            take = mine & ~np.isnan(g[name])
            gauges[name][take] = g[name][take]
    for name in TRAIN_COUNTERS:
        out[name] = np.where(held, out[name], np.nan)
    for name in gauges:
        out[name] = np.where(held, gauges[name], np.nan)
    out[LAST_HEARD] = np.where(held, last_seen, np.nan)     # the agent's time of the last report
    if closes:      # that last report said the monitor closed
        out[CLOSED] = np.where(held & (latest == len(processes) - 1) & (last_seen >= processes[-1].end),
                               processes[-1].end, np.nan)
    return out


def _rank_series(spec: JobSpec, processes: list[Process], holds: list[PodHold], node: Node, tau: np.ndarray,
                 sink: _Scraped) -> None:
    world = spec.world_size
    pods = sorted({h.pod for h in holds if h.node == node.name})
    for pod in pods:
        ranks = next(h.ranks for h in holds if h.pod == pod)
        mine = [p for p in processes if pod in p.pods]
        for rank in ranks:
            closes = spec.report_closed and bool(mine) and mine[-1] is processes[-1] and not spec.runs[-1].hang_s
            values = agent_view(mine, rank, world, tau, spec.stale_step_gauges, closes,
                                spec.saves_on_rank0 and rank != 0, spec.evals_on_rank0 and rank != 0)
            labels = {"namespace": spec.namespace, "pod": pod, "training_job": spec.name, "rank": str(rank),
                      "Hostname": node.name, "instance": f"{node.name}:9400", "job": node.scrape_job}
            for name, v in values.items():
                if name == "burnrate_train_resumed_from_step" and not spec.report_resumed_from or \
                        name == LAST_HEARD and not spec.report_last_heard:
                    continue
                ok = ~np.isnan(v)
                sink.add(name, labels, tau[ok], v[ok])


def generate(spec: JobSpec) -> LedgerCase:
    processes, holds = timeline(spec)
    truth = compute_truth(spec, processes, holds)
    a0 = min(h.start for h in holds)
    a1 = max(h.end for h in holds)
    start, end = a0 - spec.before_s, a1 + spec.after_s
    rng = np.random.default_rng([spec.seed, 2])
    nodes = []
    for i, (name, n) in enumerate(spec.nodes):
        extra = 1 if spec.bystander and i == 0 else 0
        nodes.append(Node(name, n + extra, "agent", spec.interval_s, jitter_s=spec.jitter_s,
                          phase_s=spec.phase_s if i == 0 else (spec.phase_s + spec.interval_s / 3) % spec.interval_s,
                          instance_type="p4d.24xlarge", gpu_model="NVIDIA A100-SXM4-40GB"))
    sink = _Sink()
    # each pod hold as a contract_fleet workload of its own, so its samplers give the device side
    held_by: dict[tuple[str, int], list[_Hold]] = {}
    owners: dict[Workload, list[str]] = {}
    for h in holds:
        w = Workload(spec.namespace, spec.name, "training", "PyTorchJob", ((h.node, h.gpus),), h.start, h.end,
                     util_pct=85.0)
        owners[w] = [h.pod]
        for g, r in zip(h.gpus, h.ranks):
            held_by.setdefault((h.node, g), []).append(_Hold(w, h.pod, "pytorch", r))
    if spec.bystander:
        serve = Workload("inference", "chat-api", "serving", "Deployment", ((nodes[0].name, (nodes[0].gpus - 1,)),),
                         start, end)
        pod = f"chat-api-{_suffix(rng, 10)}-{_suffix(rng, 5)}"
        owners[serve] = [pod]
        held_by.setdefault((nodes[0].name, nodes[0].gpus - 1), []).append(_Hold(serve, pod, "chat-api", 0))
    for node in nodes:
        tau = _scrape_times(node, start, end, rng)
        scraped = _Scraped(sink, node)
        scraped.add("up", {"instance": f"{node.name}:9400", "job": node.scrape_job}, tau, 1.0)
        for g in range(node.gpus):
            _sample_gpu(node, g, held_by.get((node.name, g), []), tau, start, end, rng, scraped)
        scraped.add("burnrate_node_info", {
            "Hostname": node.name, "instance_type": node.instance_type, "capacity_type": node.capacity_type,
            "zone": node.zone, "gpu_model": node.gpu_model, "gpu_count": str(node.gpus),
            "instance": f"{node.name}:9400", "job": node.scrape_job}, tau, 1.0)
        if spec.telemetry:
            _rank_series(spec, processes, holds, node, tau, scraped)
    _sample_pod_owners(tuple(owners), owners, start, end, spec.seed, sink)
    return LedgerCase(spec, start, end, tuple(nodes), processes, holds, sink.series(), truth)


# ---------------------------------------------------------------------------------------------
# tolerances

def edge_s(case: LedgerCase) -> float:
    """What one edge can be off by, per GPU: a scrape interval (and its jitter), one step (a step is
    seen when it completes) and the report lag."""
    step = max(r.step_s for r in case.spec.runs) * (1.0 + case.spec.step_jitter)
    return case.spec.interval_s + 2 * case.spec.jitter_s + step + REPORT_LAG_S + REPORT_PERIOD_S


def tolerance(case: LedgerCase, category: str, unit_s: float | None = None) -> float:
    """GPU-hours: 1 % of the job's, or W GPUs x one edge's allowance (`unit_s`, else edge_s)
    per edge bounding the category ("sum": the job's GPU-hours)."""
    unit = edge_s(case) if unit_s is None else unit_s
    return max(0.01 * case.truth.gpu_hours, case.spec.world_size * unit * case.truth.edges[category] / H)


# ---------------------------------------------------------------------------------------------
# hypothesis strategy

def _shares(draw: st.DrawFn, world: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    base_c = draw(st.floats(0.45, 0.9))
    base_d = draw(st.floats(0.0, min(0.3, 0.97 - base_c)))
    compute, data = [], []
    for _ in range(world):
        c = min(0.95, base_c * draw(st.floats(0.85, 1.0)))
        d = min(0.97 - c, base_d * draw(st.floats(0.5, 1.5)))
        compute.append(round(c, 4))
        data.append(round(max(d, 0.0), 4))
    return tuple(compute), tuple(data)


@st.composite
def ledger_jobs(draw: st.DrawFn, telemetry: bool = True, report_resumed_from: bool = True,
                max_runs: int = 3) -> JobSpec:
    """A training job: 1..max_runs runs, 1..8 GPUs on one or two nodes, scraped every 5..60 s."""
    interval = float(draw(st.sampled_from((5, 10, 15, 30, 60))))
    two = draw(st.booleans())
    per_node = draw(st.sampled_from((1, 2, 4)))
    nodes = (("gpu-node-a", per_node),) + ((("gpu-node-b", per_node),) if two else ())
    world = per_node * len(nodes)
    n_runs = draw(st.integers(1, max_runs))
    ckpt_every_s = draw(st.floats(300.0, 1500.0))
    eval_every_s = draw(st.one_of(st.none(), st.floats(600.0, 2400.0)))
    step_s0 = draw(st.floats(0.4, 3.0))
    runs = []
    for k in range(n_runs):
        step_s = step_s0 * draw(st.floats(0.9, 1.1))
        steps = max(20, int(draw(st.floats(8 * 60.0, 70 * 60.0)) / step_s))
        compute, data = _shares(draw, world)
        stall_after = None
        stall_s = 0.0
        if draw(st.integers(0, 3)) == 0:
            stall_after = int(draw(st.floats(0.1, 0.9)) * (steps - 1))
            stall_s = draw(st.floats(600.0, 1800.0))
        new_pods = k > 0 and draw(st.booleans())
        last = k == n_runs - 1
        hang = 0.0
        # a run hangs at its end: the last run until its pods go, an earlier one until evicted
        if last and draw(st.integers(0, 2)) == 0:
            hang = draw(st.floats(600.0, 1800.0))
        # a last run may end with a save and an evaluation, as frameworks end training
        final_save = last and draw(st.booleans())
        # the model may blow up: its loss is not finite from that step on
        diverge_after = int(draw(st.floats(0.1, 0.95)) * (steps - 1)) if draw(st.integers(0, 4)) == 0 else None
        runs.append(RunSpec(steps=steps, step_s=step_s, startup_s=draw(st.floats(30.0, 600.0)), compute=compute,
                            data_wait=data, stall_after=stall_after, stall_s=stall_s, hang_s=hang,
                            final_save=final_save, diverge_after=diverge_after,
                            new_pods=new_pods, same_names=new_pods and draw(st.booleans()),
                            gap_s=draw(st.floats(10.0, 900.0)),
                            release_s=draw(st.floats(0.0, 60.0)), pending_s=draw(st.floats(0.0, 600.0)),
                            pull_s=draw(st.floats(5.0, 300.0))))
    # an earlier run that is followed by new pods may hang until the eviction ends it
    for k in range(n_runs - 1):
        if runs[k + 1].new_pods and draw(st.integers(0, 3)) == 0:
            runs[k] = replace(runs[k], hang_s=draw(st.floats(600.0, 1500.0)))
            # the pods' deletion kills the hung process: their GPUs go within a few seconds, so
            # the end of their allocation marks the process's end
            runs[k + 1] = replace(runs[k + 1], release_s=min(runs[k + 1].release_s, 3.0))
    keep = draw(st.one_of(st.just(0.0), st.floats(FORGET_AFTER_S + 2 * interval + 60.0, 1800.0)))
    jitter = draw(st.floats(0.0, 0.2 * interval))
    return JobSpec(
        nodes=nodes, interval_s=interval, runs=tuple(runs),
        checkpoint_every=max(2, int(ckpt_every_s / step_s0)), checkpoint_s=draw(st.floats(5.0, 120.0)),
        eval_every=max(2, int(eval_every_s / step_s0)) if eval_every_s else None,
        eval_s=draw(st.floats(20.0, 300.0)),
        alloc_start=BASE_TIME + 3600.0 * draw(st.integers(0, 24 * 30)),
        pod_skew_s=tuple(draw(st.floats(0.0, 30.0)) for _ in nodes), schedule_s=draw(st.floats(5.0, 600.0)),
        keep_s=keep, before_s=draw(st.floats(0.0, 3600.0)), after_s=draw(st.floats(0.0, 3600.0)),
        jitter_s=jitter, phase_s=draw(st.floats(0.0, interval, exclude_max=True)),
        telemetry=telemetry, report_resumed_from=report_resumed_from, report_last_heard=draw(st.booleans()),
        report_closed=draw(st.booleans()),
        bystander=draw(st.booleans()),
        stale_step_gauges=draw(st.booleans()),
        seed=draw(st.integers(0, 2 ** 32 - 1)),
        # rank 0 alone saving and evaluating, as nanoGPT's master-process block does
        saves_on_rank0=draw(st.booleans()), evals_on_rank0=draw(st.booleans()))


@st.composite
def ledger_cases(draw: st.DrawFn, **kwargs) -> LedgerCase:
    return generate(draw(ledger_jobs(**kwargs)))
