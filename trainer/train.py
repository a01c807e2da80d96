"""The reference DDP training loop.

Runs as one process per rank under torchrun (or `burnrate train`), reading the rank
layout from the environment torchrun and the PyTorchJob operator set. Single process
without those variables.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .checkpoint import CheckpointRefused, Checkpointer, young_interval
from .config import TrainConfig
from .data import SyntheticTokens, TokenFile, batches
from .faults import Faults
from .model import GPT, MODELS
from .monitor import Monitor
from .telemetry import Identity


@dataclass(frozen=True)
class Ranks:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @classmethod
    def from_env(cls) -> Ranks:
        env = os.environ
        world = int(env.get("WORLD_SIZE", "1"))
        return cls(int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")), world,
                   int(env.get("LOCAL_WORLD_SIZE", str(world))))


class _StopRequest:
    """Set by SIGTERM (Kubernetes' eviction notice); acted on at a step boundary."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True


def _lr_lambda(cfg: TrainConfig, faults: Faults):
    warmup, total, floor = cfg.optim.warmup_steps, cfg.run.steps, cfg.optim.min_lr_ratio

    def factor(i: int) -> float:
        # LambdaLR passes the number of steps already taken; step i + 1 runs at this rate.
        if i < warmup:
            base = (i + 1) / warmup
        else:
            progress = min((i - warmup) / max(total - warmup, 1), 1.0)
            base = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return base * faults.lr_scale(i + 1)

    return factor


def _optimizer(model: torch.nn.Module, cfg: TrainConfig, world_size: int, fused: bool) -> torch.optim.AdamW:
    # Decay matrices only: decaying norm gains pulls activations toward zero for nothing.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.optim.scaled_lr(world_size), betas=(0.9, 0.95), fused=fused or None)


def _device(cfg: TrainConfig, ranks: Ranks) -> torch.device:
    if cfg.run.device == "cuda" or (cfg.run.device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(ranks.local_rank)
        return torch.device("cuda", ranks.local_rank)
    if "OMP_NUM_THREADS" not in os.environ:
        # Ranks on one host share its cores; oversubscribing them slows every rank down.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks.local_world_size))
    return torch.device("cpu")


class _Agreement:
    """One small all-reduce per step so that every rank takes the same decision to
    checkpoint or stop. On GPU it runs on a gloo group, so it never syncs the device."""

    def __init__(self, world_size: int, cuda: bool) -> None:
        self.group = None
        if world_size > 1:
            self.group = dist.new_group(backend="gloo") if cuda else dist.group.WORLD

    def __call__(self, *flags: bool) -> list[bool]:
        if self.group is None:
            return list(flags)
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(v) for v in t.tolist()]


def _rng_state(cuda: bool) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if cuda:
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def train(cfg: TrainConfig) -> int:
    """Train to `cfg.run.steps`; 0 when done or stopped cleanly by SIGTERM."""
    ranks = Ranks.from_env()
    stop = _StopRequest()
    device = _device(cfg, ranks)
    cuda = device.type == "cuda"
    distributed = "MASTER_ADDR" in os.environ and ranks.world_size > 1
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return _train(cfg, ranks, device, stop, distributed)
    finally:
        if distributed:
            dist.destroy_process_group()


def _train(cfg: TrainConfig, ranks: Ranks, device: torch.device, stop: _StopRequest, distributed: bool) -> int:
    cuda = device.type == "cuda"
    is_main = ranks.rank == 0
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    faults = Faults(cfg.run.faults, ranks.rank)
    mcfg = MODELS[cfg.run.model]
    seq_len = cfg.seq_len

    torch.manual_seed(cfg.run.seed)   # same initial weights on every rank
    model = GPT(mcfg).to(device)
    optimizer = _optimizer(model, cfg, ranks.world_size, fused=cuda)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg, faults))

    ck = cfg.checkpoint
    ckpt = Checkpointer(ck.checkpoint_dir, ck.keep, cfg.run.model) if ck.checkpoint_dir else None
    start = 0
    if ckpt and is_main:
        ckpt.hold_for_writing()
    if ckpt and not ck.resuming:
        ckpt.claim_fresh()
    if ckpt and ck.resuming:
        loaded = ckpt.resume(cfg.run.steps, ck.resume_or_start)
        if loaded is None:
            _say(is_main, f"{ck.checkpoint_dir} holds no checkpoint: starting at step 0")
        else:
            state, info = loaded
            try:
                model.load_state_dict(state["model"])
            except RuntimeError:    # a manifest that names no model, or a model shaped otherwise since
                raise CheckpointRefused(f"--resume: {info.path.name} in {ck.checkpoint_dir} does not fit "
                                        f"--model {cfg.run.model} (its tensors differ in name or shape)") from None
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            rngs = state["rng"]
            _set_rng_state(rngs[ranks.rank] if ranks.rank < len(rngs) else rngs[0])
            start = int(state["step"])
            _say(is_main, f"resumed from {info.path.name} (step {start})")

    net: torch.nn.Module = model
    if cuda and cfg.run.compile:
        net = torch.compile(model)
    if distributed:
        net = DDP(net, device_ids=[ranks.local_rank] if cuda else None)

    dataset = (TokenFile(cfg.data.data_path, seq_len) if cfg.data.data_path
               else SyntheticTokens(mcfg.vocab_size, seq_len, seed=cfg.run.seed))
    data = batches(dataset, batch_size=cfg.data.batch_size, rank=ranks.rank, world_size=ranks.world_size,
                   seed=cfg.run.seed, start_step=start, num_workers=cfg.data.num_workers,
                   prefetch_factor=cfg.data.prefetch_factor, delay=faults.data_delay, pin_memory=cuda)

    tcfg = cfg.telemetry
    mon = Monitor(model, seq_len=seq_len, device=device, peak=tcfg.peak_flops or None,
                  every_steps=tcfg.report_every_steps, every_s=tcfg.report_every_s,
                  identity=Identity.from_env(tcfg.job_name), socket_path=tcfg.telemetry_socket or None,
                  jsonl_path=tcfg.telemetry_jsonl or None, start_step=start,
                  on_report=_progress(cfg.run.steps) if is_main else None)
    if distributed:
        mon.watch(net)

    agree = _Agreement(ranks.world_size, cuda)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    max_norm = cfg.optim.grad_clip or math.inf
    interval = ck.every_s
    last_save = time.monotonic()
    saved_at = -1

    def save(step: int, reason: str) -> None:
        nonlocal interval, last_save, saved_at
        with mon.checkpoint():
            rng = _rng_state(cuda)
            rngs = [None] * ranks.world_size if is_main else None
            if distributed:
                dist.gather_object(rng, rngs, dst=0, group=agree.group)
            else:
                rngs = [rng]
            if is_main:
                state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "rng": rngs, "world_size": ranks.world_size}
                info = ckpt.save(step, state, reason)
                cost = torch.tensor([info.save_s], dtype=torch.float64)
            else:
                cost = torch.zeros(1, dtype=torch.float64)
            if distributed:
                # Everyone learns rank 0's save time (Young's C) and leaves the save together.
                dist.broadcast(cost, src=0, group=agree.group)
        if ck.young:
            interval = young_interval(float(cost.item()), ck.mtbf)
        last_save, saved_at = time.monotonic(), step

    step = start
    stopped = False
    try:
        for step, (x, y) in zip(range(start + 1, cfg.run.steps + 1), mon.wrap(data)):
            if faults.before_step(step, lambda: stop.requested):
                with mon.compute():
                    faults.straggle(mon.last_compute_s)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    with autocast:
                        loss = net(x, y)
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                mon.step(samples=x.shape[0], tokens=x.numel(), loss=loss.detach(), grad_norm=grad_norm)
            else:
                step -= 1   # SIGTERM ended a hang before this step ran: the last step is the one to save

            # Time-based intervals are rank 0's call (clocks differ); Young's first save
            # measures the save time C that the interval needs.
            due = bool(ckpt) and (
                (is_main and ck.young and saved_at < 0)
                or (is_main and interval > 0 and time.monotonic() - last_save >= interval)
                or (ck.checkpoint_every_steps > 0 and step % ck.checkpoint_every_steps == 0))
            stopping, due = agree(stop.requested, due)
            if ckpt and (due or stopping):
                save(step, "sigterm" if stopping else "interval")
            if stopping:
                stopped = True
                _say(is_main, f"SIGTERM: stopped at step {step}" + (", checkpoint saved" if ckpt else ""))
                break
        if ckpt and not stopped and saved_at != step and step > start:
            save(step, "final")
    finally:
        mon.close()
        # Stop the loader's workers now: they ignore SIGTERM (trainer.data), so a rank that
        # left them to interpreter exit would wait on them forever.
        data.close()
    return 0


def _progress(total: int):
    def show(record: dict) -> None:
        if not record["steps"]:
            return
        mfu = record["mfu"]
        print(f"step {record['step']}/{total} loss {record['loss']:.4f} "
              f"{record['step_s'] / record['steps'] * 1e3:.1f} ms/step "
              f"data {record['data_wait_s'] / max(record['step_s'], 1e-9):.0%} "
              f"mfu {'n/a' if mfu is None else f'{mfu:.1%}'}"
              f"{' (cpu estimate)' if record['peak_source'] == 'cpu-estimate' else ''}", flush=True)
    return show


def _say(is_main: bool, message: str) -> None:
    if is_main:
        print(message, flush=True)
