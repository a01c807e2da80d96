"""The telemetry inbox: validation, accumulation over a real Unix datagram socket, limits,
and survival under hostile input."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import msgspec
import psutil
import pytest

from burnrate.agent.telemetry import (CARDINALITY, INTERNAL, MAX_MESSAGE_BYTES, REASONS, Record, Rejection,
                                      TelemetryInbox, validate)
from burnrate.agent.telemetry.inbox import InboxInUse
from burnrate.exporter.catalog import RANK_FIELDS
from burnrate.exporter.snapshot import RankKey
from burnrate.exporter.telemetry import FIELDS, INFORMATIONAL, TelemetrySink, socket_path
from burnrate.trainer.monitor import Monitor
from tests.test_trainer_units import is_hello

T0 = 1_763_700_000.0
_ABSENT = object()  # message(field=_ABSENT) leaves the field out


def message(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "v": 1, "training_job": "llm-7b", "namespace": "ml", "pod": "llm-7b-worker-0",
        "rank": 0, "world_size": 4, "step": 10, "time": T0,
        "steps": 2, "step_s": 1.5, "data_wait_s": 0.25, "compute_s": 1.0,
        "samples": 64, "tokens": 65536, "flops": 3.5e15,
        "loss": 2.5, "grad_norm": 0.75, "mfu": 0.42,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _ABSENT}


def encode(msg: Any) -> bytes:
    return json.dumps(msg, allow_nan=True).encode()


def send_datagram(path: str | os.PathLike[str], record: dict[str, Any]) -> bool:
    with TelemetrySink(path) as sink:
        return sink.send(record)


class Clock:
    """An injected wall clock the test moves by hand; `fail_next` makes its next reading raise."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.fail_next = False

    def __call__(self) -> float:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("clock unreadable")
        return self.now


