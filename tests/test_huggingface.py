"""The monitor in Hugging Face's own `Trainer`, with no change to its loop: a tiny GPT-2 from
a config (no download) trains on CPU with 2-way gradient accumulation, an evaluation and a
checkpoint save in the middle; the agent's inbox receives exact counts on a real socket."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from burnrate.agent.telemetry.inbox import TelemetryInbox  # noqa: E402
from burnrate.trainer.huggingface import BurnrateCallback  # noqa: E402
from tests.framework_runs import assert_exact_counts, assert_ledger_facts  # noqa: E402

pytestmark = pytest.mark.slow

SEQ, BATCH, ACCUM, STEPS = 16, 2, 2, 6


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def test_a_hugging_face_trainer_reports_exact_counts(tmp_path):
    config = transformers.GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM, logging_steps=1, eval_strategy="steps", eval_steps=3,
        save_strategy="steps", save_steps=3, report_to=[], use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True)
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        callback = BurnrateCallback(seq_len=SEQ, socket_path=str(inbox.path), job="hf", every_steps=1)
        transformers.Trainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(),
                             callbacks=[callback]).train()
        assert_exact_counts(inbox, "hf", STEPS, STEPS * ACCUM * BATCH, SEQ, model)
        (rank,) = inbox.ranks()
    assert rank.values.get("last_checkpoint_time", 0) > 0     # the save at step 3, kept out of the step times
    assert_ledger_facts(rank, STEPS)
