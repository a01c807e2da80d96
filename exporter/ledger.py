"""The ledger's categories (docs/ledger.md): where each GPU-hour a training job held went.
Plain data, so the analyzer that computes the ledger and the recording rules that compute
its counter-based part read the same definitions.

Every held GPU-second of a training job falls in exactly one category, so they add up to
the job's GPU-hours. `productive` over the job's GPU-hours is its goodput.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    name: str
    meaning: str
    # Rank counters (catalog fields) whose increase is this category's rank-seconds, each with
    # its sign; empty where the category comes from the runs' boundaries, not a counter.
    counters: tuple[tuple[str, int], ...] = ()
    # Time apart from the steps that blocks the whole job for as long as its slowest rank reports
    # it: ranks that take no part (rank 0 saving alone) wait for it, and report that wait as step
    # time, which is this category's, not the steps' (docs/ledger.md, item 6).
    blocks: bool = False


CATEGORIES: tuple[Category, ...] = (
    Category("productive", "compute of the steps that count (not computed again after a resume)",
             (("compute_s", 1),)),
    Category("data_wait", "the steps that count, waiting for their next batch", (("data_wait_s", 1),)),
    Category("sync_wait", "the steps that count, neither computing nor waiting for data: collectives, "
             "waiting for a slower rank, the optimizer's own bookkeeping",
             (("step_s", 1), ("compute_s", -1), ("data_wait_s", -1))),
    Category("checkpoint", "the loop saving checkpoints (the blocking part)", (("checkpoint_s", 1),), blocks=True),
    Category("evaluation", "the loop evaluating", (("eval_s", 1),), blocks=True),
    Category("startup", "held before a run's first step: from the allocation (first run) or the process's "
             "start (later runs): scheduling, image pull, model load, restore"),
    Category("restart", "held between a run's last step and the next run's process start"),
    Category("lost_progress", "the whole step time of steps a run completed after the step the next run "
             "resumed from: they were computed again"),
    Category("diverged", "the whole step time of the other steps whose reports gave a loss or gradient norm that "
             "was not finite: the model had blown up (or the optimizer skipped them), so they trained nothing"),
    Category("stalled", "held while the process is alive and no step completes, beyond the usual gap "
             "between steps"),
    Category("no_process", "held with no training process reporting and no later run"),
)

NAMES = tuple(c.name for c in CATEGORIES)
PRODUCTIVE = "productive"
# Every category but productive: where a job's money went other than into steps that count.
BADPUT = tuple(n for n in NAMES if n != PRODUCTIVE)
# The categories measured from rank counters, which recording rules can sum in the store.
COUNTED = tuple(c for c in CATEGORIES if c.counters)
# The counted categories that block the whole job (Category.blocks).
BLOCKING = tuple(c for c in COUNTED if c.blocks)
