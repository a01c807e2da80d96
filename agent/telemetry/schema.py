"""The telemetry message (docs/telemetry.md) and its validation.

`validate` is total: whatever bytes a pod sends, it returns a Record or a Rejection
naming the reason, which becomes the `reason` label of
burnrate_agent_telemetry_rejected_total. Unknown fields are ignored so that a newer
trainer can add fields without its messages being dropped.

Record's annotations are the rules (the contract's fields, each with its rule spelled out
here), and _consistent() holds the few they cannot say.
msgspec checks the annotations in C while it decodes, for a fraction of what parsing
with the stdlib and checking in Python costs; this runs for every message of every
rank. A message msgspec refuses is read again with the stdlib parser, which also takes
the NaN and Infinity literals a diverging trainer sends, and is checked field by field
against the same annotations, so that a rejection names its reason and the field at fault.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from operator import attrgetter
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec
from msgspec import Meta

from burnrate.exporter import telemetry
from burnrate.exporter.telemetry import SCHEMA_VERSION

from burnrate.exporter.snapshot import RankKey


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
_LABELS = ("training_job", "namespace", "pod")

Label = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_CHARS)]  # and no _FORBIDDEN_CHARS
Count = Annotated[int, Meta(ge=0, le=MAX_INT)]
Amount = Annotated[float, Meta(ge=0.0, le=MAX_AMOUNT)]   # NaN fails both bounds
Ratio = Annotated[float, Meta(ge=0.0, le=1.0)]
WorldSize = Annotated[int, Meta(ge=1, le=MAX_WORLD_SIZE)]


_RULES = {
    telemetry.VERSION: Literal[SCHEMA_VERSION],
    telemetry.LABEL: Label,
    telemetry.COUNT: Count,
    telemetry.AMOUNT: Amount,
    telemetry.RATIO: Ratio,
    telemetry.WORLD_SIZE: WorldSize,
    # Loss and gradient norm: NaN and ±Inf are kept, since they are what shows a run diverging.
    telemetry.REAL: float,
    telemetry.FLAG: bool,
}


def _key(self) -> RankKey:
    return RankKey(self.namespace, self.pod, self.training_job, self.rank)


def _spec(field: telemetry.Field) -> tuple:
    annotation = _RULES[field.rule] | None if field.nullable else _RULES[field.rule]
    return (field.name, annotation) if field.required else (field.name, annotation, field.default)


# One valid message, its fields the contract's (exporter.telemetry.FIELDS). Deltas cover the
# interval since the rank's previous message.
# gc=False: a Record holds no containers, so it can never be part of a reference cycle,
# and the collector need not track the one made per message.
Record = msgspec.defstruct("Record", [_spec(f) for f in telemetry.FIELDS], frozen=True, gc=False,
                           module=__name__, namespace={"key": property(_key)})


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str       # one of REASONS (the inbox adds its own: cardinality, internal)
    detail: str = ""  # the offending field, for logs; never a metric label


def _json_types(annotation: Any) -> frozenset[type]:
    """The types of the values a JSON decoder makes that `annotation` takes, constraints aside."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _json_types(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return frozenset().union(*map(_json_types, get_args(annotation)))
    if origin is Literal:
        return frozenset(map(type, get_args(annotation)))
    if annotation is float:  # a JSON number without a fraction or exponent decodes as an int
        return frozenset((int, float))
    return frozenset((annotation,))


# (name, annotation, required, the JSON types it takes), in Record's order, which is the
# order faults are looked for in.
_FIELDS = tuple((field.name, field.type, field.required, _json_types(field.type))
                for field in msgspec.structs.fields(Record))
_decode = msgspec.json.Decoder(Record).decode
_NULL_DELTAS = tuple((f.name, f.default) for f in telemetry.FIELDS if f.delta and f.nullable)
_null_deltas = attrgetter(*(name for name, _ in _NULL_DELTAS))


def validate(payload: bytes) -> Record | Rejection:
    """Parse one datagram. Never raises."""
    if len(payload) > MAX_MESSAGE_BYTES:
        return Rejection(OVERSIZED)
    try:
        record = _decode(payload)
    # ValueError: msgspec's DecodeError and ValidationError, and UnicodeDecodeError for bad UTF-8.
    except (ValueError, RecursionError):
        return _validate_with_stdlib(payload)
    return _consistent(record)


def _validate_with_stdlib(payload: bytes) -> Record | Rejection:
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # RecursionError: 8 KiB of "[" nests deeper than the parser's stack allows.
        return Rejection(MALFORMED)
    if type(message) is not dict:
        return Rejection(NOT_OBJECT)
    values = {}
    for name, annotation, required, json_types in _FIELDS:
        if name not in message:
            if required:
                return Rejection(MISSING_FIELD, name)
            continue
        value = message[name]
        # Exact types: bool is an int subclass, but `true` is never a count.
        if type(value) not in json_types:
            return Rejection(WRONG_TYPE, name)
        try:
            values[name] = msgspec.convert(value, annotation)
        except msgspec.ValidationError:
            return Rejection(UNSUPPORTED_VERSION if name == "v" else BAD_VALUE, name)
    return _consistent(Record(**values))


def _consistent(record: Record) -> Record | Rejection:
    """The rules Record's annotations leave out: label characters, and those that involve more
    than one field. (As a msgspec pattern, the characters would cost a Python method call per
    label, more than all the rest of decoding.)"""
    # isprintable() is false for every forbidden character (and for a few allowed ones, such
    # as a no-break space), so the pattern only runs for the rare labels that fail it.
    if not (record.training_job.isprintable() and record.namespace.isprintable() and record.pod.isprintable()):
        for name in _LABELS:
            if _FORBIDDEN_CHARS.search(getattr(record, name)):
                return Rejection(BAD_VALUE, name)
    if record.rank >= record.world_size:
        return Rejection(BAD_VALUE, "rank")
    # A node's local ranks are a subset of the job's ranks.
    if record.local_rank is not None and record.local_rank >= record.world_size:
        return Rejection(BAD_VALUE, "local_rank")
    # A delta sent as null is "nothing this interval": the counters add its default.
    # Looked for in one C call first: trainers send them as numbers, so this is rarely needed.
    if None not in _null_deltas(record):
        return record
    nulls = {name: default for name, default in _NULL_DELTAS if getattr(record, name) is None}
    return msgspec.structs.replace(record, **nulls)
