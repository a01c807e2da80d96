"""The monitor in PyTorch Lightning's own loop, with no change to the module: a tiny GPT
trains on CPU with 2-way gradient accumulation and a validation pass in the middle; the
agent's inbox receives exact counts on a real socket."""
from __future__ import annotations

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

from burnrate.agent.telemetry.inbox import TelemetryInbox  # noqa: E402
from burnrate.trainer.lightning import BurnrateCallback  # noqa: E402
from burnrate.trainer.model import GPT, GPTConfig  # noqa: E402
from tests.framework_runs import assert_exact_counts, assert_ledger_facts  # noqa: E402

pytestmark = pytest.mark.slow

SEQ, BATCH, ACCUM, STEPS = 16, 2, 2, 5


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.gpt = GPT(GPTConfig(vocab_size=128, block_size=SEQ, n_layer=2, n_head=2, n_embd=32))
        self.config = self.gpt.config

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.gpt(x, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.gpt(x, y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def loader() -> torch.utils.data.DataLoader:
    x = torch.randint(0, 128, (64, SEQ), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x), batch_size=BATCH)


def test_a_lightning_trainer_reports_exact_counts(tmp_path):
    module = Module()
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        callback = BurnrateCallback(seq_len=SEQ, socket_path=str(inbox.path), job="lightning", every_steps=1)
        trainer = pl.Trainer(max_steps=STEPS, accumulate_grad_batches=ACCUM, accelerator="cpu", devices=1,
                             val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=0,
                             callbacks=[callback], logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
        trainer.fit(module, loader(), loader())
        assert_exact_counts(inbox, "lightning", STEPS, STEPS * ACCUM * BATCH, SEQ, module.gpt)
        assert_ledger_facts(inbox.ranks()[0], STEPS)