class Sender:
    """A blocking sender: waits while the agent's short kernel queue is full, so nothing is lost."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.settimeout(10)
        self.sent = 0

    def send(self, payload: bytes) -> bool:
        try:
            self.sock.sendto(payload, self.path)
        except OSError as err:
            if err.errno == errno.EMSGSIZE:  # larger than the kernel takes in one datagram
                return False
            raise
        self.sent += 1
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 108-byte limit of a Unix socket path.
    with tempfile.TemporaryDirectory(prefix="br-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def inbox(sock_dir: Path, clock: Clock) -> Iterator[TelemetryInbox]:
    box = TelemetryInbox(sock_dir / "telemetry.sock", clock=clock)
    yield box
    box.close()


@pytest.fixture
def sender(inbox: TelemetryInbox) -> Iterator[Sender]:
    s = Sender(inbox.path)
    yield s
    s.close()


def deliver(inbox: TelemetryInbox, sender: Sender, *msgs: dict[str, Any]) -> None:
    for msg in msgs:
        assert sender.send(encode(msg))
    assert inbox.wait_idle(timeout=10)


def only_rank(inbox: TelemetryInbox) -> Any:
    ranks = inbox.ranks()
    assert len(ranks) == 1
    return ranks[0]


# --- validation ----------------------------------------------------------------------------

def padded(size: int) -> bytes:
    body = encode(message(pad=""))
    return encode(message(pad="x" * (size - len(body))))


REJECTED: list[tuple[str, bytes]] = [
    ("oversized", padded(MAX_MESSAGE_BYTES + 1)),
    ("oversized", b"x" * 70_000),
    ("malformed", b""),
    ("malformed", b"\xff\xfe{}"),
    ("malformed", b'{"v": 1,'),
    ("malformed", b"[" * MAX_MESSAGE_BYTES),
    ("malformed", b"1" * 5000),
    ("malformed", encode(message())[:-1]),
    ("malformed", encode(message())[:-1] + b', "pad": ' + b"[" * 3900 + b"]" * 3900 + b"}"),
    ("not_object", b"[]"),
    ("not_object", b"null"),
    ("not_object", b'"v"'),
    ("not_object", b"NaN"),
    ("unsupported_version", encode(message(v=2))),
    ("unsupported_version", encode(message(v=0))),
    ("unsupported_version", encode(message(v=2**70))),
    ("missing_field", encode(message(v=_ABSENT))),
    ("missing_field", encode(message(rank=_ABSENT))),
    ("missing_field", encode(message(flops=_ABSENT))),
    ("missing_field", encode(message(loss=_ABSENT))),
    ("missing_field", encode(message(mfu=_ABSENT))),
    ("wrong_type", encode(message(v="1"))),
    ("wrong_type", encode(message(v=True))),
    ("wrong_type", encode(message(rank=True))),
    ("wrong_type", encode(message(rank=1.0))),
    ("wrong_type", encode(message(step="10"))),
    ("wrong_type", encode(message(steps=None))),
    ("wrong_type", encode(message(time="now"))),
    ("wrong_type", encode(message(step_s=None))),
    ("wrong_type", encode(message(tokens=[1]))),
    ("wrong_type", encode(message(loss="nan"))),
    ("wrong_type", encode(message(grad_norm=False))),
    ("wrong_type", encode(message(mfu={"value": 0.5}))),
    ("wrong_type", encode(message(training_job=7))),
    ("wrong_type", encode(message(pod=None))),
    ("wrong_type", encode(message(local_rank=1.5))),
    ("wrong_type", encode(message(checkpoint_time="yesterday"))),
    ("wrong_type", encode(message(final=1))),
    ("wrong_type", encode(message(final=None))),
    ("bad_value", encode(message(rank=-1))),
    ("bad_value", encode(message(rank=4, world_size=4))),
    ("bad_value", encode(message(world_size=0, rank=0))),
    ("bad_value", encode(message(world_size=65537))),
    ("bad_value", encode(message(step=-3))),
    ("bad_value", encode(message(steps=2**60))),
    ("bad_value", encode(message(rank=2**64))),
    ("bad_value", encode(message(step_s=-0.1))),
    ("bad_value", encode(message(data_wait_s=math.nan))),
    ("bad_value", encode(message(compute_s=math.inf))),
    ("bad_value", encode(message(flops=-math.inf))),
    ("bad_value", encode(message(samples=1e31))),
    ("bad_value", encode(message(tokens=10**400))),
    ("bad_value", encode(message()).replace(b'"step_s": 1.5', b'"step_s": 1e400')),
    ("bad_value", encode(message(time=math.nan))),
    ("bad_value", encode(message(mfu=1.5))),
    ("bad_value", encode(message(mfu=math.nan))),
    ("bad_value", encode(message(loss=10**400))),
    ("bad_value", encode(message(training_job=""))),
    ("bad_value", encode(message(namespace="n" * 254))),
    ("bad_value", encode(message(pod="worker\n0"))),
    ("bad_value", encode(message(pod="worker\x7f"))),
    ("bad_value", encode(message(pod="worker\x85"))),
    ("bad_value", encode(message(pod="worker-0\n"))),
    ("bad_value", encode(message()).replace(b'"llm-7b-worker-0"', b'"\\ud800"')),
    ("bad_value", encode(message(local_rank=-1))),
    ("bad_value", encode(message(local_rank=4))),
    ("bad_value", encode(message(checkpoint_time=-1.0))),
    ("bad_value", encode(message(checkpoint_s=math.nan))),
]


@pytest.mark.parametrize("reason,payload", REJECTED,
                         ids=[f"{i}-{reason}" for i, (reason, _) in enumerate(REJECTED)])
def test_validate_rejects_with_reason(reason: str, payload: bytes) -> None:
    result = validate(payload)
    assert isinstance(result, Rejection)
    assert result.reason == reason


def test_every_schema_reason_is_exercised() -> None:
    assert {reason for reason, _ in REJECTED} == set(REASONS)


def test_rejection_names_the_field() -> None:
    assert validate(encode(message(rank=9))) == Rejection("bad_value", "rank")
    assert validate(encode(message(tokens="many"))) == Rejection("wrong_type", "tokens")


@pytest.mark.parametrize("loss,grad_norm", [(math.nan, math.inf), (math.inf, math.nan),
                                            (-math.inf, -math.inf)])
def test_validate_keeps_nan_and_infinite_loss(loss: float, grad_norm: float) -> None:
    payload = encode(message(loss=loss, grad_norm=grad_norm))
    assert b"NaN" in payload or b"Infinity" in payload
    record = validate(payload)
    assert isinstance(record, Record)
    assert repr(record.loss) == repr(loss) and repr(record.grad_norm) == repr(grad_norm)


def test_validate_accepts_a_full_message() -> None:
    record = validate(encode(message(local_rank=3, checkpoint_time=T0 - 60, checkpoint_s=4.5,
                                     added_in_a_later_trainer={"x": 1})))
    assert record == Record(
        v=1, training_job="llm-7b", namespace="ml", pod="llm-7b-worker-0", rank=0, world_size=4, step=10,
        time=T0, steps=2, step_s=1.5, data_wait_s=0.25, compute_s=1.0, samples=64.0, tokens=65536.0,
        flops=3.5e15, loss=2.5, grad_norm=0.75, mfu=0.42, local_rank=3, checkpoint_time=T0 - 60,
        checkpoint_s=4.5)
    assert record.key == RankKey("ml", "llm-7b-worker-0", "llm-7b", 0)


def test_validate_accepts_unknowns_and_edges() -> None:
    record = validate(encode(message(loss=None, grad_norm=None, mfu=None, local_rank=None,
                                     checkpoint_time=None, checkpoint_s=None, step_s=0, added_later=1)))
    assert isinstance(record, Record)
    unknown = (record.loss, record.grad_norm, record.mfu, record.local_rank, record.checkpoint_time)
    assert unknown == (None,) * 5
    assert record.checkpoint_s == 0.0 and isinstance(record.step_s, float)
    edges = validate(encode(message(training_job="j" * 253, pod="träger-ø-0", namespace="ml\u00a0a",
                                    mfu=1, rank=65535, world_size=65536, loss=2**64 + 1)))
    assert isinstance(edges, Record) and edges.mfu == 1.0 and edges.loss == float(2**64)
    assert isinstance(validate(padded(MAX_MESSAGE_BYTES)), Record)


def test_either_parser_gives_the_same_verdict() -> None:
    # A message that msgspec refuses (an unknown field holding NaN is enough) is read again by
    # the stdlib parser: values, reasons and the fields named must not depend on which one read it.
    rng = random.Random(11)
    numbers = [0, 1, 7, 2**53, 2**53 + 1, 2**63, 2**64 + 1, 10**30, 10**31, 0.1, 1 / 3, 5e-324, 1e-300,
               1e30, 1.7976931348623157e308, -0.0, -1, -1e-300, 0.999999999999, 1.0000000000001]
    fields = [f for f in message() if f not in ("v", "training_job", "namespace", "pod")]
    fields += ["local_rank", "checkpoint_time", "checkpoint_s"]
    for _ in range(3000):
        chosen = rng.sample(fields, rng.randrange(1, 4))
        msg = message(**{f: rng.choice(numbers + [rng.random(), rng.lognormvariate(0, 40),
                                                   rng.randrange(2**70), None, True, "1"])
                         for f in chosen})
        if rng.random() < 0.3:
            name = "".join(chr(rng.choice([rng.randrange(0x20, 0x7f), rng.randrange(0xa0, 0x3000),
                                          rng.randrange(0x1f600, 0x1f650), rng.randrange(0, 0xa0)]))
                           for _ in range(rng.randrange(0, 12)))
            msg[rng.choice(["training_job", "namespace", "pod"])] = name
        for ensure_ascii in (True, False):
            payload = json.dumps(msg, ensure_ascii=ensure_ascii).encode()
            fallback = json.dumps({**msg, "added_later": math.nan}, ensure_ascii=ensure_ascii).encode()
            assert repr(validate(payload)) == repr(validate(fallback)), msg


def test_validate_never_raises_on_noise() -> None:
    rng = random.Random(7)
    valid = encode(message())
    for _ in range(5000):
        choice = rng.randrange(4)
        if choice == 0:
            payload = rng.randbytes(rng.randrange(0, 300))
        elif choice == 1:
            payload = valid[:rng.randrange(len(valid))]
        elif choice == 2:
            mutated = bytearray(valid)
            for _ in range(rng.randrange(1, 6)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            payload = bytes(mutated)
        else:
            field = rng.choice(list(message()))
            junk = rng.choice([None, True, -1, 2**70, "", "x", [], {}, math.nan, -math.inf, 1e308])
            payload = encode(message(**{field: junk}))
        assert isinstance(validate(payload), (Record, Rejection))


def test_the_monitor_sends_and_the_agent_reads_the_fields_the_contract_names(tmp_path) -> None:
    assert [f.name for f in msgspec.structs.fields(Record)] == [f.name for f in FIELDS]
    records: list[dict] = []
    mon = Monitor(seq_len=8, socket_path=str(tmp_path / "nobody.sock"), on_report=records.append)
    mon.step(samples=2, loss=1.5)
    mon.close()
    (record,) = records
    assert set(record) == {f.name for f in FIELDS} | set(INFORMATIONAL)
    accepted = validate(encode(record))
    assert isinstance(accepted, Record) and (accepted.tokens, accepted.loss) == (16, 1.5)
    assert record["final"] is False
    # The hello, the report and the close: nobody listens, counted, not raised.
    assert mon.sink.dropped == 3


def test_socket_path_from_environment() -> None:
    assert socket_path(environ={}) == "/run/burnrate/telemetry.sock"
    assert socket_path(environ={"BURNRATE_TELEMETRY_SOCKET": "/tmp/t.sock"}) == "/tmp/t.sock"
    assert socket_path("/x.sock", environ={"BURNRATE_TELEMETRY_SOCKET": "/tmp/t.sock"}) == "/x.sock"


# --- accumulation over the socket ------------------------------------------------------------

def test_counters_accumulate_and_gauges_keep_last(inbox: TelemetryInbox, sender: Sender,
                                                  clock: Clock) -> None:
    deliver(inbox, sender, message(local_rank=1, loss=None, grad_norm=None, mfu=None))
    first = only_rank(inbox)
    assert first.key == RankKey("ml", "llm-7b-worker-0", "llm-7b", 0)
    assert first.local_rank == 1 and first.last_seen == T0
    # Gauges never reported have no value, so the exporter emits no series for them.
    assert {"loss", "grad_norm", "mfu", "last_checkpoint_time"}.isdisjoint(first.values)

    clock.now = T0 + 30
    deliver(inbox, sender,
            message(step=12, time=T0 + 20, loss=2.0, grad_norm=math.nan, mfu=0.4, checkpoint_time=T0 + 15),
            message(step=14, time=T0 + 25, loss=math.inf, grad_norm=None, mfu=None, world_size=8),
            # No step completed in this interval: the last step time stays where it was.
            message(step=14, time=T0 + 29, steps=0, step_s=0, data_wait_s=3.0, compute_s=0,
                    samples=0, tokens=0, flops=0, loss=None, grad_norm=None, mfu=None, world_size=8))
    state = only_rank(inbox)
    values = state.values
    assert set(values) <= set(RANK_FIELDS)
    assert values["steps"] == 2 + 2 + 2 + 0
    assert values["step_s"] == pytest.approx(1.5 * 3)
    assert values["data_wait_s"] == pytest.approx(0.25 * 3 + 3.0)
    assert values["compute_s"] == pytest.approx(3.0)
    assert values["samples"] == 64 * 3 and values["tokens"] == 65536 * 3
    assert values["flops"] == pytest.approx(3 * 3.5e15)
    assert values["loss"] == math.inf
    assert math.isnan(values["grad_norm"])
    assert values["mfu"] == 0.4
    assert values["world_size"] == 8
    assert values["last_step_time"] == T0 + 25
    assert values["last_checkpoint_time"] == T0 + 15
    assert state.local_rank == 1 and state.last_seen == T0 + 30
    # The kernel names the sending process (this one), whatever the record says.
    assert state.pid == os.getpid()
    assert inbox.received == 4 and dict(inbox.rejected) == {}


def test_ranks_are_kept_apart_and_ordered(inbox: TelemetryInbox, sender: Sender) -> None:
    deliver(inbox, sender, message(rank=1, pod="w-1"), message(rank=0, pod="w-0"),
            message(rank=0, pod="w-0", namespace="aa"), message(rank=0, pod="w-0"))
    keys = [(r.key.namespace, r.key.rank) for r in inbox.ranks()]
    assert keys == [("aa", 0), ("ml", 0), ("ml", 1)]
    assert inbox.ranks()[1].values["steps"] == 4


def test_snapshot_copy_does_not_change(inbox: TelemetryInbox, sender: Sender) -> None:
    deliver(inbox, sender, message())
    before = inbox.ranks()
    deliver(inbox, sender, message())
    assert before[0].values["steps"] == 2
    assert inbox.ranks()[0].values["steps"] == 4
    with pytest.raises(TypeError):
        before[0].values["steps"] = 0  # type: ignore[index]


def test_silent_ranks_are_forgotten(sock_dir: Path, clock: Clock) -> None:
    with TelemetryInbox(sock_dir / "t.sock", forget_after_s=60, clock=clock) as box:
        sender = Sender(box.path)
        deliver(box, sender, message(rank=0), message(rank=1))
        clock.now = T0 + 40
        deliver(box, sender, message(rank=1))
        clock.now = T0 + 60
        assert [r.key.rank for r in box.ranks()] == [1]
        clock.now = T0 + 100
        assert box.ranks() == ()
        # A rank that comes back starts its counters afresh.
        deliver(box, sender, message(rank=1))
        assert only_rank(box).values["steps"] == 2
        sender.close()


@pytest.mark.parametrize("limits,msgs", [
    ({"max_ranks": 3}, [message(rank=r, training_job=f"j{r % 2}") for r in range(4)]),
    ({"max_jobs_per_sender": 2}, [message(training_job=f"j{i}") for i in range(3)]),
    ({"max_ranks_per_sender": 2}, [message(training_job=f"j{i}") for i in range(3)]),
    ({"max_ranks_per_job": 2}, [message(rank=r) for r in range(3)]),
])
def test_new_ranks_beyond_limits_are_rejected(sock_dir: Path, clock: Clock, limits: dict[str, int],
                                              msgs: list[dict[str, Any]]) -> None:
    with TelemetryInbox(sock_dir / "t.sock", clock=clock, **limits) as box:
        sender = Sender(box.path)
        deliver(box, sender, *msgs)
        assert len(box.ranks()) == len(msgs) - 1
        assert dict(box.rejected) == {CARDINALITY: 1}
        # Ranks already held keep updating.
        deliver(box, sender, msgs[0])
        assert box.ranks()[0].values["steps"] == 4
        assert dict(box.rejected) == {CARDINALITY: 1}
        # Forgetting silent ranks makes room again.
        clock.now = T0 + 301
        deliver(box, sender, msgs[-1])
        assert [r.key for r in box.ranks()] == [validate(encode(msgs[-1])).key]  # type: ignore[union-attr]
        sender.close()


def test_a_failure_while_handling_is_counted_and_the_reader_goes_on(inbox: TelemetryInbox, sender: Sender,
                                                                    clock: Clock) -> None:
    clock.fail_next = True
    deliver(inbox, sender, message())
    assert dict(inbox.rejected) == {INTERNAL: 1}
    deliver(inbox, sender, message())
    assert only_rank(inbox).values["steps"] == 2
    assert inbox.received == 2


# --- the socket itself --------------------------------------------------------------------

def test_socket_is_created_writable_and_removed_on_close(sock_dir: Path) -> None:
    path = sock_dir / "run" / "burnrate" / "telemetry.sock"
    box = TelemetryInbox(path)
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o666
    readers = [t for t in threading.enumerate() if t.name == "burnrate-telemetry"]
    assert len(readers) == 1 and readers[0].daemon
    assert send_datagram(path, message(loss=math.nan))
    assert box.wait_idle(timeout=10)
    assert math.isnan(box.ranks()[0].values["loss"])
    box.close()
    assert not path.exists()
    assert not readers[0].is_alive()
    box.close()
    assert send_datagram(path, message()) is False


def test_a_waiting_reader_is_never_woken(inbox: TelemetryInbox, sender: Sender) -> None:
    # No socket timeout to poll with: an agent nobody sends to spends no CPU on telemetry.
    deliver(inbox, sender, message())
    [reader] = [t for t in threading.enumerate() if t.name == "burnrate-telemetry"]

    def context_switches() -> int:
        status = Path(f"/proc/self/task/{reader.native_id}/status").read_text()
        return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)

    before = context_switches()
    time.sleep(1.0)
    assert context_switches() == before
    deliver(inbox, sender, message())
    assert context_switches() > before and only_rank(inbox).values["steps"] == 4


def test_stale_socket_is_replaced(sock_dir: Path) -> None:
    path = sock_dir / "t.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()
    with TelemetryInbox(path) as box:
        assert send_datagram(path, message())
        assert box.wait_idle(timeout=10) and box.received == 1


@pytest.mark.parametrize("make", [lambda p: p.write_text("keep me"), lambda p: p.mkdir(),
                                  lambda p: p.symlink_to("/etc/hostname")])
def test_a_path_that_is_not_a_socket_is_refused(sock_dir: Path, make: Any) -> None:
    path = sock_dir / "t.sock"
    make(path)
    with pytest.raises(FileExistsError, match="not a socket"):
        TelemetryInbox(path)
    assert path.exists() or path.is_symlink()


def test_a_second_inbox_on_a_live_socket_is_refused(sock_dir: Path) -> None:
    """One agent per socket: a second would take the socket over and delete it on exit."""
    path = sock_dir / "t.sock"
    first = TelemetryInbox(path)
    with pytest.raises(InboxInUse, match=f"another agent is receiving on it \\(it holds {path}.lock\\)"):
        TelemetryInbox(path)
    assert first.alive() == (True, "ok") and send_datagram(path, message())
    assert first.wait_idle(timeout=10) and first.received == 1
    first.close()
    with TelemetryInbox(path) as after:         # the lock goes with its holder
        assert after.alive() == (True, "ok")


def test_the_lock_can_live_apart_from_the_socket(sock_dir: Path) -> None:
    """Where pods mount the socket's directory, the lock must be elsewhere (docs/security.md)."""
    path, lock = sock_dir / "shared" / "t.sock", sock_dir / "own" / "t.lock"
    with TelemetryInbox(path, lock=lock) as first:
        assert os.listdir(path.parent) == ["t.sock"] and stat.S_IMODE(os.stat(lock).st_mode) == 0o600
        with pytest.raises(InboxInUse, match=f"another agent is receiving on it \\(it holds {lock}\\)"):
            TelemetryInbox(path, lock=lock)
        assert first.alive() == (True, "ok")


