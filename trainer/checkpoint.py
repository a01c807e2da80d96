"""Checkpoints that never lose work.

A checkpoint is two files, `step-00000012.pt` (the torch.save payload) and
`step-00000012.json` (step, size, sha256, time, reason), plus a `latest` pointer.
Every file is written to a temporary name, fsynced, renamed over its final name and the
directory fsynced, so a crash or SIGKILL at any instant leaves either the old file or
the new one, never a torn one. The payload lands before its manifest and the manifest
before the pointer: a manifest always describes a complete payload, and the pointer
always names a complete checkpoint.

Loading verifies the checksum and falls back to the next newest good checkpoint when
the newest is damaged (a bad disk block, a copy cut short).

Every manifest names its run and its model. A directory holds one run's checkpoints: a
fresh run is refused where any checkpoint file is (`--resume` continues that run), a
resume is refused where there is no good checkpoint, where the checkpoint is another
model's, or where another run's checkpoints lie at steps it would write; a resumed run
carries on as the run it resumed, falls back only to that run's older checkpoints, and
pruning touches only its own run's files, so `latest` never names a deleted one. No run
writes over another run's files.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import math
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

log = logging.getLogger(__name__)

POINTER = "latest"
WRITER_LOCK = ".writer.lock"
_NAME = re.compile(r"^step-(\d{8})\.json$")
_FILE = re.compile(r"^step-(\d{8})\.(?:json|pt)$")


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    sha256: str
    size: int
    time: float
    reason: str
    save_s: float
    run: str = ""       # written by every save; "" in manifests from before runs were named
    model: str = ""     # likewise; "" from before models were named


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval, sqrt(2 · C · MTBF), in seconds."""
    return math.sqrt(2.0 * save_s * mtbf_s)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old content or all of the new."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class CheckpointRefused(ValueError):
    """The checkpoint directory cannot serve this run as asked; the message says what to do."""


class CheckpointDirInUse(CheckpointRefused):
    """A fresh run pointed at a directory that holds another run's checkpoints, or a
    second writer beside a live one."""


