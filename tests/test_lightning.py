"""The monitor in PyTorch Lightning's own loop, with no change to the module: a tiny GPT
trains on CPU with gradient accumulation and a validation pass in the middle; the agent's
inbox receives exact counts on a real socket, and every step's record its loss as the
module computed it, whatever the accumulation."""
from __future__ import annotations

import json
import time

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

from burnrate.agent.telemetry.inbox import TelemetryInbox  # noqa: E402
from burnrate.trainer.lightning import BurnrateCallback  # noqa: E402
from pytorch_lightning.plugins.io import TorchCheckpointIO  # noqa: E402
from burnrate.trainer.model import GPT, GPTConfig  # noqa: E402
from tests.framework_runs import ahead_of_reports, assert_exact_counts, assert_ledger_facts, heard_every_20ms  # noqa: E402
from tests.test_flops import counted_flops_per_token  # noqa: E402

pytestmark = pytest.mark.slow

SEQ, BATCH, STEPS, VOCAB = 16, 2, 5, 128


class Module(pl.LightningModule):
    """A module as users write them: the model inside, no `config` of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = GPT(GPTConfig(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=2, n_embd=32))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.gpt(x, y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.gpt(x, y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def loader() -> torch.utils.data.DataLoader:
    x = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x), batch_size=BATCH)


@pytest.mark.parametrize("accum", [1, 2, 4])
def test_a_lightning_trainer_reports_exact_counts_and_the_modules_loss(tmp_path, accum):
    torch.manual_seed(0)
    module = Module()
    records = tmp_path / "records.jsonl"
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        callback = BurnrateCallback(seq_len=SEQ, socket_path=str(inbox.path), jsonl_path=str(records),
                                    job="lightning", every_steps=1)
        trainer = pl.Trainer(max_steps=STEPS, accumulate_grad_batches=accum, accelerator="cpu", devices=1,
                             val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=0,
                             callbacks=[callback], logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
        trainer.fit(module, loader(), loader())
        assert_exact_counts(inbox, "lightning", STEPS, STEPS * accum * BATCH, SEQ, module.gpt)
        (rank,) = inbox.ranks()
        assert_ledger_facts(rank, STEPS)
    # The attention term counts although the LightningModule has no config: the FLOPs are
    # the matmuls torch counts in the model's forward and backward.
    tokens = STEPS * accum * BATCH * SEQ
    assert rank.values["flops"] == pytest.approx(tokens * counted_flops_per_token(module.gpt, VOCAB, SEQ), rel=1e-9)
    # Each step's loss is the mean of its micro-batches' own, not divided by the accumulation.
    per_step = {r["step"]: r["loss"] for r in map(json.loads, records.read_text().splitlines())}
    assert sorted(per_step) == list(range(1, STEPS + 1))
    for step, loss in per_step.items():
        own = module.losses[(step - 1) * accum:step * accum]
        assert loss == pytest.approx(sum(own) / accum, rel=1e-5)
    assert 4 < per_step[1] < 6      # about ln(128) at initialization, at any accumulation


SAVE_S = 0.4


class SlowStorage(TorchCheckpointIO):
    """Lightning's own checkpoint writer, on storage that takes SAVE_S more a write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        time.sleep(SAVE_S)
        super().save_checkpoint(checkpoint, path, storage_options)
        self.writes += 1


def test_a_lightning_save_is_kept_out_of_the_data_wait_and_heard_while_it_lasts(tmp_path):
    """ModelCheckpoint saves every second step, after the step's own hooks and before the next
    fetch: its time is neither the next batch's data wait nor unheard. From `on_save_checkpoint`
    on, the save is under way, the monitor's keep-alives carry its seconds, and the agent's
    counter grows during it, before any report holds it; in the end it holds each save once."""
    torch.manual_seed(0)
    records = tmp_path / "records.jsonl"
    storage = SlowStorage()
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        callback = BurnrateCallback(seq_len=SEQ, socket_path=str(inbox.path), jsonl_path=str(records),
                                    job="lightning-save", every_steps=1, keepalive_s=0.1)
        saving = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=2, save_top_k=-1)
        trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, num_sanity_val_steps=0,
                             limit_val_batches=0, callbacks=[callback, saving], plugins=[storage], logger=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
        with heard_every_20ms(inbox) as heard:
            trainer.fit(Module(), loader())
            assert inbox.wait_idle(5)
        (rank,) = inbox.ranks()
    sent = [json.loads(line) for line in records.read_text().splitlines()]
    assert storage.writes == 2      # after steps 2 and 4
    saved = sum(r["checkpoint_s"] for r in sent)
    assert saved >= 2 * SAVE_S and rank.values["checkpoint_s"] == pytest.approx(saved, abs=1e-6)
    # Steps of a tiny model on CPU wait for their batches a few milliseconds at most.
    assert sum(r["data_wait_s"] for r in sent) < SAVE_S / 2, sent
    ahead = ahead_of_reports(sent, heard, "checkpoint_s", range(2, 5, 2))
    assert all(a > SAVE_S / 2 for a in ahead.values()), ahead
