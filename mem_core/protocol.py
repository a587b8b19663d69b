"""The live wire format: multipart ``[topic, JSON header, buffer...]`` messages, no sockets here and no pickle.

The header is a UTF-8 JSON object with at least::

    {"version": 1, "topic": "hist", "seq": 12, "t_sent": 1732147200.123,
     "buffers": [{"name": "hist", "dtype": "<f4", "shape": [2, 224, 224]}], ...topic fields...}

and one raw frame follows per ``buffers`` entry, in order, holding exactly ``prod(shape) * itemsize`` bytes of a
C-contiguous array. Only plain little-endian numeric dtypes are allowed (bool, ints, uints, floats). Topics:
``events`` (columns t, x, y, p of an event batch), ``sensor``, ``hist``, ``tokens``, ``pred``, ``stats``, ``control``
(see docs/protocol.md).

Receivers never trust a message: ``decode`` checks the envelope, and ``decode_<topic>`` checks what a topic holds
(types, ranges, sizes against the limits below) before anything is allocated or drawn. Every malformed message
raises ``ProtocolError`` naming its kind; receivers drop and count such messages.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mem_core.errors import MemError
from mem_core.events import EVENT_DTYPE, SensorSize, validate_events

PROTOCOL_VERSION = 1
TOPICS = ("events", "sensor", "hist", "tokens", "pred", "stats", "control")
MAX_HEADER_BYTES = 1 << 20
MAX_BUFFERS = 16
# Limits on what a message may declare, so that a few bytes can never ask a receiver for gigabytes:
MAX_JSON_DEPTH = 16  # nesting of the header (the deepest the server writes is 4: a reply's state.source.replay)
MAX_NDIM = 8
MAX_ELEMENTS = 1 << 40  # product of a buffer's non-zero sizes (an empty buffer could otherwise declare any shape)
MAX_SENSOR_SIDE = 4096  # px of an events message's sensor: 3x the widest real one (Prophesee EVK4 HD, 1280 x 720)
MAX_IMAGE_SIDE = 2048  # px of a sensor view, hist, mask or token grid the viewer draws (models see 224 x 224)
MAX_NUM_TOKENS = 1 << 16  # codebook size (the paper's dVAE has 8192)
MAX_CLASSES = 1 << 16  # a mask is at most <u2
MAX_TEXT = 1024  # characters of a name, label or error message
MAX_WINDOW_EVENTS = 1_000_000  # events of one window (15 MB in the server's ring); the paper's models take 30 000
MAX_WINDOW_MS = 10_000.0  # time span of one window
MAX_SEQ = (1 << 63) - 1
MAX_IPC_PATH = 107  # bytes of a Unix socket path

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
    return [topic.encode("ascii"), json.dumps(header, allow_nan=False).encode("utf-8"), *frames]


def decode(frames: Sequence[bytes] | Sequence[memoryview], expect: Sequence[str] = TOPICS) -> Message:
    """Parse and check a received multipart message of one of the ``expect`` topics; arrays are read-only views
    of the frames (no copy). ``ProtocolError`` names the topic (see ``_expected_kind`` while it is unknown)."""
    if not frames:
        raise ProtocolError(_expected_kind(expect), "no frames")
    topic = _topic(frames[0], expect)
    if len(frames) < 2:
        raise ProtocolError(topic, f"expected [topic, header, buffers...], got {len(frames)} frame(s)")
    header = _header(frames[1], topic)
    table = header.get("buffers")
    if not isinstance(table, list) or len(table) != len(frames) - 2 or len(table) > MAX_BUFFERS:
        listed = len(table) if isinstance(table, list) else _short(table)
        raise ProtocolError(topic, f"header lists {listed} buffers, message has {len(frames) - 2}")
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
    if _deeper_than(header, MAX_JSON_DEPTH):
        raise ProtocolError(topic, f"header nests deeper than {MAX_JSON_DEPTH} levels")
    version = header.get("version")
    if not _is_int(version) or version != PROTOCOL_VERSION:
        raise ProtocolError(topic, f"unsupported protocol version {_short(version)} (expected {PROTOCOL_VERSION})")
    if header.get("topic") != topic:
        raise ProtocolError(topic, f"header topic {_short(header.get('topic'))} differs from the topic frame")
    seq = header.get("seq")
    if not _is_int(seq) or not 0 <= seq <= MAX_SEQ:
        raise ProtocolError(topic, f"seq must be an integer in [0, 2^63), got {_short(seq)}")
    return header


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"{_short(text)} is not a finite number")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests more than ``limit`` containers deep (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _decode_buffer(spec: Any, frame: bytes | memoryview, topic: str) -> tuple[str, np.ndarray]:
    name = spec.get("name") if isinstance(spec, dict) else None
    if not isinstance(name, str) or not 0 < len(name) <= MAX_TEXT:
        raise ProtocolError(topic, f"bad buffer description {_short(spec)}")
    dtype_name = spec.get("dtype")
    dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise ProtocolError(topic, f"buffer {name!r}: dtype {_short(dtype_name)} is not a little-endian numeric dtype")
    shape = spec.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(_is_int(s) and s >= 0 for s in shape)
        or math.prod(max(s, 1) for s in shape) > MAX_ELEMENTS
    ):
        raise ProtocolError(
            topic, f"buffer {name!r}: bad shape {_short(shape)} (at most {MAX_NDIM} sizes >= 0, 2^40 elements)"
        )
    expected = math.prod(shape) * dtype.itemsize
    if len(frame) != expected:
        raise ProtocolError(
            topic, f"buffer {name!r}: {len(frame)} bytes, shape {shape} of {dtype.str} needs {expected}"
        )
    return name, np.frombuffer(frame, dtype=dtype).reshape(shape)


# ------------------------------------------------------------------------------------------------ field checks


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages stay one line whatever a message holds."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(value: Any, kind: str, key: str, lo: int, hi: int) -> int:
    if not _is_int(value) or not lo <= value <= hi:
        raise ProtocolError(kind, f"{key} must be an integer in [{lo}, {hi}], got {_short(value)}")
    return value


def _number(value: Any, kind: str, key: str, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False) -> float:
    # (an int beyond a double, 10**400 in JSON, makes float() and math.isfinite() raise OverflowError)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(_as_float(value)):
        raise ProtocolError(kind, f"{key} must be a finite number, got {_short(value)}")
    if value < lo or (lo_open and value == lo) or value > hi:
        raise ProtocolError(kind, f"{key}={value} is outside {'(' if lo_open else '['}{lo}, {hi}]")
    return float(value)


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _text(value: Any, kind: str, key: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ProtocolError(kind, f"{key} must be a string of at most {MAX_TEXT} characters, got {_short(value)}")
    return value


def _flag(value: Any, kind: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(kind, f"{key} must be true or false, got {_short(value)}")
    return value


def _object(value: Any, kind: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(kind, f"{key} must be a JSON object, got {_short(value)}")
    return value


def _fields(source: dict[str, Any], checks: dict[str, Callable[[Any, str, str], Any]], kind: str, where: str):
    """The fields of ``source`` named in ``checks`` that are present, each checked."""
    return {key: check(source[key], kind, f"{where}{key}") for key, check in checks.items() if key in source}


def _array(message: Message, name: str, kinds: str, ndim: int) -> np.ndarray:
    array = message.arrays.get(name)
    if array is None or array.dtype.kind not in kinds or array.ndim != ndim:
        got = "none" if array is None else f"{array.dtype.str} {array.shape}"
        raise ProtocolError(message.topic, f"buffer {name!r} must be a {ndim}-D array of kind {kinds!r}, got {got}")
    return array


def _image_sides(message: Message, name: str, shape: tuple[int, ...]) -> None:
    if not all(1 <= side <= MAX_IMAGE_SIDE for side in shape):
        raise ProtocolError(message.topic, f"{name} of shape {shape}: each side must be in [1, {MAX_IMAGE_SIDE}]")


def _expect_topic(message: Message, topic: str) -> None:
    if message.topic != topic:
        raise ProtocolError(topic, f"got a {message.topic!r} message instead")


# ------------------------------------------------------------------------------------------------------ events


def encode_events(seq: int, events: np.ndarray, sensor: SensorSize, **fields: Any) -> list[bytes]:
    """An ``events`` message: the batch as four columns plus the sensor size."""
    arrays = {name: events[name] for name in EVENT_DTYPE.names}
    return encode("events", seq, arrays, height=int(sensor.height), width=int(sensor.width), **fields)


def decode_events(message: Message) -> tuple[np.ndarray, SensorSize]:
    """The event batch and sensor of an ``events`` message, checked: columns of one length whose dtypes convert
    without loss, a sensor of at most ``MAX_SENSOR_SIDE`` per side, events sorted, binary and on the sensor."""
    _expect_topic(message, "events")
    if any(name not in message.arrays for name in EVENT_DTYPE.names):
        raise ProtocolError("events", "needs buffers t, x, y, p and header fields height, width")
    columns = [message.arrays[name] for name in EVENT_DTYPE.names]
    for name, column in zip(EVENT_DTYPE.names, columns, strict=True):
        if not np.can_cast(column.dtype, EVENT_DTYPE[name], "safe"):
            raise ProtocolError("events", f"column {name!r} of {column.dtype.str} does not fit {EVENT_DTYPE[name].str}")
    n = len(columns[0]) if columns[0].ndim == 1 else -1
    if any(c.ndim != 1 or len(c) != n for c in columns):
        raise ProtocolError("events", "columns differ in length or are not 1-D")
    header = message.header
    sensor = SensorSize(
        _int(header.get("height"), "events", "height", 1, MAX_SENSOR_SIDE),
        _int(header.get("width"), "events", "width", 1, MAX_SENSOR_SIDE),
    )
    events = np.empty(n, dtype=EVENT_DTYPE)
    for name, column in zip(EVENT_DTYPE.names, columns, strict=True):
        events[name] = column
    try:
        validate_events(events, sensor)
    except ValueError as exc:  # off the sensor, unsorted, polarity not 0/1
        raise ProtocolError("events", str(exc)) from None
    return events, sensor


# ------------------------------------------------------------------------------------------ what the viewer draws


def decode_hist(message: Message) -> np.ndarray:
    """The (2, H, W) float16/32 OFF / ON histogram of a ``hist`` message (finite, sides <= MAX_IMAGE_SIDE)."""
    _expect_topic(message, "hist")
    hist = _array(message, "hist", "f", 3)
    if hist.dtype.itemsize > 4:  # float64 values beyond float32 would overflow where the viewer draws them
        raise ProtocolError("hist", f"hist must be float16 or float32, got {hist.dtype.str}")
    if hist.shape[0] != 2:
        raise ProtocolError("hist", f"hist must have 2 channels (OFF, ON), got shape {hist.shape}")
    _image_sides(message, "hist", hist.shape[1:])
    if not np.isfinite(hist).all():
        raise ProtocolError("hist", "hist holds NaN or infinite values")
    return hist


@dataclass(frozen=True)
class SensorView:
    """A checked ``sensor`` message: the window's events at sensor resolution (binned on large sensors)."""

    image: np.ndarray  # (2, h, w) float OFF / ON, h = ceil(sensor height / binning), w likewise
    sensor: tuple[int, int]  # (height, width) of the sensor, px
    binning: int  # sensor px per image px along each side
    input_region: tuple[float, float, float, float]  # (top, left, height, width) in image px: what the model sees
    frame: int | None = None  # the window's id (a ``capture`` names it)


