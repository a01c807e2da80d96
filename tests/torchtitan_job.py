"""torchtitan's own Trainer on CPU, for tests/test_torchtitan.py: its Llama 3 debug model
trained by `torchrun` with burnrate's metrics processor selected in the job's config.
Usage: torchtitan_job.py WORKDIR (a tiny tokenizer and dataset are written there).

torchtitan runs only on an accelerator, so two things stand in here:
- `torchtitan.tools.utils.device_type/device_module` name the CPU and a stand-in for
  `torch.cuda`'s device calls (device name, memory capacity and statistics). That is
  what torchtitan does on an accelerator it knows; every other line of its Trainer, its
  checkpointer and its validator runs as shipped. One rank: torchtitan 0.3's data
  parallelism (FSDP2 on an SPMD mesh) needs a torch newer than the CPU build here.
- torchtitan 0.3 calls `torch.distributed.set_timeout`, which torch 2.13 lacks; it only
  shortens the process groups' timeouts after the first step, so a no-op stands in.
The debug model's attention is switched from FlexAttention (no backward on CPU) to
torchtitan's scaled-dot-product attention, which is causal as FlexAttention's mask is.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import types

# torchtitan is imported only in main(), after the stand-ins are in place: the test imports
# this module for its constants.

SEQ, LOCAL_BATCH, GLOBAL_BATCH, STEPS = 64, 2, 4, 7   # 2-way gradient accumulation
LOG_FREQ, CHECKPOINT_EVERY, VALIDATE_EVERY = 2, 3, 2
SLOW_SAVE_S, SLOW_BATCH_S, KEEPALIVE_S = 0.5, 0.3, 0.1


def stand_in_for_the_accelerator() -> None:
    import torch
    import torchtitan.tools.utils as titan_utils

    titan_utils.device_type = "cpu"
    titan_utils.device_module = types.SimpleNamespace(
        set_device=lambda device: None, current_device=lambda: 0, device_count=lambda: 1,
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=8 << 30),
        reset_peak_memory_stats=lambda device=None: None, empty_cache=lambda: None,
        memory_stats=lambda device=None: {}, synchronize=lambda device=None: None)
    if not hasattr(torch.distributed, "set_timeout"):
        torch.distributed.set_timeout = lambda timeout, group=None: None


def assets(work: str) -> None:
    """A word-level tokenizer and a dataset of its words, where torchtitan reads them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(500)]
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    os.makedirs(f"{work}/tokenizer", exist_ok=True)
    tokenizer.save(f"{work}/tokenizer/tokenizer.json")
    with open(f"{work}/tokenizer/tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f)
    rng = random.Random(0)
    os.makedirs(f"{work}/data", exist_ok=True)
    with open(f"{work}/data/train.jsonl", "w") as f:
        for _ in range(200):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(300))}) + "\n")


def config(work: str, assets_at: str):
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from burnrate.trainer.torchtitan import with_burnrate

    c = llama3_debugmodel()
    for _fqn, _attention, parent, name in list(c.model_spec.model.traverse(FlexAttention.Config)):
        setattr(parent, name, ScaledDotProductAttention.Config())
    c.hf_assets_path = f"{assets_at}/tokenizer"
    c.dump_folder = f"{work}/out"
    c.dataloader.dataset_path = f"{assets_at}/data"
    c.training.seq_len, c.training.steps = SEQ, STEPS
    c.training.local_batch_size, c.training.global_batch_size = LOCAL_BATCH, GLOBAL_BATCH
    c.checkpoint.enable, c.checkpoint.interval = True, CHECKPOINT_EVERY
    c.validator.enable, c.validator.freq, c.validator.steps = True, VALIDATE_EVERY, 2
    c.validator.dataloader.dataset, c.validator.dataloader.dataset_path = "c4_test", f"{assets_at}/data"
    c.metrics.log_freq, c.metrics.disable_color_printing = LOG_FREQ, True
    rank = os.environ["RANK"]
    return with_burnrate(c, every_steps=1, jsonl_path=f"{work}/rank{rank}.jsonl", keepalive_s=KEEPALIVE_S)


def slowed(trainer) -> None:
    """Each save, and each validation batch, made long enough that the monitor's keep-alives
    tell the agent of it while it lasts (torchtitan's own timing of a save includes it)."""
    save, context = trainer.checkpointer.dcp_save, trainer.validator.validation_context

    def slow_save(*args, **kwargs):
        time.sleep(SLOW_SAVE_S)
        return save(*args, **kwargs)

    def slow_context(*args, **kwargs):
        time.sleep(SLOW_BATCH_S)
        return context(*args, **kwargs)

    trainer.checkpointer.dcp_save, trainer.validator.validation_context = slow_save, slow_context


def main(work: str) -> None:
    stand_in_for_the_accelerator()
    import torch
    from torchtitan.tools.logging import init_logger

    from burnrate.trainer.flops import model_flops_per_token

    init_logger()        # its step lines (loss) and checkpoint times, for the test to compare
    work_of_rank = f"{work}/rank{os.environ['RANK']}"   # each rank writes the same assets
    assets(work_of_rank)
    c = config(work, work_of_rank)
    trainer = c.build()
    slowed(trainer)
    trainer.train()
    trainer.close()
    if os.environ["RANK"] == "0":
        with torch.device("meta"):
            model = c.model_spec.model.build()
        with open(f"{work}/flops.json", "w") as f:
            json.dump({"torchtitan": trainer.metrics_processor.num_flops_per_token,
                       "burnrate": model_flops_per_token(model, SEQ)}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
