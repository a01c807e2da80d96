"""Cost of the monitor: the same training loop with and without it, interleaved.

Blocks of steps alternate A (plain loop) and B (monitored loop, reporting every step
to a socket nobody reads, the worst case) in one process on one model, so that clock
boosts, thermal drift and allocator state hit both sides alike. Target: the overhead
stays within 0.5% of step time.

    python bench/monitor_overhead.py [--model tiny] [--blocks 10] [--block-steps 20]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from burnrate.trainer.model import GPT, MODELS
from burnrate.trainer.monitor import Monitor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, choices=list(MODELS), help="default: gpt2-124m on GPU, tiny on CPU")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=10, help="A/B block pairs")
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--report-every-steps", type=int, default=1)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    name = args.model or ("gpt2-124m" if cuda else "tiny")
    cfg = MODELS[name]
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    batch = torch.randint(0, cfg.vocab_size, (args.batch_size, cfg.block_size), device=device)
    sock = str(Path(tempfile.mkdtemp()) / "nobody.sock")
    mon = Monitor(model, seq_len=cfg.block_size, every_steps=args.report_every_steps, socket_path=sock)

    def train_step() -> torch.Tensor:
        with autocast:
            loss = model(batch, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def plain(n: int) -> None:
        for _ in range(n):
            train_step()

    def monitored(n: int) -> None:
        for _ in mon.wrap(range(n)):
            with mon.compute():
                loss = train_step()
            mon.step(samples=args.batch_size, loss=loss)

    def timed(block, n: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        block(n)
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    plain(5), monitored(5)   # warm-up, both paths
    a, b = [], []
    for i in range(args.blocks):
        # Alternate which side goes first, so neither always follows the other.
        order = [(plain, a), (monitored, b)] if i % 2 == 0 else [(monitored, b), (plain, a)]
        for block, out in order:
            out.append(timed(block, args.block_steps))
    mon.close()

    ma, mb = statistics.median(a), statistics.median(b)
    print(f"model {name} on {device.type}, {args.blocks} A/B block pairs of {args.block_steps} steps, "
          f"monitor reporting every {args.report_every_steps} step(s)")
    print(f"{'loop':<12} {'median ms/step':>15} {'min ms/step':>12}")
    print(f"{'plain':<12} {ma * 1e3:>15.3f} {min(a) * 1e3:>12.3f}")
    print(f"{'monitored':<12} {mb * 1e3:>15.3f} {min(b) * 1e3:>12.3f}")
    print(f"overhead: {(mb - ma) / ma:+.2%} of step time (median), {(min(b) - min(a)) / min(a):+.2%} (min); "
          f"target <= 0.5%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
