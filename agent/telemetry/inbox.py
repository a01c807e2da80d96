"""The agent's end of the telemetry socket: one reader thread, validation, bounded state.

The reader blocks in recv rather than draining at sample time because the kernel
queues only a handful of unix datagrams per socket (net.unix.max_dgram_qlen, often
10); past that, trainers' non-blocking sends fail and their telemetry is lost.

At a few hundred datagrams a second most wake-ups find a single datagram, so the reader
spends as little as it can per wake-up: no socket timeout (Python polls before every
recv on a socket with one, and wakes every period while idle; close() shuts the socket
down instead), no non-blocking drain after each datagram (a failing system call and an
exception per wake-up, while recv returns at once when more are queued), and nobody to
signal (wait_idle polls).
"""
from __future__ import annotations

import errno
import fcntl
import functools
import logging
import os
import socket
import stat
import struct
import termios
import threading
import time
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from burnrate.exporter.snapshot import RankState
from burnrate.exporter.telemetry import FORGET_AFTER_S
from ..thread_names import name_thread
from .schema import MAX_MESSAGE_BYTES, Rejection, validate
from .senders import Senders
from .state import RankTable

CARDINALITY = "cardinality"   # a new rank beyond the node's, the job's or the sender's limits
INTERNAL = "internal"         # handling the datagram raised; the reader goes on

_RETRY_S = 0.2                # pause after a failed read, so a persistent socket error cannot spin a core
READER_THREAD = "burnrate-telem"  # the reader's name in the kernel (15 bytes at most), as top -H shows it
_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_ANCILLARY_BYTES = socket.CMSG_SPACE(_CREDENTIALS.size)
_boottime = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)  # the clock of /proc/<pid>/stat
_log = logging.getLogger(__name__)


