"""What every framework-callback test checks at the agent's inbox after a real run."""
from __future__ import annotations

import contextlib
import threading

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


@contextlib.contextmanager
def heard_every_20ms(inbox):
    """What the agent had of a rank every 20 ms while the block runs: a list of its values
    (steps and every counter), filled as it goes."""
    heard: list[dict[str, float]] = []
    done = threading.Event()

    def listen() -> None:
        while not done.wait(0.02):
            heard.extend(dict(r.values) for r in inbox.ranks())

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        yield heard
    finally:
        done.set()
        listener.join()


def ahead_of_reports(records: list[dict], heard: list[dict[str, float]], counter: str,
                     steps: range) -> dict[int, float]:
    """For each of `steps`, the most of `counter` the agent had while that step was its last,
    beyond what the reports that made the steps so far held (the monitor's JSON lines
    `records`; a report that makes no step, the last at the end of training, is left out)."""
    reported = {0: 0.0}
    for r in records:
        if r["steps"]:
            reported[r["step"]] = reported[r["step"] - 1] + r[counter]
    return {step: max(h.get(counter, 0.0) - reported[step] for h in heard if h.get("steps", 0) == step)
            for step in steps}
