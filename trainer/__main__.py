"""`python -m burnrate.trainer`: one rank of the reference trainer, as torchrun or a PyTorchJob
starts it (rank layout from MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK)."""
from __future__ import annotations

import argparse
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from .config import ConfigError, add_arguments, from_args
from .train import train


@record  # writes the error file torchrun reads to name the failing rank and its cause
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m burnrate.trainer", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        cfg = from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
