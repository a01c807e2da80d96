"""Cost of the monitor: the same training loop without it, with it at its default cadence
(a report about once a second), and with a report every step (the worst case), interleaved.

Blocks of steps rotate through the three loops in one process on one model, so that clock
boosts, thermal drift and allocator state hit every side alike; reports go to a socket
nobody reads. Target: at the default cadence the overhead stays within 0.5% of step time,
with no added synchronization outside report steps.

On a GPU, two checks of that last claim: the monitored loop runs with synchronizing CUDA
calls made errors while no report is due, and the PyTorch profiler counts the
synchronizing CUDA runtime calls of the plain and the default-cadence loop, next to the
reports the monitor sent meanwhile.

    python bench/monitor_overhead.py [--model tiny] [--blocks 10] [--block-steps 20]
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections import Counter
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
    args = parser.parse_args()
    # Nobody listens on the socket, on purpose: the monitor's one warning about it is noise here.
    logging.getLogger("burnrate.monitor").setLevel(logging.ERROR)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    name = args.model or ("gpt2-124m" if cuda else "tiny")
    cfg = MODELS[name]
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    batch = torch.randint(0, cfg.vocab_size, (args.batch_size, cfg.block_size), device=device)
    scratch = tempfile.TemporaryDirectory()
    sock = str(Path(scratch.name) / "nobody.sock")
    reports: Counter[str] = Counter()
    monitors = {"default": Monitor(model, seq_len=cfg.block_size, socket_path=sock,
                                   on_report=lambda _: reports.update(["default"])),
                "every step": Monitor(model, seq_len=cfg.block_size, every_steps=1, socket_path=sock),
                # never due within a run: every step is one between reports
                "no report due": Monitor(model, seq_len=cfg.block_size, every_s=1e9, socket_path=sock)}

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

    def monitored(mon: Monitor):
        def loop(n: int) -> None:
            for _ in mon.wrap(range(n)):
                with mon.compute():
                    loss = train_step()
                mon.step(samples=args.batch_size, loss=loss)
        return loop

    def timed(block, n: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        block(n)
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    loops = {"plain": plain, **{f"monitor, {cadence}": monitored(monitors[cadence]) for cadence in ("default", "every step")}}
    for loop in loops.values():
        loop(5)   # warm-up, every path
    times: dict[str, list[float]] = {label: [] for label in loops}
    labels = list(loops)
    for i in range(args.blocks):
        # Rotate which loop goes first, so that none always follows another.
        for label in labels[i % len(labels):] + labels[:i % len(labels)]:
            times[label].append(timed(loops[label], args.block_steps))
    # The monitor's own cost, without the training step's noise around it: the same calls
    # around an empty step, many times.
    empty = {}
    for cadence in ("default", "every step"):
        mon = Monitor(flops_per_token=1.0, seq_len=cfg.block_size, socket_path=sock,
                      every_steps=1 if cadence == "every step" else 0)
        n = 20_000
        t0 = time.perf_counter()
        for _ in mon.wrap(range(n)):
            with mon.compute():
                pass
            mon.step(samples=args.batch_size)
        empty[cadence] = (time.perf_counter() - t0) / n
        mon.close()
    syncs = added_synchronizations(plain, monitored(monitors["no report due"]), args.block_steps) if cuda else None
    profiled = None
    if cuda:
        steps = 5 * args.block_steps
        before = reports["default"]
        profiled = {"plain": sync_calls(plain, steps), "monitor, default": sync_calls(loops["monitor, default"], steps)}
        profiled_reports = reports["default"] - before
    for mon in monitors.values():
        mon.close()
    scratch.cleanup()

    base_median, base_min = statistics.median(times["plain"]), min(times["plain"])
    print(f"model {name} on {device.type}, {args.blocks} rounds of {args.block_steps}-step blocks per loop")
    print(f"{'loop':<24} {'median ms/step':>15} {'min ms/step':>12} {'overhead (median)':>18} {'overhead (min)':>15}")
    for label, ts in times.items():
        med, low = statistics.median(ts), min(ts)
        print(f"{label:<24} {med * 1e3:>15.3f} {low * 1e3:>12.3f} {(med - base_median) / base_median:>+18.2%} "
              f"{(low - base_min) / base_min:>+15.2%}")
    for cadence, cost in empty.items():
        print(f"monitor alone, {cadence}: {cost * 1e6:.1f} us per step = {cost / base_median:.2%} of the plain median step")
    print("target: <= 0.5% at the default cadence")
    if syncs is not None:
        print(f"synchronizing calls of the monitor between reports (torch.cuda.set_sync_debug_mode('error')): {syncs}")
    if profiled is not None:
        print(f"synchronizing CUDA runtime calls in {steps} steps (PyTorch profiler); the monitor sent "
              f"{profiled_reports} report(s) meanwhile:")
        for label, counts in profiled.items():
            print(f"  {label:<18} {sum(counts.values()):>5}  {dict(sorted(counts.items())) or ''}")
    return 0


# The CUDA runtime calls that wait for the device; a cudaMemcpy that is not Async waits too.
SYNCHRONIZING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def sync_calls(loop, steps: int) -> Counter[str]:
    """How many synchronizing CUDA runtime calls `loop` makes in `steps` steps, by name."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        loop(steps)
    return Counter(e.name for e in prof.events() if e.name in SYNCHRONIZING)


def added_synchronizations(plain, monitored, steps: int) -> str:
    """'none' where `monitored` (a loop with no report due) runs with synchronizing CUDA calls
    made errors, else the first such call; the plain loop is run so first, so that a step that
    synchronizes by itself is not blamed on the monitor."""
    for label, loop in (("the training step itself", plain), ("the monitor", monitored)):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            loop(steps)
        except RuntimeError as exc:
            return f"{label} synchronizes: {str(exc).splitlines()[0]}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return "none"


if __name__ == "__main__":
    sys.exit(main())