class Checkpointer:
    """Saves and loads checkpoints in one directory; only rank 0 should call `save`."""

    def __init__(self, directory: str | Path, keep: int = 3, model: str = "") -> None:
        self.dir = Path(directory)
        self.keep = keep
        self.model = model
        self.run = uuid.uuid4().hex[:12]     # a fresh run's; load() and resume() adopt the resumed run's
        self._writer: BinaryIO | None = None
        self.dir.mkdir(parents=True, exist_ok=True)

    def save(self, step: int, state: dict[str, Any], reason: str = "interval") -> CheckpointInfo:
        self.hold_for_writing()
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save(state, buf)
        payload = buf.getvalue()
        digest = hashlib.sha256(payload).hexdigest()
        stem = f"step-{step:08d}"
        path = self.dir / f"{stem}.pt"
        atomic_write(path, payload)
        info = CheckpointInfo(step, path, digest, len(payload), time.time(), reason, time.perf_counter() - t0,
                              self.run, self.model)
        manifest = {k: v for k, v in asdict(info).items() if k != "path"}
        atomic_write(self.dir / f"{stem}.json", json.dumps(manifest).encode())
        atomic_write(self.dir / POINTER, stem.encode())
        self._prune()
        return info

    def manifests(self) -> list[CheckpointInfo]:
        """Checkpoints with a manifest, newest first (not yet verified)."""
        found = []
        for path in self.dir.iterdir():
            if _NAME.match(path.name):
                try:
                    m = json.loads(path.read_text())
                    found.append(CheckpointInfo(path=path.with_suffix(".pt"), **m))
                except (OSError, ValueError, TypeError) as exc:
                    log.warning("ignoring unreadable manifest %s: %s", path, exc)
        return sorted(found, key=lambda i: i.step, reverse=True)

    def stored_steps(self) -> list[int]:
        """Steps that have any checkpoint file here, readable or not, newest first."""
        return sorted({int(m[1]) for p in self.dir.iterdir() if (m := _FILE.match(p.name))}, reverse=True)

    def hold_for_writing(self) -> None:
        """Be this directory's one writer until the process ends (`save` makes sure of it):
        a resumed run started beside ranks that still train would interleave their
        checkpoints with its own, or delete the temporary a live save is writing."""
        if self._writer is not None:
            return
        # A file object, not a bare descriptor: a Checkpointer dropped without release()
        # closes it, and the lock goes with it.
        lock = open(self.dir / WRITER_LOCK, "ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise CheckpointDirInUse(f"another process is writing checkpoints to {self.dir}: stop it "
                                     "(or wait for it to end) first") from None
        self._writer = lock
        # Temporaries left by a writer killed mid-write are never valid checkpoints; with
        # the lock held, none is being written now.
        for stale in self.dir.glob(".*.tmp-*"):
            stale.unlink(missing_ok=True)

    def release(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def claim_fresh(self) -> None:
        """Refuse to start a new run here if another run's checkpoints are: its pruning
        and its `latest` would be mixed up with theirs."""
        steps = self.stored_steps()     # unreadable ones too: this run would write over them
        if steps:
            raise CheckpointDirInUse(
                f"{self.dir} holds another run's checkpoints (up to step {steps[0]}): "
                "--resume continues that run, or give this one a new --checkpoint-dir")

    def resume_point(self, until_step: int, or_start: bool = False) -> tuple[bytes, CheckpointInfo] | None:
        """The verified checkpoint a resumed run of `self.model` to `until_step` starts
        from; None to start at step 0, only with `or_start` and where no checkpoint file
        is. Raises CheckpointRefused, naming what is here, wherever resuming would train
        from scratch over another run's files or load weights of another model."""
        steps = self.stored_steps()
        if not steps:
            if or_start:
                return None
            raise CheckpointRefused(f"--resume: {self.dir} holds no checkpoint to resume from: leave out --resume "
                                    "to start a new run there (or use --resume-or-start, which does either)")
        candidates = self._run_candidates()
        theirs = candidates[0].model if candidates else ""
        if theirs and theirs != self.model:
            raise CheckpointRefused(f"--resume: the checkpoints in {self.dir} are --model {theirs}'s, not "
                                    f"--model {self.model}'s: resume with --model {theirs}, or give this model "
                                    "a new --checkpoint-dir")
        good, damaged = self._newest_good(candidates)
        if good is None:
            readable = {c.step for c in candidates}
            damaged += [f"step-{s:08d} has no readable manifest" for s in steps if s not in readable]
            raise CheckpointRefused(f"--resume: {self.dir} holds no good checkpoint ({'; '.join(damaged)}): "
                                    "move them away to start a new run there")
        info = good[1]
        clash = [m.path.stem for m in self.manifests() if m.run != info.run and info.step < m.step <= until_step]
        if clash:
            raise CheckpointRefused(f"--resume: {self.dir} also holds another run's checkpoints at steps this run "
                                    f"would write ({', '.join(reversed(clash))}): move them away first")
        return good

    def resume(self, until_step: int, or_start: bool = False) -> tuple[dict[str, Any], CheckpointInfo] | None:
        """`resume_point`, loaded; this Checkpointer carries on as the run it resumes."""
        found = self.resume_point(until_step, or_start)
        return None if found is None else self._adopt(*found)

    def load(self) -> tuple[dict[str, Any], CheckpointInfo] | None:
        """The newest checkpoint whose checksum matches, or None when there is none, of
        the run `latest` names (else of the newest checkpoint's run): never another run's.
        The pointed checkpoint is tried first; that run's older ones after it."""
        good, _ = self._newest_good(self._run_candidates())
        return None if good is None else self._adopt(*good)

    def _adopt(self, payload: bytes, info: CheckpointInfo) -> tuple[dict[str, Any], CheckpointInfo]:
        self.run = info.run
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True), info

    def _run_candidates(self) -> list[CheckpointInfo]:
        """The checkpoints of the run `latest` names (else of the newest checkpoint's run),
        the pointed one first, then newest first."""
        candidates = self.manifests()
        try:
            pointed = (self.dir / POINTER).read_text().strip()
            candidates.sort(key=lambda i: i.path.stem != pointed)   # stable: the rest stay newest first
        except OSError:
            pass
        if candidates:
            run = candidates[0].run
            candidates = [c for c in candidates if c.run == run]
        return candidates

    @staticmethod
    def _newest_good(candidates: list[CheckpointInfo]) -> tuple[tuple[bytes, CheckpointInfo] | None, list[str]]:
        """The first candidate whose checksum matches, with its payload; and what was wrong
        with those before it (logged where an older one serves, for the caller to say where none does)."""
        damaged: list[str] = []
        for info in candidates:
            try:
                payload = info.path.read_bytes()
            except OSError as exc:
                damaged.append(f"{info.path.name} is unreadable ({exc.strerror or exc})")
                continue
            if len(payload) == info.size and hashlib.sha256(payload).hexdigest() == info.sha256:
                for why in damaged:
                    log.warning("checkpoint %s: using an older one", why)
                return (payload, info), damaged
            damaged.append(f"{info.path.name} fails its checksum")
        return None, damaged

    def _prune(self) -> None:
        for old in [m for m in self.manifests() if m.run == self.run][self.keep:]:
            # Manifest first: a checkpoint without one is never offered for loading.
            old.path.with_suffix(".json").unlink(missing_ok=True)
            old.path.unlink(missing_ok=True)
