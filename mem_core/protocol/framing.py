"""Framing of the live wire: ``encode`` a message into frames, ``decode`` frames into a checked ``Message``.

A message is ``[topic, JSON header, buffer...]``: the header a UTF-8 JSON object with ``version``, ``topic``, ``seq``,
``t_sent`` and the ``buffers`` table (name, dtype, shape of each raw frame that follows, in order), plus the topic's
own fields. The envelope is checked here: the header's size, its JSON (no NaN, no overflowing numbers, nesting),
and each buffer against its declared dtype and shape, before anything is allocated.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import Field, StrictInt, StrictStr
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.errors import MemError
from mem_core.limits import (
    MAX_BUFFERS,
    MAX_ELEMENTS,
    MAX_HEADER_BYTES,
    MAX_JSON_DEPTH,
    MAX_NDIM,
    MAX_SEQ,
    MAX_TEXT,
    deeper_than,
)
from mem_core.protocol.values import ints
from mem_core.schema import SchemaError, check, short

PROTOCOL_VERSION = 1
TOPICS = ("events", "sensor", "hist", "tokens", "pred", "stats", "control")

_DTYPES = {  # accepted dtype strings: NumPy's ``dtype.str`` (what ``encode`` writes) and ``dtype.name``
    name: dtype
    for dtype in map(np.dtype, ("|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"))
    for name in (dtype.str, dtype.name)
}


class ProtocolError(MemError, ValueError):
    """A message that does not follow the wire format: ``kind`` is its topic (or what the receiver expected),
    ``reason`` what is wrong."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind} message: {reason}")
        self.kind = kind
        self.reason = reason


@dataclass
class Message:
    topic: str
    header: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def seq(self) -> int:
        return int(self.header["seq"])


def encode(topic: str, seq: int, arrays: dict[str, np.ndarray] | None = None, **fields: Any) -> list[bytes]:
    """Frames of one message: topic, JSON header (``fields`` plus the buffer table), one frame per array."""
    if not topic or not topic.isascii():
        raise ProtocolError(repr(topic), "topic must be a non-empty ASCII string")
    arrays = arrays or {}
    if len(arrays) > MAX_BUFFERS:
        raise ProtocolError(topic, f"at most {MAX_BUFFERS} buffers per message, got {len(arrays)}")
    table, frames = [], []
    for name, array in arrays.items():
        a = np.ascontiguousarray(array)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype.str not in _DTYPES:
            raise ProtocolError(topic, f"buffer {name!r}: dtype {a.dtype.str!r} is not a plain numeric dtype")
        table.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape)})
        frames.append(a.tobytes())
    header = {"version": PROTOCOL_VERSION, "topic": topic, "seq": int(seq), "t_sent": time.time(), **fields}
    header["buffers"] = table
    # UTF-8, not \u escapes: a printable character takes at most 4 bytes (limits.CHAR_BYTES), an escaped one up to
    # 12; a lone surrogate (an undecodable file name) becomes its JSON escape, so the header stays valid UTF-8
    text = json.dumps(header, allow_nan=False, ensure_ascii=False)
    return [topic.encode("ascii"), text.encode("utf-8", "backslashreplace"), *frames]


class _Buffer(TypedDict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT)]
    dtype: StrictStr  # looked up in _DTYPES, never handed to np.dtype as sent
    shape: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=MAX_NDIM)]


class _Envelope(TypedDict):
    version: StrictInt
    topic: StrictStr
    seq: ints(0, MAX_SEQ)
    buffers: Annotated[list[_Buffer], Field(max_length=MAX_BUFFERS)]


