"""The telemetry message (CONTRACT §3) and its validation.

`validate` is total: whatever bytes a pod sends, it returns a Record or a Rejection
naming the reason, which becomes the `reason` label of
burnrate_agent_telemetry_rejected_total. Unknown fields are ignored so that a newer
trainer can add fields without its messages being dropped.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..snapshot import RankKey

SCHEMA_VERSION = 1
DEFAULT_SOCKET_PATH = "/run/burnrate/telemetry.sock"
SOCKET_ENV = "BURNRATE_TELEMETRY_SOCKET"

MAX_MESSAGE_BYTES = 8 * 1024
MAX_WORLD_SIZE = 65536
MAX_LABEL_CHARS = 253            # a Kubernetes object name
# Integers beyond 2**53 lose precision as floats; no real step count gets there.
MAX_INT = 2**53
# Far beyond any real per-interval amount, yet far enough below the float limit
# that summing deltas can never overflow a counter to +Inf.
MAX_AMOUNT = 1e30

OVERSIZED = "oversized"
MALFORMED = "malformed"
NOT_OBJECT = "not_object"
UNSUPPORTED_VERSION = "unsupported_version"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
BAD_VALUE = "bad_value"
REASONS = (OVERSIZED, MALFORMED, NOT_OBJECT, UNSUPPORTED_VERSION, MISSING_FIELD, WRONG_TYPE, BAD_VALUE)

# C0/C1 control characters break log lines and label rendering; lone surrogates
# (which JSON "\ud800" escapes can produce) make the exposition unencodable as UTF-8.
_FORBIDDEN_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Record:
    """One valid message. Deltas cover the interval since the rank's previous message."""

    training_job: str
    namespace: str
    pod: str
    rank: int
    world_size: int
    step: int
    time: float
    steps: int
    step_s: float
    data_wait_s: float
    compute_s: float
    samples: float
    tokens: float
    flops: float
    loss: float | None
    grad_norm: float | None
    mfu: float | None
    local_rank: int | None = None
    checkpoint_time: float | None = None
    checkpoint_s: float = 0.0

    @property
    def key(self) -> RankKey:
        return RankKey(self.namespace, self.pod, self.training_job, self.rank)


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str       # one of REASONS (the inbox adds its own: cardinality, internal)
    detail: str = ""  # the offending field, for logs; never a metric label


class _Invalid(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but `true` is never a count.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _label(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid(WRONG_TYPE, name)
    if not value or len(value) > MAX_LABEL_CHARS or _FORBIDDEN_CHARS.search(value):
        raise _Invalid(BAD_VALUE, name)
    return value


def _count(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Invalid(WRONG_TYPE, name)
    if not 0 <= value <= MAX_INT:
        raise _Invalid(BAD_VALUE, name)
    return value


def _float(name: str, value: Any) -> float:
    if not _is_number(value):
        raise _Invalid(WRONG_TYPE, name)
    try:
        return float(value)
    except OverflowError:  # an integer literal with hundreds of digits
        raise _Invalid(BAD_VALUE, name) from None


def _amount(name: str, value: Any) -> float:
    number = _float(name, value)
    if not 0.0 <= number <= MAX_AMOUNT:  # also false for NaN
        raise _Invalid(BAD_VALUE, name)
    return number


def _reading(name: str, value: Any) -> float | None:
    """Loss and gradient norm: NaN and ±Inf are kept, since they are what shows a run diverging."""
    return None if value is None else _float(name, value)


def _ratio(name: str, value: Any) -> float | None:
    if value is None:
        return None
    number = _float(name, value)
    if not 0.0 <= number <= 1.0:
        raise _Invalid(BAD_VALUE, name)
    return number


def _optional(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda name, value: None if value is None else parse(name, value)


_REQUIRED: tuple[tuple[str, Callable[[str, Any], Any]], ...] = (
    ("training_job", _label), ("namespace", _label), ("pod", _label),
    ("rank", _count), ("world_size", _count), ("step", _count), ("time", _amount),
    ("steps", _count), ("step_s", _amount), ("data_wait_s", _amount), ("compute_s", _amount),
    ("samples", _amount), ("tokens", _amount), ("flops", _amount),
    ("loss", _reading), ("grad_norm", _reading), ("mfu", _ratio),
)
_OPTIONAL: tuple[tuple[str, Callable[[str, Any], Any]], ...] = (
    ("local_rank", _optional(_count)),
    ("checkpoint_time", _optional(_amount)),
    ("checkpoint_s", _optional(_amount)),
)


def _parse(message: Mapping[str, Any]) -> Record:
    if "v" not in message:
        raise _Invalid(MISSING_FIELD, "v")
    version = message["v"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise _Invalid(WRONG_TYPE, "v")
    if version != SCHEMA_VERSION:
        raise _Invalid(UNSUPPORTED_VERSION, "v")
    fields: dict[str, Any] = {}
    for name, parse in _REQUIRED:
        if name not in message:
            raise _Invalid(MISSING_FIELD, name)
        fields[name] = parse(name, message[name])
    for name, parse in _OPTIONAL:
        value = parse(name, message.get(name))
        if value is not None:
            fields[name] = value
    world_size = fields["world_size"]
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise _Invalid(BAD_VALUE, "world_size")
    if fields["rank"] >= world_size:
        raise _Invalid(BAD_VALUE, "rank")
    # A node's local ranks are a subset of the job's ranks.
    if fields.get("local_rank", 0) >= world_size:
        raise _Invalid(BAD_VALUE, "local_rank")
    return Record(**fields)


def validate(payload: bytes) -> Record | Rejection:
    """Parse one datagram. Never raises."""
    if len(payload) > MAX_MESSAGE_BYTES:
        return Rejection(OVERSIZED)
    try:
        # json.loads accepts NaN/Infinity literals, which Python trainers emit for a diverging loss.
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # RecursionError: 8 KiB of "[" nests deeper than the parser's stack allows.
        return Rejection(MALFORMED)
    if not isinstance(message, dict):
        return Rejection(NOT_OBJECT)
    try:
        return _parse(message)
    except _Invalid as invalid:
        return Rejection(invalid.reason, invalid.detail)


def socket_path(environ: Mapping[str, str] = os.environ) -> str:
    """The socket trainers send to: $BURNRATE_TELEMETRY_SOCKET, else the default hostPath."""
    return environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH
