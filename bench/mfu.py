"""Tokens/s and MFU of the reference model, single device.

On a GPU: gpt2-124m and gpt2-350m in bf16 autocast with torch.compile, MFU against the
peak table in trainer/flops.py. On CPU: the tiny model in fp32, MFU against the CPU
estimate (or --peak-flops), and the output says so.

    python bench/mfu.py [--models gpt2-124m gpt2-350m] [--batch-size 16] [--steps 30]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

from burnrate.trainer.flops import model_flops_per_token, peak_flops
from burnrate.trainer.model import GPT, MODELS


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
    flops_per_s = tokens_per_s * model_flops_per_token(model, cfg.block_size)
    return {"model": name, "device": peak.device, "tokens_per_s": tokens_per_s,
            "tflops": flops_per_s / 1e12, "mfu": flops_per_s / peak.flops if peak.flops else float("nan"),
            "peak": f"{peak.flops / 1e12:g} TFLOP/s ({peak.source})"}


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
    print(f"{'model':<11} {'device':<28} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7}  peak")
    for r in rows:
        print(f"{r['model']:<11} {r['device'][:28]:<28} {r['tokens_per_s']:>12,.0f} {r['tflops']:>9.2f} "
              f"{r['mfu']:>7.1%}  {r['peak']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
