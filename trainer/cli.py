"""`burnrate train`: launch N local ranks of the reference trainer through torch's
elastic launcher (what torchrun runs), one `python -m burnrate.trainer` process per rank."""
from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from burnrate.exporter.errors import UserError

from . import config
from .checkpoint import CheckpointRefused, Checkpointer

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, default=0,
                        help="local ranks to launch (default: one per GPU, or 2 on CPU)")
    config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import torch
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    try:
        cfg = config.from_args(args)
    except config.ConfigError as exc:
        raise UserError(str(exc)) from None
    gpus = torch.cuda.device_count()
    nproc = args.nproc or gpus or 2
    if nproc < 1:
        raise UserError("--nproc must be positive")
    if cfg.run.device == "cuda" and not gpus:
        raise UserError("--device cuda, but no GPU is visible")
    if cfg.data.data_path and not Path(cfg.data.data_path).is_file():
        raise UserError(f"--data-path {cfg.data.data_path}: no such file")
    ck = cfg.checkpoint
    if ck.checkpoint_dir:
        ckpt = Checkpointer(ck.checkpoint_dir, ck.keep, cfg.run.model)
        try:    # said once, here, before any rank starts, rather than by every rank
            ckpt.hold_for_writing()
            if ck.resuming:
                ckpt.resume_point(cfg.run.steps, ck.resume_or_start)
            else:
                ckpt.claim_fresh()
        except CheckpointRefused as exc:
            raise UserError(str(exc)) from None
        finally:
            ckpt.release()

    # The launcher's default log directory (the ranks' error files) is a /tmp/torchelastic_*
    # that nothing removes; this one lives as long as the launch. Until torch's launcher takes
    # SIGTERM over (when it starts the ranks), the default would end the process at once and
    # leave the directory: a SIGTERM then unwinds through the `with` instead.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with tempfile.TemporaryDirectory(prefix="burnrate-train-") as logs:
        return _launch(cfg, nproc, DefaultLogsSpecs(log_dir=logs))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _launch(cfg: config.TrainConfig, nproc: int, logs_specs: DefaultLogsSpecs) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch = LaunchConfig(
        logs_specs=logs_specs,
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"burnrate-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        # Port 0: the rendezvous store binds a free port, which the ranks get as MASTER_PORT;
        # no window between picking a port and binding it for another process to take it.
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
    )
    started = time.time()
    try:
        elastic_launch(launch, sys.executable)("-m", "burnrate.trainer", *config.to_argv(cfg))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        print(f"burnrate train: rank {rank} failed with exit code {failure.exitcode}", file=sys.stderr)
        return 1
    except SignalException as exc:
        # The ranks were signalled too, and stop at a step boundary with a checkpoint.
        if exc.sigval != signal.SIGTERM:
            return 128 + int(exc.sigval)
        return 0 if _emergency_checkpoint_written(cfg, started) else 1
    return 0


def _emergency_checkpoint_written(cfg: config.TrainConfig, since: float) -> bool:
    if not cfg.checkpoint.checkpoint_dir:
        return True
    loaded = Checkpointer(cfg.checkpoint.checkpoint_dir, cfg.checkpoint.keep).load()
    return loaded is not None and loaded[1].reason == "sigterm" and loaded[1].time >= since
