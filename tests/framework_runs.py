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
