"""The monitor in Hugging Face's own `Trainer`, with no change to its loop: a tiny GPT-2 from
a config (no download) trains on CPU with 2-way gradient accumulation, an evaluation and a
checkpoint save in the middle; the agent's inbox receives exact counts on a real socket,
and each loss and gradient norm the Trainer logs arrives with the step it was logged at."""
from __future__ import annotations

import json
import time

import pytest

transformers = pytest.importorskip("transformers")

from burnrate.agent.telemetry.inbox import TelemetryInbox  # noqa: E402
from burnrate.trainer.huggingface import BurnrateCallback  # noqa: E402
from tests.framework_runs import ahead_of_reports, assert_exact_counts, assert_ledger_facts, heard_every_20ms  # noqa: E402
from tests.huggingface_job import BATCH, SAVE_S, SEQ, SlowSaveTrainer, SlowTokens, Tokens, gpt2  # noqa: E402

pytestmark = pytest.mark.slow

ACCUM, STEPS, LOG_EVERY = 2, 6, 2


def test_a_hugging_face_trainer_reports_exact_counts(tmp_path):
    model = gpt2()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM, logging_steps=LOG_EVERY, eval_strategy="steps", eval_steps=3,
        save_strategy="steps", save_steps=3, report_to=[], use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True)
    records = tmp_path / "records.jsonl"
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        callback = BurnrateCallback(seq_len=SEQ, socket_path=str(inbox.path), jsonl_path=str(records),
                                    job="hf", every_steps=1)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(),
                                       callbacks=[callback])
        trainer.train()
        assert_exact_counts(inbox, "hf", STEPS, STEPS * ACCUM * BATCH, SEQ, model)
        (rank,) = inbox.ranks()
    assert rank.values.get("last_checkpoint_time", 0) > 0     # the save at step 3, kept out of the step times
    assert_ledger_facts(rank, STEPS)

    logged = {e["step"]: (e["loss"], e["grad_norm"]) for e in trainer.state.log_history if "loss" in e}
    assert sorted(logged) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    sent = {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, records.read_text().splitlines())}
    assert sorted(sent) == list(range(1, STEPS + 1))
    # A logging step's record has its own values; the steps after it, the newest logged.
    for step, values in sent.items():
        newest = max((s for s in logged if s <= step), default=None)
        assert values == (pytest.approx(logged[newest]) if newest else (None, None))
    # The last step's values, logged after its on_step_end, reach the agent.
    assert (rank.values["loss"], rank.values["grad_norm"]) == pytest.approx(logged[STEPS])


def test_a_hugging_face_evaluation_is_heard_while_it_lasts_and_counted_once(tmp_path):
    """The Trainer tells callbacks of an evaluation only when it ends; from its first batch on,
    the monitor's keep-alives carry its seconds, so the agent's counter grows while it lasts (a
    long one is neither a stall nor paged as one), and in the end it holds the evaluation once."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=2, eval_strategy="steps", eval_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    records = tmp_path / "records.jsonl"
    heard: list[float] = []

    class Probe(transformers.TrainerCallback):
        """Called after burnrate's callback: what the agent has of the evaluation so far."""

        def on_prediction_step(self, args, state, control, **kwargs):
            (rank,) = inbox.ranks()
            heard.append(rank.values.get("eval_s", 0.0))

    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        callback = BurnrateCallback(seq_len=SEQ, socket_path=str(inbox.path), jsonl_path=str(records),
                                    job="hf-eval", every_steps=1, keepalive_s=0.1)
        trainer = transformers.Trainer(model=gpt2(), args=args,
                                       train_dataset=Tokens(), eval_dataset=SlowTokens(8),
                                       callbacks=[callback, Probe()])
        trainer.train()
        time.sleep(0.2)
        (rank,) = inbox.ranks()
        total = rank.values["eval_s"]
    # Two evaluations of four batches each; by each one's last batch the agent had most of it.
    assert len(heard) == 8
    assert heard[3] > 0.5 and heard[7] - heard[4] > 0.4, heard
    written = sum(r["eval_s"] for r in map(json.loads, records.read_text().splitlines()))
    assert 2.0 <= written and total == pytest.approx(written, abs=1e-6)


def test_a_hugging_face_save_is_heard_while_it_lasts_and_counted_once(tmp_path):
    """The Trainer tells callbacks of a save only once it is made, but its control decides on it
    before: after a step (1, 3), after the step's log (2) or after an evaluation (4), the save is
    under way from there, the monitor's keep-alives carry its seconds, and the agent's counter
    grows during it, before any report holds it; in the end it holds each save once."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=BATCH, logging_steps=2,
        per_device_eval_batch_size=2, eval_strategy="steps", eval_steps=4, save_strategy="steps", save_steps=1,
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    records = tmp_path / "records.jsonl"
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        callback = BurnrateCallback(seq_len=SEQ, socket_path=str(inbox.path), jsonl_path=str(records),
                                    job="hf-save", every_steps=1, keepalive_s=0.1)
        trainer = SlowSaveTrainer(model=gpt2(), args=args,
                                  train_dataset=Tokens(), eval_dataset=Tokens(4), callbacks=[callback])
        with heard_every_20ms(inbox) as heard:
            trainer.train()
            assert inbox.wait_idle(5)
        (rank,) = inbox.ranks()
    sent = [json.loads(line) for line in records.read_text().splitlines()]
    # During the saves after steps 1 to 4, the agent had their seconds before a report did.
    ahead = ahead_of_reports(sent, heard, "checkpoint_s", range(1, 5))
    assert all(a > SAVE_S / 2 for a in ahead.values()), ahead
    saved = [r["checkpoint_s"] for r in sent if r["checkpoint_s"]]
    assert len(saved) == 5 and min(saved) >= SAVE_S, saved
    assert rank.values["checkpoint_s"] == pytest.approx(sum(saved), abs=1e-6)
