"""Trainer configuration: flat dataclasses, one per concern, each field documented and
validated where it is defined.

The same fields are the command-line flags of `burnrate train` and `python -m burnrate.trainer`:
each field's metadata carries its help text and flag, so that a field is declared once.
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable

from .faults import parse_faults
from .model import MODELS


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the flag."""


def opt(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None,
        parse: Callable[[str], Any] | None = None) -> Any:
    """A config field: its default, its documentation and its command-line flag."""
    meta = {"help": help, "flag": flag, "choices": choices, "parse": parse}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass
class RunConfig:
    model: str = opt("tiny", "model size", choices=tuple(MODELS))
    steps: int = opt(100, "optimizer steps to train for (the total, counting resumed ones)")
    seed: int = opt(1337, "seed for initialization and data order; runs with the same seed are identical on CPU")
    device: str = opt("auto", "cpu, cuda, or auto (cuda when available)", choices=("auto", "cpu", "cuda"))
    compile: bool = opt(True, "skip torch.compile on GPU (never used on CPU)", flag="--no-compile")
    faults: list = opt([], "inject a fault (repeatable): straggler:rank=R,factor=F | starve:delay=S | "
                           "diverge:at=STEP | stall:at=STEP | crash:at=STEP", flag="--fault")
    orphan_grace: float = opt(30.0, "seconds a rank whose launcher died has to stop at a step boundary and save; "
                                    "then it exits without saving (torchrun's own grace after its SIGTERM)")

    def __post_init__(self) -> None:
        _require(self.steps > 0, "--steps must be positive")
        _require(self.orphan_grace >= 0 and math.isfinite(self.orphan_grace), "--orphan-grace must be >= 0")
        parse_faults(self.faults)   # a ValueError that names the bad SPEC


# A loader's worker hands a batch's tensors to its rank through a Unix socket that
# multiprocessing makes in a directory of its own under TMPDIR (torch's file_descriptor
# sharing, Linux's default): TMPDIR/pymp-<8 random characters>/listener-<8 more>. A socket's
# path holds 107 bytes; past that the worker drops every batch (a traceback on stderr) and the
# rank waits for it forever. Newer Pythons move that directory to /tmp where TMPDIR is too long
# (multiprocessing.util._get_base_temp_dir). Asked of the path, not by making the directory:
# a rank ends without the interpreter's teardown, which would have removed it.
_SOCKET_PATH_MAX = 107
_SOCKET_NAME = len("/pymp-") + 8 + len("/listener-") + 8


def _sockets_fit() -> bool:
    import multiprocessing.util

    import torch.multiprocessing

    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return True
    base = getattr(multiprocessing.util, "_get_base_temp_dir", lambda t: t.gettempdir())(tempfile)
    return len(os.fsencode(base)) + _SOCKET_NAME <= _SOCKET_PATH_MAX


@dataclass
class DataConfig:
    data_path: str = opt("", "pre-tokenized token file (raw uint16, little-endian); empty: synthetic stream")
    batch_size: int = opt(8, "sequences per rank per step")
    seq_len: int = opt(0, "tokens per sequence; 0: the model's context length")
    num_workers: int = opt(0, "DataLoader worker processes per rank")
    prefetch_factor: int = opt(2, "batches each worker loads ahead (with --num-workers > 0)")

    def __post_init__(self) -> None:
        _require(self.batch_size > 0, "--batch-size must be positive")
        _require(self.seq_len >= 0, "--seq-len must be >= 0")
        _require(self.num_workers >= 0, "--num-workers must be >= 0")
        _require(self.prefetch_factor > 0, "--prefetch-factor must be positive")
        if self.num_workers:
            _require(_sockets_fit(), f"--num-workers: the loader's workers hand batches over through sockets under "
                                     f"{tempfile.gettempdir()}, too long a path for them (a socket's holds "
                                     f"{_SOCKET_PATH_MAX} bytes): set TMPDIR to a shorter one")


@dataclass
class OptimConfig:
    lr: float = opt(3e-4, "peak learning rate for one rank; scaled by --lr-scaling with the world size")
    lr_scaling: str = opt("sqrt", "how the learning rate grows with the world size (sqrt suits Adam)",
                          choices=("sqrt", "linear", "none"))
    warmup_steps: int = opt(10, "linear warmup steps before cosine decay")
    min_lr_ratio: float = opt(0.1, "the cosine decay ends at this fraction of the peak")
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices (not on norms)")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this; 0 disables")

    def __post_init__(self) -> None:
        _require(self.lr > 0 and math.isfinite(self.lr), "--lr must be a positive number")
        _require(self.warmup_steps >= 0, "--warmup-steps must be >= 0")
        _require(0 <= self.min_lr_ratio <= 1, "--min-lr-ratio must be within [0, 1]")
        _require(self.grad_clip >= 0, "--grad-clip must be >= 0")

    def scaled_lr(self, world_size: int) -> float:
        factor = {"sqrt": math.sqrt(world_size), "linear": float(world_size), "none": 1.0}[self.lr_scaling]
        return self.lr * factor


def _is_interval(text: str) -> bool:
    if text == "young":
        return True
    try:
        return float(text) >= 0
    except ValueError:
        return False


