"""Tokens/s and MFU of the reference model, single device.

On a GPU: gpt2-124m and gpt2-350m in bf16 autocast with torch.compile, MFU against the
peak table in trainer/flops.py. On CPU: the tiny model in fp32, MFU against the CPU
estimate (or --peak-flops), and the output says so.

Beside the bench's own MFU: the MFU the monitor reports for the same loop (its records,
as the agent would get them), and the FLOPs per token of trainer/flops.py's formula next
to what torch's FlopCounterMode counts in one forward and backward pass.

    python bench/mfu.py [--models gpt2-124m gpt2-350m] [--batch-size 16] [--steps 30]
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from burnrate.trainer.flops import model_flops_per_token, peak_flops
from burnrate.trainer.model import GPT, MODELS
from burnrate.trainer.monitor import Monitor


def measure(name: str, device: torch.device, batch_size: int, steps: int, warmup: int, compile_: bool,
            peak_override: float | None) -> dict:
    cfg = MODELS[name]
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)
    net = torch.compile(model) if compile_ else model
    cuda = device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    x = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size), device=device)

    def step() -> None:
        with autocast:
            loss = net(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):   # compilation and allocator warm-up stay out of the figures
        step()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    tokens_per_s = steps * batch_size * cfg.block_size / elapsed
    peak = peak_flops(device, peak_override)
    formula = model_flops_per_token(model, cfg.block_size)
    flops_per_s = tokens_per_s * formula
    return {"model": name, "device": peak.device, "tokens_per_s": tokens_per_s,
            "tflops": flops_per_s / 1e12, "mfu": flops_per_s / peak.flops if peak.flops else float("nan"),
            "monitor_mfu": monitor_mfu(model, step, max(4.0, 2 * elapsed), batch_size, cfg.block_size, peak_override),
            "formula": formula, "counted": counted_flops_per_token(model, cfg, device, autocast),
            "peak": f"{peak.flops / 1e12:g} TFLOP/s ({peak.source})"}


def monitor_mfu(model: torch.nn.Module, step, seconds: float, batch_size: int, seq_len: int,
                peak_override: float | None) -> float:
    """The MFU in the monitor's own records over about `seconds` more of the same loop: the
    figure the agent exports for a job. Its first record is left out: the monitor times
    steps as the host issues them, and the host runs ahead of an idle GPU at first, which
    makes that interval look faster than the GPU is."""
    records: list[dict] = []
    # Nobody listens on the socket, on purpose: the records are taken from on_report.
    logging.getLogger("burnrate.monitor").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as scratch:
        with Monitor(model, seq_len=seq_len, peak=peak_override, socket_path=str(Path(scratch) / "nobody.sock"),
                     on_report=records.append) as mon:
            end = time.perf_counter() + seconds
            for _ in mon.wrap(iter(lambda: time.perf_counter() < end, False)):
                with mon.compute():
                    step()
                mon.step(samples=batch_size)
    records = records[1:]
    step_s = sum(r["step_s"] for r in records)
    return sum(r["flops"] for r in records) / (step_s * records[-1]["peak_flops"]) if step_s else float("nan")


def counted_flops_per_token(model: torch.nn.Module, cfg, device: torch.device, autocast) -> float:
    """What FlopCounterMode counts in one forward and backward pass of one sequence, per token."""
    x = torch.randint(0, cfg.vocab_size, (1, cfg.block_size), device=device)
    with FlopCounterMode(display=False) as counter:
        with autocast:
            loss = model(x, x)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / cfg.block_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None, choices=list(MODELS))
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--peak-flops", type=float, default=None, help="override the peak FLOP/s")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        models, batch, steps, warmup = ["gpt2-124m", "gpt2-350m"], 16, 30, 10
    else:
        print("No GPU: measuring the tiny model on CPU in fp32; MFU is against a CPU estimate, "
              "not comparable with GPU figures.")
        models, batch, steps, warmup = ["tiny"], 16, 20, 3
    rows = [measure(m, device, args.batch_size or batch, args.steps or steps, args.warmup or warmup,
                    cuda and not args.no_compile, args.peak_flops) for m in (args.models or models)]
    print(f"{'model':<11} {'device':<28} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7} {'monitor':>8} "
          f"{'FLOPs/token':>12} {'counted':>12}  peak")
    for r in rows:
        print(f"{r['model']:<11} {r['device'][:28]:<28} {r['tokens_per_s']:>12,.0f} {r['tflops']:>9.2f} "
              f"{r['mfu']:>7.1%} {r['monitor_mfu']:>8.1%} {r['formula']:>12.4g} {r['counted']:>12.4g}  {r['peak']}")
    print("MFU: the bench's own timing; monitor: the MFU in the monitor's records over twice as long (at least 4 s), "
          "its first record left out; "
          "FLOPs/token: trainer/flops.py's formula; counted: FlopCounterMode over one forward and backward pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