def decode_sensor(message: Message) -> SensorView:
    """The checked view of a ``sensor`` message: a finite float16/32 (2, h, w) image whose sides follow from the
    header's ``sensor`` and ``binning``, and an ``input_region`` inside it (default: the whole image) or inside the
    square of its longer side centred on it (the extent crop of a wide object, ``InputSpec.crop``)."""
    _expect_topic(message, "sensor")
    image = _array(message, "sensor", "f", 3)
    if image.dtype.itemsize > 4 or image.shape[0] != 2:
        raise ProtocolError(
            "sensor", f"sensor must be float16/32 of shape (2, h, w), got {image.dtype.str} {image.shape}"
        )
    _image_sides(message, "sensor", image.shape[1:])
    header = message.header
    size = _sized(_side, 2)(header.get("sensor"), "sensor", "sensor")  # a side of 0 fails the check below
    binning = _int(header.get("binning"), "sensor", "binning", 1, MAX_SENSOR_SIDE)
    expected = tuple(-(-side // binning) for side in size)  # ceil
    if image.shape[1:] != expected:
        raise ProtocolError(
            "sensor", f"a {size[0]} x {size[1]} sensor binned by {binning} is {expected}, got {image.shape[1:]}"
        )
    region = header.get("input_region", [0, 0, *expected])
    signed = functools.partial(_number, lo=-MAX_SENSOR_SIDE, hi=MAX_SENSOR_SIDE)
    top, left, height, width = _sized(signed, 4)(region, "sensor", "input_region")
    # inside the image, or (a model that crops each window's extent) inside the square of the image's longer side
    # centred on it: a square around a wide object reaches past the shorter side
    room = [(max(expected) - side) / 2 + 1e-6 for side in expected]
    if (
        height <= 0
        or width <= 0
        or min(top + room[0], left + room[1]) < 0
        or top + height > expected[0] + room[0]
        or left + width > expected[1] + room[1]
    ):
        raise ProtocolError("sensor", f"input_region {_short(region)} is not a region of the {expected} image")
    if not np.isfinite(image).all():
        raise ProtocolError("sensor", "sensor holds NaN or infinite values")
    frame = _optional(_count)(header.get("frame"), "sensor", "frame")
    return SensorView(image, (size[0], size[1]), binning, (top, left, height, width), frame)


def decode_tokens(message: Message) -> tuple[np.ndarray, int]:
    """The (h, w) token ids and the codebook size ``num_tokens`` of a ``tokens`` message (ids < num_tokens)."""
    _expect_topic(message, "tokens")
    tokens = _array(message, "tokens", "iu", 2)
    _image_sides(message, "token grid", tokens.shape)
    num_tokens = _int(message.header.get("num_tokens"), "tokens", "num_tokens", 1, MAX_NUM_TOKENS)
    if tokens.min() < 0 or tokens.max() >= num_tokens:
        raise ProtocolError("tokens", f"token ids must be in [0, {num_tokens}), got {tokens.min()}..{tokens.max()}")
    return tokens, num_tokens


@dataclass(frozen=True)
class Prediction:
    """A checked ``pred`` message: ``probs`` (K,) and ``top_k`` for classification, ``mask`` (H, W) for
    segmentation, with ids below ``len(classes)``."""

    task: str
    classes: list[str]
    probs: np.ndarray | None = None
    top_k: list[dict[str, Any]] = field(default_factory=list)
    mask: np.ndarray | None = None
    model_version: int | None = None  # which model of the server made it (it counts the models it served)
    frame: int | None = None  # the window's id (a ``capture`` names it)


def decode_pred(message: Message) -> Prediction:
    """The checked prediction of a ``pred`` message (docs/protocol.md)."""
    _expect_topic(message, "pred")
    header = message.header
    classes = _classes(header.get("classes"), "pred")
    task = header.get("task")
    ids = _fields(header, {"model_version": _optional(_count), "frame": _optional(_count)}, "pred", "")
    if task == "classification":
        probs = _array(message, "probs", "f", 1)
        if len(probs) != len(classes) or not ((probs >= 0) & (probs <= 1)).all():
            raise ProtocolError("pred", f"probs must be {len(classes)} values in [0, 1], got shape {probs.shape}")
        return Prediction(task, classes, probs=probs, top_k=_top_k(header.get("top_k", []), classes), **ids)
    if task == "segmentation":
        mask = _array(message, "mask", "u", 2)
        _image_sides(message, "mask", mask.shape)
        if mask.max() >= len(classes):  # a bigger id would ask the viewer for a colour per id up to it
            raise ProtocolError("pred", f"mask holds class id {mask.max()}, only {len(classes)} classes")
        return Prediction(task, classes, mask=mask, **ids)
    raise ProtocolError("pred", f"task must be 'classification' or 'segmentation', got {_short(task)}")


def _classes(value: Any, kind: str) -> list[str]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_CLASSES:
        raise ProtocolError(kind, f"classes must be a list of 1 to {MAX_CLASSES} names, got {_short(value)}")
    return [_text(name, kind, "class name") for name in value]


def _top_k(value: Any, classes: list[str]) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > len(classes):
        raise ProtocolError("pred", f"top_k must be a list of at most {len(classes)} entries, got {_short(value)}")
    entries = []
    for entry in value:
        entry = _object(entry, "pred", "top_k entry")
        entries.append(
            {
                "id": _int(entry.get("id"), "pred", "top_k id", 0, len(classes) - 1),
                "name": _text(entry.get("name"), "pred", "top_k name"),
                "prob": _number(entry.get("prob"), "pred", "top_k prob", 0.0, 1.0),
            }
        )
    return entries


def decode_stats(message: Message) -> dict[str, Any]:
    """The fields of a ``stats`` message that are present, each checked (unknown fields are left out)."""
    _expect_topic(message, "stats")
    return _fields(message.header, _STATS, "stats", "")


def decode_reply(message: Message) -> dict[str, Any]:
    """A control reply's ``command``, ``ok``, ``error`` and ``state`` (its known fields, checked)."""
    _expect_topic(message, "control")
    reply = _fields(message.header, _REPLY, "control", "")
    if "ok" not in reply:
        raise ProtocolError("control", "a reply needs ok (true or false)")
    return reply


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is not one a client can connect to (``tcp://HOST:PORT`` or ``ipc://PATH``), or None."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        return None if 0 < len(path) <= MAX_IPC_PATH and "\x00" not in path else "expected ipc://PATH (1-107 bytes)"
    match = re.fullmatch(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}):(\d{1,5})", endpoint)
    if match is None:
        return "expected tcp://HOST:PORT or ipc://PATH"
    if not 1 <= int(match[2]) <= 65535:
        return f"port {match[2]} is outside 1..65535"
    return None


def _endpoint(value: Any, kind: str, key: str) -> str:
    problem = endpoint_problem(_text(value, kind, key))
    if problem is not None:
        raise ProtocolError(kind, f"{key} {_short(value)}: {problem}")
    return value


def _sized(check: Callable[[Any, str, str], Any], n: int) -> Callable[[Any, str, str], Any]:
    def checked(value: Any, kind: str, key: str) -> Any:
        if not isinstance(value, list) or len(value) != n:
            raise ProtocolError(kind, f"{key} must be a list of {n}, got {_short(value)}")
        return [check(v, kind, key) for v in value]

    return checked


def _record(checks: dict[str, Callable[[Any, str, str], Any]]) -> Callable[[Any, str, str], dict[str, Any]]:
    """A check for a nested JSON object with the given field checks."""
    return lambda value, kind, key: _fields(_object(value, kind, key), checks, kind, f"{key}.")


def _optional(check: Callable[[Any, str, str], Any]) -> Callable[[Any, str, str], Any]:
    return lambda value, kind, key: None if value is None else check(value, kind, key)


def _count(value: Any, kind: str, key: str) -> int:
    return _int(value, kind, key, 0, MAX_SEQ)


def _side(value: Any, kind: str, key: str) -> int:
    return _int(value, kind, key, 0, MAX_SENSOR_SIDE)


_REPLAY = {"playing": _flag, "speed": _number, "position_s": _number, "duration_s": _number}
_SOURCE = {
    "kind": _text,
    "model": _text,
    "serial": _text,
    "height": _side,
    "width": _side,
    "recordable": _flag,
    "replay": _record(_REPLAY),
}


def _window_events(value: Any, kind: str, key: str) -> int:
    return _int(value, kind, key, 1, MAX_WINDOW_EVENTS)


def _window_ms(value: Any, kind: str, key: str) -> float:
    return _number(value, kind, key, hi=MAX_WINDOW_MS, lo_open=True)


_WINDOW = {"events": _window_events, "ms": _optional(_window_ms)}  # the window command's arguments
_ACCUMULATION = {**_WINDOW, "default_events": _window_events, "default_ms": _optional(_window_ms)}
_RECORDING = {"active": _flag, "root": _text, "name": _optional(_text), "events": _count, "error": _optional(_text)}


def _counts(value: Any, kind: str, key: str) -> dict[str, int]:
    """Captures per class: ``{name: count}`` of at most ``MAX_CLASSES`` names."""
    value = _object(value, kind, key)
    if len(value) > MAX_CLASSES:
        raise ProtocolError(kind, f"{key} holds {len(value)} classes, at most {MAX_CLASSES}")
    return {
        _text(name, kind, f"{key} name"): _count(n, kind, f"{key}[{_short(name, 40)}]") for name, n in value.items()
    }


def _names(value: Any, kind: str, key: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_CLASSES:
        raise ProtocolError(kind, f"{key} must be a list of at most {MAX_CLASSES} names, got {_short(value)}")
    return [_text(name, kind, f"{key} name") for name in value]


# the label-a-few loop: captures, training from them, and the model being served (docs/protocol.md, `stats` and "Control")
_LABELS = {
    "root": _text,
    "classes": _names,
    "counts": _counts,
    "captures": _count,  # captures taken since the server started (a client flashes when it grows)
    "last": _optional(_text),  # class of the newest capture of this session
    "error": _optional(_text),
}
_TRAINING = {
    "state": _text,  # idle, running, exporting, done, failed
    "epoch": _count,
    "epochs": _count,
    "val_top1": _optional(_number),
    "run": _optional(_text),
    "message": _optional(_text),
}
_MODEL = {"name": _text, "version": _count, "path": _text, "error": _optional(_text)}
_STATS = {
    "session": _text,
    "events_per_s": _number,
    "predictions_per_s": _number,
    "predictions": _count,
    "window_events": _count,
    "window_ms": _number,
    "latency_ms": _record({"last": _number, "p50": _number, "p95": _number}),
    "stages_ms": _record(
        {"sensor": _number, "preprocess": _number, "model": _number, "tokenizer": _number, "publish": _number}
    ),
    "skipped_windows": _count,
    "malformed": _count,
    "task": _text,
    "commands": _count,
    "model_state": _text,
    "accumulation": _record(_ACCUMULATION),
    "control": _endpoint,
    "source": _record(_SOURCE),
    "recording": _optional(_record(_RECORDING)),
    "labels": _record(_LABELS),
    "training": _record(_TRAINING),
    "model": _optional(_record(_MODEL)),
}
_STATE = {
    "session": _text,
    "task": _text,
    "classes": lambda value, kind, key: _classes(value, kind),
    "token_grid": _optional(_sized(lambda v, kind, key: _int(v, kind, key, 1, MAX_IMAGE_SIDE), 2)),
    "commands": _count,
    "model_state": _text,
    "accumulation": _record(_ACCUMULATION),
    "source": _record(_SOURCE),
    "recording": _optional(_record(_RECORDING)),
    "labels": _record(_LABELS),
    "training": _record(_TRAINING),
    "model": _optional(_record(_MODEL)),
}
_REPLY = {"command": _text, "ok": _flag, "error": _optional(_text), "state": _optional(_record(_STATE))}


# ---------------------------------------------------------------------------------------------------- control

CONTROL_COMMANDS = (
    "state",
    "play",
    "pause",
    "speed",
    "seek",
    "window",
    "record_start",
    "record_stop",
    "capture",
    "undo_capture",
    "train",
)
MAX_LABEL = 64  # characters of a class name given to ``capture``
MAX_TRAIN_EPOCHS = 10_000
MAX_SPEED = 1000.0
MAX_SEEK_S = 1e9  # 31 years: a position in microseconds stays a 64-bit integer


def encode_control(seq: int, command: str, **args: Any) -> list[bytes]:
    """A ``control`` request (or, with ``ok``/``error``/``state`` fields, a reply); see docs/protocol.md."""
    return encode("control", seq, command=command, **args)


def decode_control(message: Message) -> tuple[str, dict[str, Any]]:
    """The command and its checked arguments of a ``control`` request; ``ProtocolError`` names what is wrong.

    ``speed`` needs ``value`` in (0, MAX_SPEED]; ``seek`` needs ``position_s`` in [0, MAX_SEEK_S] (seconds from
    the start of the file); ``window`` needs ``events`` in [1, MAX_WINDOW_EVENTS] and takes ``ms`` in
    (0, MAX_WINDOW_MS] or null (no time limit); ``record_start`` takes an optional ``name``; ``capture`` needs a
    class name ``label`` (1 to MAX_LABEL printable characters, not only spaces) and takes the ``frame`` id of the
    window to capture (default: the newest); ``train`` takes ``epochs`` in [1, MAX_TRAIN_EPOCHS]; the other commands
    take no arguments.
    """
    _expect_topic(message, "control")
    header = message.header
    command = header.get("command")
    if not isinstance(command, str) or command not in CONTROL_COMMANDS:
        raise ProtocolError("control", f"unknown control command {_short(command)}; expected one of {CONTROL_COMMANDS}")
    args: dict[str, Any] = {}
    if command == "speed":
        args["value"] = _number(header.get("value"), "control", "speed: value", lo=0.0, hi=MAX_SPEED, lo_open=True)
    elif command == "seek":
        args["position_s"] = _number(header.get("position_s"), "control", "seek: position_s", hi=MAX_SEEK_S)
    elif command == "window":
        args = _fields({"ms": None, **header}, _WINDOW, "control", "window: ")
        if "events" not in args:
            raise ProtocolError("control", "window: events must be given (an integer)")
    elif command == "record_start" and header.get("name") is not None:
        name = header["name"]
        if not isinstance(name, str) or not 0 < len(name) <= MAX_TEXT or "/" in name or "\\" in name or "\x00" in name:
            raise ProtocolError(
                "control", f"record_start name must be a non-empty string without '/', got {_short(name)}"
            )
        args["name"] = name
    elif command == "capture":
        label = header.get("label")
        if (
            not isinstance(label, str)
            or not 0 < len(label) <= MAX_LABEL
            or not label.strip()
            or not label.isprintable()
        ):
            raise ProtocolError(
                "control",
                f"capture: label must be a class name of 1 to {MAX_LABEL} printable characters, got {_short(label)}",
            )
        args["label"] = label.strip()
        if header.get("frame") is not None:
            args["frame"] = _count(header["frame"], "control", "capture: frame")
    elif command == "train" and header.get("epochs") is not None:
        args["epochs"] = _int(header["epochs"], "control", "train: epochs", 1, MAX_TRAIN_EPOCHS)
    return command, args


# ------------------------------------------------------------------------------------------ sequence numbers


# What the viewer draws, in drawing order: each topic's content check (the server -> viewer messages).
VIEW_DECODERS: dict[str, Callable[[Message], Any]] = {
    "sensor": decode_sensor,
    "hist": decode_hist,
    "tokens": decode_tokens,
    "pred": decode_pred,
    "stats": decode_stats,
}


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
