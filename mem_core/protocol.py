"""The live wire format: multipart ``[topic, JSON header, buffer...]`` messages, no sockets here and no pickle.

The header is a UTF-8 JSON object with at least::

    {"version": 1, "topic": "hist", "seq": 12, "t_sent": 1732147200.123,
     "buffers": [{"name": "hist", "dtype": "<f4", "shape": [2, 224, 224]}], ...topic fields...}

and one raw frame follows per ``buffers`` entry, in order, holding exactly ``prod(shape) * itemsize`` bytes of a
C-contiguous array. Only plain numeric dtypes are allowed (bool, ints, uints, floats), little-endian or
byte-order-free. Topics: ``events`` (columns t, x, y, p of an event batch), ``hist``, ``tokens``, ``pred``,
``stats``, ``control`` (see docs/protocol.md). A message that breaks any rule raises ``ProtocolError``;
receivers drop and count such messages.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mem_core.errors import MemError
from mem_core.events import EVENT_DTYPE, SensorSize

PROTOCOL_VERSION = 1
TOPICS = ("events", "hist", "tokens", "pred", "stats", "control")
ALLOWED_KINDS = "biuf"  # bool, signed, unsigned, float
MAX_HEADER_BYTES = 1 << 20
MAX_BUFFERS = 16


class ProtocolError(MemError, ValueError):
    """A message that does not follow the wire format (named by what is wrong)."""


@dataclass
class Message:
    topic: str
    header: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def seq(self) -> int:
        return int(self.header["seq"])


def _check_dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind not in ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(f"{where}: dtype {dtype.str!r} is not a plain numeric dtype")
    if dtype.byteorder == ">":
        raise ProtocolError(f"{where}: big-endian dtype {dtype.str!r} (send little-endian)")
    return dtype


def encode(topic: str, seq: int, arrays: dict[str, np.ndarray] | None = None, **fields: Any) -> list[bytes]:
    """Frames of one message: topic, JSON header (``fields`` plus the buffer table), one frame per array."""
    if not topic or not topic.isascii():
        raise ProtocolError(f"topic must be a non-empty ASCII string, got {topic!r}")
    arrays = arrays or {}
    if len(arrays) > MAX_BUFFERS:
        raise ProtocolError(f"at most {MAX_BUFFERS} buffers per message, got {len(arrays)}")
    table, frames = [], []
    for name, array in arrays.items():
        a = np.ascontiguousarray(array)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        _check_dtype(a.dtype, f"buffer {name!r}")
        table.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape)})
        frames.append(a.tobytes())
    header = {"version": PROTOCOL_VERSION, "topic": topic, "seq": int(seq), "t_sent": time.time(), **fields}
    header["buffers"] = table
    return [topic.encode("ascii"), json.dumps(header, allow_nan=False).encode("utf-8"), *frames]


def decode(frames: list[bytes] | list[memoryview]) -> Message:
    """Parse and check a received multipart message; arrays are read-only views of the frames (no copy)."""
    if len(frames) < 2:
        raise ProtocolError(f"expected [topic, header, buffers...], got {len(frames)} frame(s)")
    try:
        topic = bytes(frames[0]).decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("topic frame is not ASCII") from None
    if len(frames[1]) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(frames[1])} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(bytes(frames[1]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    if header.get("version") != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {header.get('version')!r} (expected {PROTOCOL_VERSION})")
    if header.get("topic") != topic:
        raise ProtocolError(f"header topic {header.get('topic')!r} differs from the topic frame {topic!r}")
    seq = header.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ProtocolError(f"seq must be a non-negative integer, got {seq!r}")
    table = header.get("buffers")
    if not isinstance(table, list) or len(table) != len(frames) - 2 or len(table) > MAX_BUFFERS:
        raise ProtocolError(
            f"header lists {table if not isinstance(table, list) else len(table)} buffers, "
            f"message has {len(frames) - 2}"
        )
    arrays = {}
    for spec, frame in zip(table, frames[2:], strict=True):
        arrays.update([_decode_buffer(spec, frame)])
    return Message(topic, header, arrays)


def _decode_buffer(spec: Any, frame) -> tuple[str, np.ndarray]:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ProtocolError(f"bad buffer description {spec!r}")
    name = spec["name"]
    try:
        dtype = np.dtype(spec.get("dtype"))
    except (TypeError, ValueError):
        raise ProtocolError(f"buffer {name!r}: unknown dtype {spec.get('dtype')!r}") from None
    _check_dtype(dtype, f"buffer {name!r}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ProtocolError(f"buffer {name!r}: bad shape {shape!r}")
    expected = math.prod(shape) * dtype.itemsize
    if len(frame) != expected:
        raise ProtocolError(f"buffer {name!r}: {len(frame)} bytes, shape {shape} of {dtype.str} needs {expected}")
    array = np.frombuffer(frame, dtype=dtype).reshape(shape)
    return name, array


def encode_events(seq: int, events: np.ndarray, sensor: SensorSize, **fields: Any) -> list[bytes]:
    """An ``events`` message: the batch as four columns plus the sensor size."""
    arrays = {name: events[name] for name in EVENT_DTYPE.names}
    return encode("events", seq, arrays, height=int(sensor.height), width=int(sensor.width), **fields)


def decode_events(message: Message) -> tuple[np.ndarray, SensorSize]:
    """The event batch and sensor of an ``events`` message (checked: equal column lengths, sensor given)."""
    try:
        columns = [message.arrays[name] for name in EVENT_DTYPE.names]
        sensor = SensorSize(int(message.header["height"]), int(message.header["width"]))
    except (KeyError, TypeError, ValueError):
        raise ProtocolError("events message needs buffers t, x, y, p and header fields height, width") from None
    n = len(columns[0])
    if any(c.ndim != 1 or len(c) != n for c in columns):
        raise ProtocolError("events message columns differ in length or are not 1-D")
    events = np.empty(n, dtype=EVENT_DTYPE)
    for name, column in zip(EVENT_DTYPE.names, columns, strict=True):
        events[name] = column
    return events, sensor


# ---------------------------------------------------------------------------------------------------- control

CONTROL_COMMANDS = ("state", "play", "pause", "speed", "seek", "record_start", "record_stop")
MAX_SPEED = 1000.0


def encode_control(seq: int, command: str, **args: Any) -> list[bytes]:
    """A ``control`` request (or, with ``ok``/``error``/``state`` fields, a reply); see docs/protocol.md."""
    return encode("control", seq, command=command, **args)


def decode_control(message: Message) -> tuple[str, dict[str, Any]]:
    """The command and its checked arguments of a ``control`` request; ``ProtocolError`` names what is wrong.

    ``speed`` needs ``value`` in (0, MAX_SPEED]; ``seek`` needs ``position_s`` >= 0 (seconds from the start of
    the file); ``record_start`` takes an optional ``name``; the other commands take no arguments.
    """
    if message.topic != "control":
        raise ProtocolError(f"expected a control message, got topic {message.topic!r}")
    command = message.header.get("command")
    if command not in CONTROL_COMMANDS:
        raise ProtocolError(f"unknown control command {command!r}; expected one of {CONTROL_COMMANDS}")
    args: dict[str, Any] = {}
    if command == "speed":
        args["value"] = _number(message.header, "value", lo=0.0, hi=MAX_SPEED, lo_open=True)
    elif command == "seek":
        args["position_s"] = _number(message.header, "position_s", lo=0.0, hi=math.inf)
    elif command == "record_start" and message.header.get("name") is not None:
        name = message.header["name"]
        if not isinstance(name, str) or not name or "/" in name:
            raise ProtocolError(f"record_start name must be a non-empty string without '/', got {name!r}")
        args["name"] = name
    return command, args


def _number(header: dict[str, Any], key: str, *, lo: float, hi: float, lo_open: bool = False) -> float:
    value = header.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProtocolError(f"{header.get('command')}: {key} must be a finite number, got {value!r}")
    if value < lo or (lo_open and value == lo) or value > hi:
        low = f"({lo}" if lo_open else f"[{lo}"
        raise ProtocolError(f"{header.get('command')}: {key}={value} is outside {low}, {hi}]")
    return float(value)


# ------------------------------------------------------------------------------------------ sequence numbers


class SeqTracker:
    """A subscriber's bookkeeping of ``seq`` per topic: messages received, missed (gaps) and publisher restarts.

    A publisher restart shows as a new ``session`` header field or a ``seq`` that does not increase; the count
    starts again from that message without counting a gap.
    """

    def __init__(self) -> None:
        self.received = 0
        self.missed = 0
        self.restarts = 0
        self._session: Any = None
        self._last: dict[str, int] = {}  # topic -> last seq of the current session

    def update(self, message: Message) -> int:
        """Record ``message``; returns how many messages of its topic were missed just before it."""
        self.received += 1
        session, seq = message.header.get("session"), message.seq
        if self._last and session != self._session:
            self.restarts += 1
            self._last.clear()
        self._session = session
        previous = self._last.get(message.topic)
        if previous is not None and seq <= previous:
            self.restarts += 1
            self._last.clear()
            previous = None
        self._last[message.topic] = seq
        if previous is None:
            return 0
        gap = seq - previous - 1
        self.missed += gap
        return gap