def test_close_leaves_a_socket_someone_else_bound(sock_dir: Path) -> None:
    path = sock_dir / "t.sock"
    inbox = TelemetryInbox(path)
    path.unlink()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        other.bind(str(path))
        assert inbox.alive() == (False, f"the telemetry socket {path} was removed or replaced")
        inbox.close()
        assert path.exists() and send_datagram(path, message())
    finally:
        other.close()


@pytest.mark.parametrize("limits", [{"max_ranks": 0}, {"max_jobs_per_sender": 0}, {"max_ranks_per_job": -1},
                                    {"forget_after_s": 0}])
def test_nonsense_limits_are_refused_before_binding(sock_dir: Path, limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TelemetryInbox(sock_dir / "t.sock", **limits)  # type: ignore[arg-type]
    assert not (sock_dir / "t.sock").exists()


def test_send_without_listener_returns_false(sock_dir: Path) -> None:
    assert send_datagram(sock_dir / "nobody.sock", message()) is False
    with TelemetrySink(sock_dir / "nobody.sock") as sink:
        assert sink.send_bytes(b"{}") is False
        assert (sink.sent, sink.dropped) == (0, 1)
    assert send_datagram(sock_dir / "missing-dir" / "t.sock", message()) is False


# --- hostile input over the socket ----------------------------------------------------------

def test_fuzz_over_the_socket(inbox: TelemetryInbox, sender: Sender) -> None:
    rng = random.Random(1234)
    valid = encode(message())
    valid_sent = 0
    for _ in range(1500):
        sender.send(rng.randbytes(rng.randrange(0, 2000)))
        sender.send(valid[:rng.randrange(len(valid))])
        # Wrong for every field, so none of these can pass validation by chance.
        field = rng.choice([f for f in message() if f not in ("training_job", "namespace", "pod")])
        sender.send(encode(message(**{field: rng.choice(["7", True, [], {}])})))
    for field in ("steps", "step_s", "data_wait_s", "compute_s", "samples", "tokens", "flops"):
        for bad in (math.nan, math.inf, -math.inf):
            sender.send(encode(message(**{field: bad})))
    huge_sent = sum(sender.send(b"{" + b" " * (size - 2) + b"}")
                    for size in (MAX_MESSAGE_BYTES + 1, 60_000, 65_536, 65_537, 200_000, 1 << 20, 1 << 24))
    assert huge_sent >= 4
    for i in range(10_000):
        valid_sent += sender.send(encode(message(training_job=f"job-{i:05d}", pod=f"job-{i:05d}-w")))
    assert inbox.wait_idle(timeout=20)
    deliver(inbox, sender, message(training_job="after-the-flood"))
    valid_sent += 1

    rejected = dict(inbox.rejected)
    assert inbox.received == sender.sent
    assert set(rejected) <= set(REASONS) | {CARDINALITY}
    assert rejected["oversized"] == huge_sent
    passed_validation = inbox.received - sum(n for r, n in rejected.items() if r != CARDINALITY)
    assert passed_validation == valid_sent
    ranks = inbox.ranks()
    # One sender made them all, so its limit of jobs is what stopped the flood.
    assert len(ranks) == 32 and len({(r.key.namespace, r.key.training_job) for r in ranks}) == 32
    assert rejected[CARDINALITY] == valid_sent - 32
    # The limit was reached by the flood, so the late job was refused; a known rank still updates.
    held = ranks[0].key
    deliver(inbox, sender, message(training_job=held.training_job, pod=held.pod, namespace=held.namespace))
    assert inbox.rejected[CARDINALITY] == rejected[CARDINALITY]
    assert [r.values["steps"] for r in inbox.ranks() if r.key == held] == [4]


def test_memory_stays_bounded_under_a_flood_of_names(sock_dir: Path, clock: Clock) -> None:
    process = psutil.Process()
    # One sender here, so its own budget is lifted: this is about the node's.
    with TelemetryInbox(sock_dir / "t.sock", max_jobs_per_sender=1_000_000, max_ranks_per_sender=1_000_000,
                        clock=clock) as box:
        sender = Sender(box.path)
        deliver(box, sender, *(message(training_job=f"warm-{i}") for i in range(200)))
        before = process.memory_info().rss
        for i in range(50_000):
            name = f"{i:06d}-" + "n" * 60
            sender.send(encode(message(training_job=name, pod=name, namespace=name)))
        assert box.wait_idle(timeout=30)
        after = process.memory_info().rss
        assert len(box.ranks()) == 4096
        assert box.received == sender.sent
        assert box.rejected[CARDINALITY] == 50_000 + 200 - 4096
        assert after - before < 20 * 1024 * 1024
        sender.close()


def test_a_report_the_agent_had_no_room_for_goes_with_the_next(tmp_path) -> None:
    """The agent's queue holds a few datagrams (net.unix.max_dgram_qlen, 10 by default), and
    the ranks of a job report at the same moment: a rank whose report finds it full must not
    lose its steps and seconds, only send them later. A real socket, its queue filled."""
    path = str(tmp_path / "agent.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)
    try:
        filler = TelemetrySink(path)
        while filler.send_bytes(b"{}"):
            pass                                            # the queue is full now
        sent: list[dict] = []
        mon = Monitor(seq_len=8, every_steps=1, socket_path=path, on_report=sent.append)
        for _ in range(3):
            mon.step(samples=2)
        assert mon.sink.dropped == 4 and [r["steps"] for r in sent] == [1, 1, 1]   # the hello, each interval's
        agent.setblocking(False)
        while True:
            try:
                agent.recv(65536)
            except BlockingIOError:
                break                                       # the agent caught up
        mon.step(samples=2)
        mon.close()
        delivered = json.loads(agent.recv(65536))
        assert (delivered["steps"], delivered["samples"], delivered["tokens"]) == (4, 8, 64)
        assert mon.sink.dropped == 4
    finally:
        agent.close()


@contextlib.contextmanager
def listening(path: Path) -> Iterator[socket.socket]:
    """A bare datagram socket where the agent's would be, its reads waiting up to 5 s."""
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(path))
    agent.settimeout(5.0)
    try:
        yield agent
    finally:
        agent.close()


def waiting(agent: socket.socket) -> list[dict]:
    """Every message queued on `agent` now, without waiting for more."""
    agent.setblocking(False)
    out: list[dict] = []
    with contextlib.suppress(BlockingIOError):
        while True:
            out.append(json.loads(agent.recv(65536)))
    agent.settimeout(5.0)
    return out


def next_report(agent: socket.socket) -> dict:
    """The next message that counts a step, past any keep-alive a slow moment let in first."""
    while not (message := json.loads(agent.recv(65536)))["steps"]:
        pass
    return message


def test_the_agent_exports_when_a_rank_said_its_monitor_closed(inbox: TelemetryInbox, sender: Sender,
                                                                clock: Clock) -> None:
    """A process's last message says its monitor closed: the agent keeps that time beside the last
    report's, equal while nothing follows; a later process of the rank moves the last report on."""
    deliver(inbox, sender, message())
    assert "closed_time" not in only_rank(inbox).values
    clock.now += 3.0
    deliver(inbox, sender, message(steps=0, step_s=0.0, data_wait_s=0.0, compute_s=0.0, samples=0, tokens=0,
                                   flops=0.0, final=True))
    values = only_rank(inbox).values
    assert values["closed_time"] == values["last_report_time"] == T0 + 3.0 and values["steps"] == 2
    clock.now += 5.0
    deliver(inbox, sender, message(start_time=T0 + 6.0))
    values = only_rank(inbox).values
    assert values["closed_time"] == T0 + 3.0 < values["last_report_time"] == T0 + 8.0


def test_a_loop_stuck_between_reports_still_says_its_process_lives(tmp_path) -> None:
    """A loop that stops reporting (hung in a collective, here asleep) sends, every keep-alive
    period, its last report again with nothing new in it: the agent keeps the rank, and its
    counters and last step stay where they were. The JSON lines hold only the loop's intervals,
    and once the monitor is closed nothing more is sent."""
    jsonl = tmp_path / "records.jsonl"
    with listening(tmp_path / "agent.sock") as agent:
        mon = Monitor(seq_len=8, every_steps=1, socket_path=agent.getsockname(), jsonl_path=str(jsonl), keepalive_s=0.2)
        assert is_hello(json.loads(agent.recv(65536)))
        for _ in range(3):
            mon.step(samples=2, loss=1.5)
        reports = [next_report(agent) for _ in range(3)]
        time.sleep(1.0)                                     # the loop hangs
        quiet = waiting(agent)
        mon.close()
        (closing,) = waiting(agent)                         # the close, said once with nothing in it
        time.sleep(0.5)
        assert waiting(agent) == []                         # closed: nothing more
    assert closing["final"] is True and closing["steps"] == 0 and closing["step"] == 3
    assert all(r["final"] is False for r in reports + quiet)
    assert [r["steps"] for r in reports] == [1, 1, 1] and reports[-1]["step"] == 3
    assert 3 <= len(quiet) <= 6, quiet                      # one each 0.2 s of the hang
    times = [q["time"] for q in quiet]
    assert times == sorted(times) and times[0] >= reports[-1]["time"] + 0.2
    for q in quiet:
        record = validate(encode(q))
        assert isinstance(record, Record), record
        assert (record.step, record.steps, record.step_s, record.samples, record.tokens, record.flops) == (3, 0, 0, 0, 0, 0)
        assert (record.loss, record.mfu, record.checkpoint_s, record.eval_s) == (None, None, 0, 0)
        assert (record.start_time, record.resumed_from) == (reports[-1]["start_time"], reports[-1]["resumed_from"])
    assert [json.loads(line)["steps"] for line in jsonl.read_text().splitlines()] == [1, 1, 1]


@pytest.mark.parametrize("kind, counter", [("checkpoint", "checkpoint_s"), ("eval", "eval_s")])
def test_a_save_or_an_evaluation_under_way_is_heard_while_it_lasts_and_counted_once(tmp_path, kind, counter) -> None:
    """A long save or evaluation blocks the loop. Each keep-alive during it carries its seconds
    since the agent last heard of it, so the agent's counter grows while it lasts (not a stall,
    and in a window that closes before it ends); the report after it carries only the rest, so
    the agent counts it once, and the JSON lines hold it whole in the interval it ended in."""
    jsonl = tmp_path / "records.jsonl"
    with listening(tmp_path / "agent.sock") as agent:
        mon = Monitor(seq_len=8, every_steps=1, socket_path=agent.getsockname(), jsonl_path=str(jsonl), keepalive_s=0.2)
        assert is_hello(json.loads(agent.recv(65536)))
        mon.step(samples=2)
        next_report(agent)
        with getattr(mon, kind)():
            time.sleep(1.0)
        during = waiting(agent)
        while during and not during[0][counter]:
            during.pop(0)                                   # a keep-alive before it began
        mon.step(samples=2)
        after = next_report(agent)
        mon.close()
    assert 3 <= len(during) <= 6, during                    # one each 0.2 s of the save
    for quiet in during:
        record = validate(encode(quiet))
        assert isinstance(record, Record), record           # the agent takes each
        assert (record.steps, record.step_s) == (0, 0) and getattr(record, counter) > 0
    told = sum(q[counter] for q in during)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [line[counter] for line in lines][0] == 0 and lines[1][counter] >= 1.0
    assert 0.5 < told <= lines[1][counter] and after["steps"] == 1 and after[counter] >= 0
    assert told + after[counter] == pytest.approx(lines[1][counter], abs=1e-9)


def test_a_save_ended_that_had_not_begun_is_an_error() -> None:
    mon = Monitor(seq_len=8, keepalive_s=0, sink=TelemetrySink(os.devnull))
    mon.begin_checkpoint()
    with pytest.raises(RuntimeError, match="an evaluation ended that had not begun"):
        mon.end_eval()
    with pytest.raises(RuntimeError, match="an evaluation began while a checkpoint save was under way"):
        mon.begin_eval()
    mon.end_checkpoint()
    mon.close()
