"""The loops the README and docs/trainer.md show run as written against a real agent inbox,
and the number of lines they say the monitor takes is the number of monitor lines shown."""
from __future__ import annotations

import os
import re

import pytest
import torch

from burnrate.agent.telemetry.inbox import TelemetryInbox
from burnrate.trainer.model import GPT, GPTConfig
from tests.conftest import ROOT

SEQ, BATCH, VOCAB = 16, 2, 64
NUMBERS = {"five": 5, "six": 6, "seven": 7}
ORDINALS = {"seventh": 7, "eighth": 8}


def page(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


def loop(name: str) -> str:
    (block,) = [b for b in re.findall(r"^```python\n(.*?)^```", page(name), re.M | re.S) if "mon.step(" in b]
    return block


def monitor_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if re.search(r"\bMonitor\b|\bmon\.", line.split("#")[0])]


def test_the_line_counts_said_are_the_lines_shown():
    readme = page("README.md")
    plain = re.search(r"^(\w+) lines in a plain loop", readme, re.M)
    said = re.search(r"apart from the step, needs (\w+) lines \(an? (\w+) keeps evaluation", readme)
    assert plain and said, "the README says how many lines each loop it shows takes"
    assert len(monitor_lines(loop("README.md"))) == NUMBERS[plain[1].lower()]
    shown = monitor_lines(loop("docs/trainer.md"))
    assert len([line for line in shown if "mon.eval()" not in line]) == NUMBERS[said[1]]
    assert len(shown) == ORDINALS[said[2]]
    assert f"needs {said[1]}:" in page("docs/trainer.md")


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    return x, x


@pytest.mark.parametrize("name, steps, samples", [("README.md", 3, 3 * BATCH), ("docs/trainer.md", 3, 3 * 2 * BATCH)])
def test_the_loop_shown_runs_and_reports_every_step(name, steps, samples, tmp_path, monkeypatch):
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=SEQ, n_layer=1, n_head=2, n_embd=16))
    evaluated = []
    names = dict(model=model, T=SEQ, opt=torch.optim.SGD(model.parameters(), lr=0.01),
                 loader=[batch() for _ in range(steps)], get_batch=lambda split: batch(),
                 max_iters=steps, accum=2, eval_interval=2, evaluate=lambda: evaluated.append(1))
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        monkeypatch.setenv("BURNRATE_TELEMETRY_SOCKET", str(inbox.path))
        monkeypatch.setenv("BURNRATE_TRAINING_JOB", "shown")
        exec(loop(name), names)
        assert inbox.wait_idle(5)
        (rank,) = inbox.ranks()
    assert (rank.values["steps"], rank.values["samples"], rank.values["tokens"]) == (steps, samples, samples * SEQ)
    assert len(evaluated) == (2 if name == "docs/trainer.md" else 0)
