"""The monitor in a loop shaped like nanoGPT's `train.py`, which nobody here wrote: the next
batch is fetched inside the step, gradients accumulate over four micro-batches, the model
is DDP-wrapped, and two ranks run under the real torchrun with gloo. The agent's own inbox
receives on a real socket; the counts must be exact and the FLOPs per token within 3% of
torch's own count of the same model's forward and backward pass.

The ranks leave with `os._exit(0)` once done: with torch 2.13, DDP over gloo aborts in
interpreter teardown after `destroy_process_group()` in some runs (on a loaded 2-core
machine: 3 of 25 of this loop, 3 of 40 with the monitor's calls replaced by no-ops, 2 of
15 of a plain DDP loop), which is torch's and not what this test is about.
`burnrate.trainer` leaves the same way.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from burnrate.agent.telemetry.inbox import TelemetryInbox
from burnrate.trainer.model import GPT, GPTConfig

pytestmark = pytest.mark.slow

ITERS, ACCUM, BATCH, SEQ = 6, 4, 2, 32
CONFIG = dict(vocab_size=256, block_size=SEQ, n_layer=2, n_head=4, n_embd=64)

NANOGPT_SHAPED = textwrap.dedent(f"""
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from burnrate.monitor import Monitor
    from burnrate.trainer.model import GPT, GPTConfig

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(GPT(GPTConfig(**{CONFIG!r})))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def get_batch():
        x = torch.randint(0, {CONFIG['vocab_size']}, ({BATCH}, {SEQ}))
        return x, x

    with Monitor(model, seq_len={SEQ}, every_steps=2) as mon:
        with mon.data_wait():
            X, Y = get_batch()
        for it in range({ITERS}):
            with mon.compute():
                for micro_step in range({ACCUM}):
                    model.require_backward_grad_sync = micro_step == {ACCUM} - 1
                    loss = model(X, Y)
                    mon.micro_batch(samples=len(X), loss=loss)
                    loss = loss / {ACCUM}
                    with mon.data_wait():          # prefetch while the GPU would be busy
                        X, Y = get_batch()
                    loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            mon.step()
    dist.destroy_process_group()
    os._exit(0)   # skips torch 2.13's gloo teardown abort; the monitor closed above (module doc)
""")


def counted_flops_per_token() -> float:
    model = GPT(GPTConfig(**CONFIG))
    x = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(x, x).backward()
    return counter.get_total_flops() / (BATCH * SEQ)


def test_a_nanogpt_shaped_loop_reports_exact_counts_and_true_flops(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NANOGPT_SHAPED)
    with TelemetryInbox(tmp_path / "agent.sock") as inbox:
        env = {"BURNRATE_TELEMETRY_SOCKET": str(inbox.path), "BURNRATE_TRAINING_JOB": "nanogpt",
               "POD_NAMESPACE": "ml", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
               "TMPDIR": str(tmp_path)}   # torchrun's log directory goes there, not into /tmp
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        assert inbox.wait_idle(5)
        assert dict(inbox.rejected) == {}
        ranks = inbox.ranks()
    assert sorted(r.key.rank for r in ranks) == [0, 1]
    samples = ITERS * ACCUM * BATCH
    for rank in ranks:
        v = rank.values
        assert (v["steps"], v["samples"], v["tokens"]) == (ITERS, samples, samples * SEQ)
        assert v["compute_s"] + v["data_wait_s"] <= v["step_s"]
        assert v["flops"] / v["tokens"] == pytest.approx(counted_flops_per_token(), rel=0.03)
