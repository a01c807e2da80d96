"""What every framework-callback test checks at the agent's inbox after a real run."""
from __future__ import annotations

import pytest

from burnrate.trainer.flops import model_flops_per_token


def assert_exact_counts(inbox, job: str, steps: int, samples: int, seq: int, model) -> None:
    assert inbox.wait_idle(5)
    assert dict(inbox.rejected) == {}
    (rank,) = inbox.ranks()
    v = rank.values
    assert (v["steps"], v["samples"], v["tokens"]) == (steps, samples, samples * seq)
    assert v["flops"] == pytest.approx(samples * seq * model_flops_per_token(model, seq))
    assert 0 < v["compute_s"] and v["compute_s"] + v["data_wait_s"] <= v["step_s"]
    assert v["loss"] > 0 and rank.key.training_job == job


def assert_ledger_facts(rank, steps: int) -> None:
    """What the ledger reads of a fresh run: where it began, at step 0, and how far it got."""
    import time

    v = rank.values
    assert v["resumed_from"] == 0 and v["global_step"] == steps
    # This test process started the run: its start is before the steps and not long before.
    assert time.time() - 3600 < v["start_time"] <= v["last_step_time"]