def _interval(text: str) -> str:
    if not _is_interval(text):
        raise argparse.ArgumentTypeError(f"expected seconds or 'young', got {text!r}")
    return text


@dataclass
class CheckpointConfig:
    checkpoint_dir: str = opt("", "where checkpoints go; empty: no checkpoints")
    checkpoint_every: str = opt("0", "seconds between checkpoints, or 'young' for Young's interval "
                                     "sqrt(2 * save time * MTBF); 0: only at the end", parse=_interval)
    checkpoint_every_steps: int = opt(0, "also checkpoint every N steps; 0: off")
    mtbf: float = opt(6 * 3600.0, "mean time between failures in seconds, for --checkpoint-every young "
                                  "(spot interruption rates are the usual source)")
    keep: int = opt(3, "checkpoints to keep")
    resume: bool = opt(False, "resume from the newest good checkpoint in --checkpoint-dir; an error where there "
                              "is none")
    resume_or_start: bool = opt(False, "resume as --resume does, or start at step 0 where --checkpoint-dir holds "
                                       "no checkpoint file at all: one command for a job's first start and its "
                                       "restarts")

    def __post_init__(self) -> None:
        _require(_is_interval(self.checkpoint_every), "--checkpoint-every takes seconds or 'young'")
        _require(self.keep >= 1, "--keep must be >= 1")
        _require(self.checkpoint_every_steps >= 0, "--checkpoint-every-steps must be >= 0")
        _require(self.mtbf > 0, "--mtbf must be positive")
        _require(not self.resume or bool(self.checkpoint_dir), "--resume needs --checkpoint-dir")
        _require(not self.resume_or_start or bool(self.checkpoint_dir), "--resume-or-start needs --checkpoint-dir")

    @property
    def resuming(self) -> bool:
        return self.resume or self.resume_or_start

    @property
    def young(self) -> bool:
        return self.checkpoint_every == "young"

    @property
    def every_s(self) -> float:
        return 0.0 if self.young else float(self.checkpoint_every)


@dataclass
class TelemetryConfig:
    job_name: str = opt("local", "training_job label when neither BURNRATE_TRAINING_JOB nor a PyTorchJob pod name gives one")
    telemetry_socket: str = opt("", "agent datagram socket (default: $BURNRATE_TELEMETRY_SOCKET or "
                                    "/run/burnrate/telemetry.sock)")
    telemetry_jsonl: str = opt("", "also append every telemetry record to this JSON-lines file")
    report_every_steps: int = opt(0, "report every N steps; 0: every --report-every-s seconds")
    report_every_s: float = opt(1.0, "seconds between reports when --report-every-steps is 0")
    peak_flops: float = opt(0.0, "peak FLOP/s per device for MFU; 0: the GPU table, or an estimate on CPU")

    def __post_init__(self) -> None:
        _require(self.report_every_steps >= 0, "--report-every-steps must be >= 0")
        _require(self.report_every_s > 0, "--report-every-s must be positive")
        _require(self.peak_flops >= 0, "--peak-flops must be >= 0")


SECTIONS = (RunConfig, DataConfig, OptimConfig, CheckpointConfig, TelemetryConfig)


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def __post_init__(self) -> None:
        block = MODELS[self.run.model].block_size
        _require(self.data.seq_len <= block, f"--seq-len must be <= {block} for model {self.run.model}")

    @property
    def seq_len(self) -> int:
        return self.data.seq_len or MODELS[self.run.model].block_size


def _flag(f: Any) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every config field as a flag."""
    for section in SECTIONS:
        group = parser.add_argument_group(section.__name__.removesuffix("Config").lower())
        for f in fields(section):
            meta, default = f.metadata, (f.default if f.default is not MISSING else f.default_factory())
            kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"], "default": default}
            if isinstance(default, bool):
                kwargs["action"] = "store_false" if default else "store_true"
            elif isinstance(default, list):
                kwargs.update(action="append", metavar="SPEC", default=None)
            else:
                kwargs["type"] = meta["parse"] or type(default)
                if meta["choices"]:
                    kwargs["choices"] = meta["choices"]
            group.add_argument(_flag(f), **kwargs)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """Build and validate a TrainConfig from parsed flags; raises ConfigError."""
    try:
        parts = {}
        for name, section in zip(("run", "data", "optim", "checkpoint", "telemetry"), SECTIONS):
            values = {f.name: getattr(args, f.name) for f in fields(section)}
            if section is RunConfig:
                values["faults"] = values["faults"] or []
            parts[name] = section(**values)
        return TrainConfig(**parts)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def to_argv(cfg: TrainConfig) -> list[str]:
    """The flags that rebuild `cfg` (non-default values only)."""
    argv: list[str] = []
    for section in (cfg.run, cfg.data, cfg.optim, cfg.checkpoint, cfg.telemetry):
        for f in fields(section):
            value = getattr(section, f.name)
            default = f.default if f.default is not MISSING else f.default_factory()
            if value == default:
                continue
            if isinstance(default, bool):
                argv.append(_flag(f))
            elif isinstance(default, list):
                for item in value:
                    argv += [_flag(f), item]
            else:
                argv += [_flag(f), str(value)]
    return argv