class TelemetryInbox:
    """Binds the socket at `path` and accumulates what trainers send until close().

    `mode` and `group` set who may send at all (outside Kubernetes they are the only
    guard); `senders` checks each datagram against the process the kernel says sent it.
    `lock` (default: `<path>.lock`, beside the socket) admits one agent per socket; where
    pods mount the socket's directory it must lie elsewhere, or any pod could hold it."""

    def __init__(self, path: str | os.PathLike[str], *, max_ranks: int = 4096,
                 max_ranks_per_job: int = 1024, max_ranks_per_sender: int = 256, max_jobs_per_sender: int = 32,
                 forget_after_s: float = FORGET_AFTER_S, clock: Callable[[], float] = time.time,
                 senders: Senders | None = None, mode: int = 0o666, group: int | None = None,
                 lock: str | os.PathLike[str] | None = None) -> None:
        self._path = Path(path)
        self.lock_path = Path(lock) if lock is not None else self._path.with_name(self._path.name + ".lock")
        self._clock = clock
        self._table = RankTable(max_ranks, max_ranks_per_job, forget_after_s, max_ranks_per_sender,
                                max_jobs_per_sender)
        self.senders = senders or Senders()
        self._lock = threading.Lock()
        self._received = 0
        self._rejected: dict[str, int] = {}
        self._busy = False
        self._last_done = time.monotonic()
        self._closing = threading.Event()
        self._lock_fd = _claim(self.lock_path)
        try:
            self._sock, self._inode = _bind(self._path, mode, group)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._reader = threading.Thread(target=self._read_loop, name="burnrate-telemetry", daemon=True)
        self._reader.start()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def received(self) -> int:
        """Datagrams read from the socket, valid or not."""
        with self._lock:
            return self._received

    @property
    def relabelled(self) -> int:
        """Datagrams kept under their sender's true namespace and pod rather than the claimed ones."""
        with self._lock:
            return self.senders.relabelled

    @property
    def rejected(self) -> Mapping[str, int]:
        """Datagrams dropped, by reason (schema REASONS, cardinality, internal)."""
        with self._lock:
            return MappingProxyType(dict(self._rejected))

    def ranks(self) -> tuple[RankState, ...]:
        """The ranks heard from within forget_after_s, as an immutable copy."""
        with self._lock:
            self._table.forget_silent(self._clock())
            return self._table.states()

    def wait_idle(self, timeout: float, quiet_s: float = 0.02) -> bool:
        """Block until the socket queue is empty and nothing has been handled for `quiet_s`,
        so that everything sent before the call is folded in; or until `timeout`.
        True when idle was reached."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            with self._lock:
                now = time.monotonic()
                # Counting from the call too gives a reader just woken by a datagram time to take it.
                idle_for = now - max(start, self._last_done)
                if not self._busy and idle_for >= quiet_s and not self._queued():
                    return True
            if now >= deadline:
                return False
            time.sleep(min(deadline - now, max(quiet_s - idle_for, 0.001)))

    def alive(self) -> tuple[bool, str]:
        """Whether trainers can still reach this inbox: its reader runs and the socket file
        on disk is still the one it reads (not removed, not replaced)."""
        if not self._reader.is_alive():
            return False, f"the telemetry reader on {self._path} has stopped"
        try:
            ours = os.lstat(self._path).st_ino == self._inode
        except FileNotFoundError:
            ours = False
        return (True, "ok") if ours else (False, f"the telemetry socket {self._path} was removed or replaced")

    def close(self) -> None:
        """Stop the reader and remove the socket file, unless another process has replaced it."""
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            self._sock.shutdown(socket.SHUT_RD)  # the reader's recv returns at once
        except OSError:
            pass
        self._reader.join(timeout=_RETRY_S + 1.0)
        self._sock.close()
        with self._lock:  # a reader that has not stopped yet must not check through a closed descriptor
            self.senders.close()
        try:
            if os.lstat(self._path).st_ino == self._inode:
                os.unlink(self._path)
        except FileNotFoundError:
            pass
        os.close(self._lock_fd)

    def __enter__(self) -> TelemetryInbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _read_loop(self) -> None:
        name_thread(READER_THREAD)
        receive = self._sock.recvmsg
        while True:
            try:
                # One byte over the limit is enough to tell an oversized datagram; the kernel drops the rest.
                payload, ancillary, _, _ = receive(MAX_MESSAGE_BYTES + 1, _ANCILLARY_BYTES)
                # The sender's process must have started by now (senders.py).
                received = _boottime()
            except OSError:
                if self._closing.is_set():
                    return
                _log.warning("telemetry socket read failed", exc_info=True)
                time.sleep(_RETRY_S)
                continue
            # close() shuts the socket down, which ends recv with b"". (Only an empty datagram
            # needs the check, which spares every other datagram a method call.)
            if not payload and self._closing.is_set():
                return
            self._busy = True  # off the queue but not yet counted: wait_idle must wait for it
            self._take(payload, ancillary, received)

    def _take(self, payload: bytes, ancillary: list, received: float) -> None:
        try:
            result = validate(payload)
        except Exception:
            _log.debug("telemetry datagram could not be validated", exc_info=True)
            result = Rejection(INTERNAL)
        with self._lock:
            pid, uid = _sender(ancillary)
            if not isinstance(result, Rejection):
                try:
                    result = self.senders.check(result, pid, uid, received)
                except Exception:
                    _log.debug("telemetry sender could not be checked", exc_info=True)
                    result = Rejection(INTERNAL)
            if isinstance(result, Rejection):
                reason = result.reason
            else:
                record, sender = result
                try:
                    reason = "" if self._table.add(record, self._clock(), sender, pid) else CARDINALITY
                except Exception:
                    _log.debug("telemetry record could not be folded in", exc_info=True)
                    reason = INTERNAL
            if reason:
                self._rejected[reason] = self._rejected.get(reason, 0) + 1
            self._received += 1
            self._busy = False
            self._last_done = time.monotonic()

    def _queued(self) -> bool:
        """Whether a datagram waits in the kernel queue (FIONREAD gives the next one's size)."""
        try:
            answer = fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:  # closed: nothing more will be read
            return False
        return struct.unpack("i", answer)[0] > 0


def _sender(ancillary: list) -> tuple[int, int]:
    """(pid, uid) from the kernel's SCM_CREDENTIALS; (0, -1) if it sent none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _CREDENTIALS.size:
            pid, uid, _ = _CREDENTIALS.unpack_from(data)
            return pid, uid
    return 0, -1


class InboxInUse(OSError):
    """Another live process receives on this socket."""


def _claim(lock: Path) -> int:
    """Hold `lock` for as long as the inbox lives: a second agent on the same socket would
    take it over and delete it on exit, leaving the first deaf. The kernel drops the lock
    when its holder dies, so a crashed agent does not block the next. Whoever can open the
    file can hold it (reading is enough), so it is 0600, and it belongs where no pod can reach."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot create its lock {lock}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InboxInUse(errno.EBUSY, f"another agent is receiving on it (it holds {lock})") from None
    return fd


def _bind(path: Path, mode: int, group: int | None) -> tuple[socket.socket, int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        found = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(found):
            raise FileExistsError(f"{path} exists and is not a socket; refusing to remove it")
        os.unlink(path)  # left behind by an agent that did not shut down cleanly
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        # The kernel then attaches the sender's pid and uid to every datagram, whatever it claims.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(str(path))
        if group is not None:
            os.chown(path, -1, group)
        # By default 0666: training pods run as other, often non-root, users.
        os.chmod(path, mode)
        return sock, os.lstat(path).st_ino
    except BaseException:
        sock.close()
        raise
