"""`python -m burnrate.trainer`: one rank of the reference trainer, as torchrun or a PyTorchJob
starts it (rank layout from MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK)."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from burnrate.exporter.lifetime import end_with_parent, exit_after_parent

from .checkpoint import CheckpointRefused
from .config import ConfigError, add_arguments, from_args
from .train import train


@record  # writes the error file torchrun reads to name the failing rank and its cause
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m burnrate.trainer", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    launcher = os.getppid()
    end_with_parent(launcher)   # a rank ends with its launcher (torchrun, burnrate train), even one killed outright
    try:
        cfg = from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    exit_after_parent(launcher, cfg.run.orphan_grace)
    try:
        return train(cfg)
    except CheckpointRefused as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


def leave(code: int) -> None:
    """Exit once the run is over, without the interpreter's teardown. With torch 2.13 a
    rank that trained DDP over gloo, destroyed its process group and returned can still
    abort in teardown ("terminate called without an active exception"): 1 run in 30 of a
    plain DDP loop on a loaded CPU here. torchrun and a PyTorchJob would then call a
    finished run failed and start it again. Everything is saved and closed by now."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
