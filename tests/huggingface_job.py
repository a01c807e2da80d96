"""A Hugging Face `Trainer` job for the tests: a tiny GPT-2 from a config (no download) on CPU,
its evaluation set and its checkpoint storage slowed, so that each evaluation and each save
lasts long enough to be seen. tests/test_huggingface.py trains with its parts in process; as a script
(`huggingface_job.py OUT`), tests/test_huggingface_ledger.py runs it as a training process of
its own, reporting to a real agent, and OUT receives the Trainer's own timings."""
from __future__ import annotations

import json
import sys
import time

import torch
import transformers

from burnrate.trainer.huggingface import BurnrateCallback

SEQ, BATCH = 16, 2
EVAL_SAMPLE_S = 0.125        # an evaluation sample's fetch
SAVE_S = 0.4                 # what a checkpoint's storage adds to each save


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class SlowTokens(Tokens):
    """An evaluation set whose samples take EVAL_SAMPLE_S each."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(EVAL_SAMPLE_S)
        return super().__getitem__(i)


class SlowSaveTrainer(transformers.Trainer):
    """The Trainer as shipped, its checkpoints written to storage that takes `save_s` more a
    save; `saves` holds each save's own seconds."""

    def __init__(self, *args, save_s: float = SAVE_S, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.save_s = save_s
        self.saves: list[float] = []

    def _save_checkpoint(self, model, trial):
        began = time.perf_counter()
        time.sleep(self.save_s)
        super()._save_checkpoint(model, trial)
        self.saves.append(time.perf_counter() - began)


def gpt2(n_embd: int = 32, n_layer: int = 2) -> transformers.GPT2LMHeadModel:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=n_embd,
                                                                n_layer=n_layer, n_head=2))


# The job main() runs: seconds of steps, two evaluations and two saves, each long against the
# analysis' one-second grid.
STEPS, EVERY, EVAL_SAMPLES, LEDGER_SAVE_S = 120, 60, 16, 1.5


def main(out: str) -> None:
    """A job that evaluates and saves every EVERY steps, the last step's included, reporting to
    the agent BURNRATE_TELEMETRY_SOCKET names; OUT receives the Trainer's own timings."""
    args = transformers.TrainingArguments(
        output_dir=f"{out}.checkpoints", max_steps=STEPS, per_device_train_batch_size=8,
        per_device_eval_batch_size=2, logging_steps=10, eval_strategy="steps", eval_steps=EVERY,
        save_strategy="steps", save_steps=EVERY, report_to=[], use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = SlowSaveTrainer(model=gpt2(n_embd=128, n_layer=4), args=args, train_dataset=Tokens(1024),
                              eval_dataset=SlowTokens(EVAL_SAMPLES), save_s=LEDGER_SAVE_S,
                              callbacks=[BurnrateCallback(seq_len=SEQ)])
    began = time.time()
    trainer.train()
    with open(out, "w") as f:
        json.dump({"began": began, "ended": time.time(), "saves": trainer.saves,
                   "evaluations": [e["eval_runtime"] for e in trainer.state.log_history if "eval_runtime" in e],
                   "train_runtime": trainer.state.log_history[-1]["train_runtime"]}, f)


if __name__ == "__main__":
    main(sys.argv[1])
