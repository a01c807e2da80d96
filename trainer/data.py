"""Training data: a deterministic synthetic token stream, or pre-tokenized files on local
disk. Nothing is downloaded at run time.

Both are map-style datasets of (input, target) sequence pairs, so that
`DistributedSampler` shards them and a resumed run can skip exactly the batches
already consumed: the data position is just the number of completed steps.
"""
from __future__ import annotations

import signal
import time
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate


class SyntheticTokens(Dataset):
    """Arithmetic progressions modulo the vocabulary: sample i starts at a token and
    steps by a stride, both drawn from a generator seeded by (seed, i).

    Learnable (the model has to infer the stride in context), so loss curves mean
    something, and a pure function of the index, so any worker or rank can produce
    any sample.
    """

    def __init__(self, vocab_size: int, seq_len: int, num_samples: int = 1 << 20, seed: int = 0) -> None:
        self.vocab_size, self.seq_len, self.num_samples, self.seed = vocab_size, seq_len, num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng((self.seed, i))
        start = rng.integers(self.vocab_size)
        stride = rng.integers(1, 8)
        tokens = (start + stride * np.arange(self.seq_len + 1)) % self.vocab_size
        t = torch.from_numpy(tokens.astype(np.int64))
        return t[:-1], t[1:]


class TokenFile(Dataset):
    """A flat file of uint16 tokens (the nanoGPT `.bin` layout), cut into
    non-overlapping windows of seq_len + 1 tokens. Memory-mapped: workers share the
    page cache instead of copying the file."""

    def __init__(self, path: str, seq_len: int) -> None:
        self.path, self.seq_len = path, seq_len
        self._tokens = np.memmap(path, dtype=np.uint16, mode="r")
        if len(self._tokens) < seq_len + 1:
            raise ValueError(f"{path}: {len(self._tokens)} tokens, fewer than one sequence of {seq_len + 1}")

    def __len__(self) -> int:
        return (len(self._tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self._tokens[i * self.seq_len: (i + 1) * self.seq_len + 1]
        t = torch.from_numpy(chunk.astype(np.int64))
        return t[:-1], t[1:]


class _SlowCollate:
    """Collate that takes `delay` extra seconds per batch: the `starve` fault. A class,
    not a closure, so that worker processes can unpickle it."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self, samples: list) -> list:
        time.sleep(self.delay)
        return default_collate(samples)


class _SkippingSampler(DistributedSampler):
    """DistributedSampler that starts `skip` samples into its epoch (for resume)."""

    skip = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.skip:])


def _ignore_sigterm(worker_id: int) -> None:
    # torchrun signals the whole process group on shutdown. Workers that died with it would
    # break the rank's last fetches before its emergency checkpoint; the rank ends them itself.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def batches(
    dataset: Dataset,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    start_step: int = 0,
    num_workers: int = 0,
    prefetch_factor: int = 2,
    delay: float = 0.0,
    pin_memory: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches for this rank, resuming after `start_step` completed steps."""
    sampler = _SkippingSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    per_epoch = len(sampler) // batch_size
    if per_epoch == 0:
        raise ValueError(f"dataset of {len(dataset)} samples gives no full batch of {batch_size} per rank")
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if num_workers else None,
        pin_memory=pin_memory,
        worker_init_fn=_ignore_sigterm if num_workers else None,
        collate_fn=_SlowCollate(delay) if delay else None,
    )
    epoch, offset = divmod(start_step, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        sampler.skip = offset * batch_size
        yield from loader
        epoch, offset = epoch + 1, 0