def decode(frames: Sequence[bytes] | Sequence[memoryview], expect: Sequence[str] = TOPICS) -> Message:
    """Parse and check a received multipart message of one of the ``expect`` topics; arrays are read-only views
    of the frames (no copy). ``ProtocolError`` names the topic (see ``_expected_kind`` while it is unknown)."""
    if not frames:
        raise ProtocolError(_expected_kind(expect), "no frames")
    topic = _topic(frames[0], expect)
    if len(frames) < 2:
        raise ProtocolError(topic, f"expected [topic, header, buffers...], got {len(frames)} frame(s)")
    header = _header(frames[1], topic)
    table = header["buffers"]
    if len(table) != len(frames) - 2:
        raise ProtocolError(topic, f"header lists {len(table)} buffers, message has {len(frames) - 2}")
    arrays: dict[str, np.ndarray] = {}
    for spec, frame in zip(table, frames[2:], strict=True):
        name, array = _decode_buffer(spec, frame, topic)
        if name in arrays:
            raise ProtocolError(topic, f"buffer {name!r} is listed twice")
        arrays[name] = array
    return Message(topic, header, arrays)


def _topic(frame: bytes | memoryview, expect: Sequence[str]) -> str:
    raw = bytes(frame[:64])
    topic = raw.decode("ascii", errors="replace")
    if len(frame) > 64 or topic not in expect:
        raise ProtocolError(_expected_kind(expect), f"topic frame {raw!r} is not one of {', '.join(expect)}")
    return topic


def _expected_kind(expect: Sequence[str]) -> str:
    """The kind an error names while the topic is unknown: the one expected, or "live" for several."""
    return expect[0] if len(expect) == 1 else "live"


def _header(frame: bytes | memoryview, topic: str) -> dict[str, Any]:
    if len(frame) > MAX_HEADER_BYTES:
        raise ProtocolError(topic, f"header of {len(frame)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(bytes(frame).decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:  # json recurses once per nesting level: a header of "[[[[..." would end the thread
        raise ProtocolError(topic, f"header nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # not UTF-8, not JSON, NaN / Infinity, an integer of more than 4300 digits
        raise ProtocolError(topic, f"header is not UTF-8 JSON: {str(exc)[:120]}") from None
    if not isinstance(header, dict):
        raise ProtocolError(topic, "header is not a JSON object")
    if deeper_than(header, MAX_JSON_DEPTH):
        raise ProtocolError(topic, f"header nests deeper than {MAX_JSON_DEPTH} levels")
    checked(_Envelope, header, topic)
    if header["version"] != PROTOCOL_VERSION:
        raise ProtocolError(topic, f"unsupported protocol version {header['version']} (expected {PROTOCOL_VERSION})")
    if header["topic"] != topic:
        raise ProtocolError(topic, f"header topic {short(header['topic'])} differs from the topic frame")
    return header


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"{short(text)} is not a finite number")
    return value


def _decode_buffer(spec: dict[str, Any], frame: bytes | memoryview, topic: str) -> tuple[str, np.ndarray]:
    name, shape = spec["name"], spec["shape"]
    dtype = _DTYPES.get(spec["dtype"])
    if dtype is None:
        raise ProtocolError(
            topic, f"buffer {name!r}: dtype {short(spec['dtype'])} is not a little-endian numeric dtype"
        )
    if math.prod(max(s, 1) for s in shape) > MAX_ELEMENTS:
        raise ProtocolError(topic, f"buffer {name!r}: shape {short(shape)} holds more than 2^40 elements")
    expected = math.prod(shape) * dtype.itemsize
    if len(frame) != expected:
        raise ProtocolError(
            topic, f"buffer {name!r}: {len(frame)} bytes, shape {shape} of {dtype.str} needs {expected}"
        )
    return name, np.frombuffer(frame, dtype=dtype).reshape(shape)


def checked(schema: Any, value: Any, kind: str, where: str = "") -> Any:
    """``value`` checked against ``schema``; a ``ProtocolError`` of ``kind`` naming the field otherwise."""
    try:
        return check(schema, value)
    except SchemaError as exc:
        raise ProtocolError(kind, f"{where}{exc}") from None


def expect_topic(message: Message, topic: str) -> None:
    """A ``ProtocolError`` unless ``message`` is of ``topic``."""
    if message.topic != topic:
        raise ProtocolError(topic, f"got a {message.topic!r} message instead")
