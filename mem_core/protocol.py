"""The live wire format: multipart ``[topic, JSON header, buffer...]`` messages, no sockets here and no pickle.

The header is a UTF-8 JSON object with at least::

    {"version": 1, "topic": "hist", "seq": 12, "t_sent": 1732147200.123,
     "buffers": [{"name": "hist", "dtype": "<f4", "shape": [2, 224, 224]}], ...topic fields...}

and one raw frame follows per ``buffers`` entry, in order, holding exactly ``prod(shape) * itemsize`` bytes of a
C-contiguous array. Only plain little-endian numeric dtypes are allowed (bool, ints, uints, floats). Topics:
``events`` (columns t, x, y, p of an event batch), ``sensor``, ``hist``, ``tokens``, ``pred``, ``stats``, ``control``
(see docs/protocol.md).

Receivers never trust a message: ``decode`` checks the envelope, and ``decode_<topic>`` checks what a topic holds
(types, ranges, sizes against ``mem_core/limits.py``) before anything is allocated or drawn. Header fields are
checked against the schemas below (``mem_core.schema``: pydantic, strict; measured faster than the hand-written
checks it replaced: 15 against 70 us for a two-class ``pred``); the JSON parse (depth, NaN) and the arrays are
checked by hand. Every malformed message raises ``ProtocolError`` naming its kind; receivers drop and count such
messages.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Required

import numpy as np
from pydantic import AfterValidator, BeforeValidator, Field, StrictInt, StrictStr
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.errors import MemError
from mem_core.events import EVENT_DTYPE, SensorSize, validate_events
from mem_core.fields import Speed, TrainEpochs, WindowEvents, WindowMs
from mem_core.limits import (
    MAX_BUFFERS,
    MAX_CLASS_NAME,
    MAX_CLASSES,
    MAX_ELEMENTS,
    MAX_HEADER_BYTES,
    MAX_IMAGE_SIDE,
    MAX_IPC_PATH,
    MAX_JSON_DEPTH,
    MAX_LABEL,
    MAX_NDIM,
    MAX_NUM_TOKENS,
    MAX_SEEK_S,
    MAX_SENSOR_SIDE,
    MAX_SEQ,
    MAX_SPEED,
    MAX_TEXT,
    MAX_TRAIN_EPOCHS,
)
from mem_core.schema import (
    ClassName,
    ClassNames,
    Count,
    Flag,
    LabelNames,
    NonNegative,
    SchemaError,
    Text,
    check,
    short,
)

PROTOCOL_VERSION = 1
TOPICS = ("events", "sensor", "hist", "tokens", "pred", "stats", "control")
__all__ = [  # the limits a receiver holds a message to live in mem_core/limits.py; these names stay importable here
    "MAX_BUFFERS",
    "MAX_CLASS_NAME",
    "MAX_ELEMENTS",
    "MAX_IPC_PATH",
    "MAX_JSON_DEPTH",
    "MAX_LABEL",
    "MAX_NDIM",
    "MAX_SEEK_S",
    "MAX_SEQ",
    "MAX_SPEED",
    "MAX_TRAIN_EPOCHS",
]

_DTYPES = {  # accepted dtype strings: NumPy's ``dtype.str`` (what ``encode`` writes) and ``dtype.name``
    name: dtype
    for dtype in map(np.dtype, ("|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"))
    for name in (dtype.str, dtype.name)
}


def _between(lo: float, hi: float, lo_open: bool = False) -> Any:
    """A finite number in [lo, hi] (or (lo, hi])."""
    return Annotated[
        float, Field(gt=lo, le=hi, allow_inf_nan=False) if lo_open else Field(ge=lo, le=hi, allow_inf_nan=False)
    ]


def _ints(lo: int, hi: int) -> Any:
    return Annotated[StrictInt, Field(ge=lo, le=hi)]


Side = _ints(0, MAX_SENSOR_SIDE)
ImageSide = _ints(1, MAX_IMAGE_SIDE)


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
    seq: _ints(0, MAX_SEQ)
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
    if _deeper_than(header, MAX_JSON_DEPTH):
        raise ProtocolError(topic, f"header nests deeper than {MAX_JSON_DEPTH} levels")
    _checked(_Envelope, header, topic)
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


# ------------------------------------------------------------------------------------------------ field checks


def _checked(schema: Any, value: Any, kind: str, where: str = "") -> Any:
    """``value`` checked against ``schema``; a ``ProtocolError`` of ``kind`` naming the field otherwise."""
    try:
        return check(schema, value)
    except SchemaError as exc:
        raise ProtocolError(kind, f"{where}{exc}") from None


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


class _EventsHeader(TypedDict):
    height: _ints(1, MAX_SENSOR_SIDE)
    width: _ints(1, MAX_SENSOR_SIDE)


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
    header = _checked(_EventsHeader, message.header, "events")
    sensor = SensorSize(header["height"], header["width"])
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


def _sized(item: Any, n: int) -> Any:
    """A JSON list of exactly ``n`` values of ``item``."""
    return Annotated[list[item], Field(min_length=n, max_length=n)]


class _SensorHeader(TypedDict, total=False):
    sensor: Required[_sized(Side, 2)]  # a side of 0 fails the shape check
    binning: Required[_ints(1, MAX_SENSOR_SIDE)]
    input_region: _sized(_between(-MAX_SENSOR_SIDE, MAX_SENSOR_SIDE), 4)
    frame: Count | None


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
    header = _checked(_SensorHeader, message.header, "sensor")
    size, binning = header["sensor"], header["binning"]
    expected = tuple(-(-side // binning) for side in size)  # ceil
    if image.shape[1:] != expected:
        raise ProtocolError(
            "sensor", f"a {size[0]} x {size[1]} sensor binned by {binning} is {expected}, got {image.shape[1:]}"
        )
    region = header.get("input_region", [0.0, 0.0, *map(float, expected)])
    top, left, height, width = region
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
        raise ProtocolError("sensor", f"input_region {short(region)} is not a region of the {expected} image")
    if not np.isfinite(image).all():
        raise ProtocolError("sensor", "sensor holds NaN or infinite values")
    return SensorView(image, (size[0], size[1]), binning, (top, left, height, width), header.get("frame"))


class _TokensHeader(TypedDict):
    num_tokens: _ints(1, MAX_NUM_TOKENS)


def decode_tokens(message: Message) -> tuple[np.ndarray, int]:
    """The (h, w) token ids and the codebook size ``num_tokens`` of a ``tokens`` message (ids < num_tokens)."""
    _expect_topic(message, "tokens")
    tokens = _array(message, "tokens", "iu", 2)
    _image_sides(message, "token grid", tokens.shape)
    num_tokens = _checked(_TokensHeader, message.header, "tokens")["num_tokens"]
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


class _TopK(TypedDict):
    id: _ints(0, MAX_CLASSES - 1)
    name: ClassName
    prob: _between(0.0, 1.0)


class _PredHeader(TypedDict, total=False):
    task: Required[Literal["classification", "segmentation"]]
    classes: Required[ClassNames]
    top_k: Annotated[list[_TopK], Field(max_length=MAX_CLASSES)]
    model_version: Count | None  # which model of the server made it (it counts the models it served)
    frame: Count | None  # the window's id (a ``capture`` names it)


def decode_pred(message: Message) -> Prediction:
    """The checked prediction of a ``pred`` message (docs/protocol.md)."""
    _expect_topic(message, "pred")
    header = _checked(_PredHeader, message.header, "pred")
    task, classes = header["task"], header["classes"]
    ids = {key: header[key] for key in ("model_version", "frame") if key in header}
    if task == "segmentation":
        mask = _array(message, "mask", "u", 2)
        _image_sides(message, "mask", mask.shape)
        if mask.max() >= len(classes):  # a bigger id would ask the viewer for a colour per id up to it
            raise ProtocolError("pred", f"mask holds class id {mask.max()}, only {len(classes)} classes")
        return Prediction(task, classes, mask=mask, **ids)
    probs = _array(message, "probs", "f", 1)
    if len(probs) != len(classes) or not ((probs >= 0) & (probs <= 1)).all():
        raise ProtocolError("pred", f"probs must be {len(classes)} values in [0, 1], got shape {probs.shape}")
    top_k = header.get("top_k", [])
    if len(top_k) > len(classes) or any(entry["id"] >= len(classes) for entry in top_k):
        raise ProtocolError("pred", f"top_k must be at most {len(classes)} entries with ids below that")
    return Prediction(task, classes, probs=probs, top_k=top_k, **ids)


def decode_stats(message: Message) -> dict[str, Any]:
    """The fields of a ``stats`` message that are present, each checked (unknown fields are left out)."""
    _expect_topic(message, "stats")
    return _checked(_Stats, message.header, "stats")


def decode_reply(message: Message) -> dict[str, Any]:
    """A control reply's ``command``, ``ok``, ``error`` and ``state`` (its known fields, checked)."""
    _expect_topic(message, "control")
    return _checked(_Reply, message.header, "control")


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


def _endpoint(value: str) -> str:
    problem = endpoint_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Endpoint = Annotated[Text, AfterValidator(_endpoint)]


def _at_most(n: int) -> Callable[[Any], Any]:
    """A check of a JSON object's size before its entries: pydantic would check (and report) every entry first."""

    def within(value: Any) -> Any:
        if isinstance(value, dict) and len(value) > n:
            raise ValueError(f"at most {n} entries, got {len(value)}")
        return value

    return within


class _Replay(TypedDict, total=False):
    playing: Flag
    speed: NonNegative
    position_s: NonNegative
    duration_s: NonNegative


class _Source(TypedDict, total=False):
    kind: Text
    model: Text
    serial: Text
    height: Side
    width: Side
    recordable: Flag
    replay: _Replay


class _Accumulation(TypedDict, total=False):
    events: WindowEvents
    ms: WindowMs | None
    default_events: WindowEvents
    default_ms: WindowMs | None


class _Recording(TypedDict, total=False):
    active: Flag
    root: Text
    name: Text | None
    events: Count
    error: Text | None


class _Labels(TypedDict, total=False):
    """The label-a-few loop: captures, training from them, and the model being served (docs/protocol.md)."""

    root: Text
    classes: LabelNames  # the names offered: a model's classes and those captured under other names
    counts: Annotated[dict[ClassName, Count], BeforeValidator(_at_most(MAX_CLASSES))]  # captures per class
    captures: Count  # captures taken since the server started (a client flashes when it grows)
    last: Text | None  # class of the newest capture of this session
    error: Text | None


class _Training(TypedDict, total=False):
    state: Text  # idle, running, exporting, done, failed
    epoch: Count
    epochs: Count
    val_top1: NonNegative | None
    run: Text | None
    message: Text | None


class _Model(TypedDict, total=False):
    name: Text
    version: Count
    path: Text
    error: Text | None


class _Latency(TypedDict, total=False):
    last: NonNegative
    p50: NonNegative
    p95: NonNegative


class _Stages(TypedDict, total=False):
    sensor: NonNegative
    preprocess: NonNegative
    model: NonNegative
    tokenizer: NonNegative
    publish: NonNegative


class _Settings(TypedDict, total=False):
    """What stats and control replies share."""

    session: Text
    task: Text
    commands: Count
    model_state: Text
    accumulation: _Accumulation
    source: _Source
    recording: _Recording | None
    labels: _Labels
    training: _Training
    model: _Model | None


class _Stats(_Settings, total=False):
    events_per_s: NonNegative
    predictions_per_s: NonNegative
    predictions: Count
    window_events: Count
    window_ms: NonNegative
    latency_ms: _Latency
    stages_ms: _Stages
    skipped_windows: Count
    malformed: Count
    control: Endpoint


class _State(_Settings, total=False):
    classes: ClassNames
    token_grid: _sized(ImageSide, 2) | None


class _Reply(TypedDict, total=False):
    command: Text
    ok: Required[Flag]
    error: Text | None
    state: _State | None


# ---------------------------------------------------------------------------------------------------- control

CONTROL_COMMANDS = (
    "state",
    "play",
    "pause",
    "speed",
    "seek",
    "step",
    "window",
    "record_start",
    "record_stop",
    "capture",
    "undo_capture",
    "train",
)


def _recording_name(name: str) -> str:
    if not name or "/" in name or "\\" in name or "\x00" in name:
        raise ValueError("must be a non-empty name without '/'")
    return name


class _Speed(TypedDict):
    value: Speed


class _Seek(TypedDict):
    position_s: _between(0.0, MAX_SEEK_S)


class _Window(TypedDict, total=False):
    events: Required[WindowEvents]
    ms: WindowMs | None


class _RecordStart(TypedDict, total=False):
    name: Annotated[Text, AfterValidator(_recording_name)] | None


class _Capture(TypedDict, total=False):
    label: Required[Annotated[ClassName, AfterValidator(str.strip)]]
    frame: Count | None


class _Train(TypedDict, total=False):
    epochs: TrainEpochs | None
    classes: LabelNames | None  # the classes the client offers: each needs its captures before a run starts


_ARGUMENTS: dict[str, Any] = {  # the arguments of the commands that take any
    "speed": _Speed,
    "seek": _Seek,
    "window": _Window,
    "record_start": _RecordStart,
    "capture": _Capture,
    "train": _Train,
}


def encode_control(seq: int, command: str, **args: Any) -> list[bytes]:
    """A ``control`` request (or, with ``ok``/``error``/``state`` fields, a reply); see docs/protocol.md."""
    return encode("control", seq, command=command, **args)


def decode_control(message: Message) -> tuple[str, dict[str, Any]]:
    """The command and its checked arguments of a ``control`` request; ``ProtocolError`` names what is wrong.

    ``speed`` needs ``value`` in [0, MAX_SPEED] (``fields.Speed``: 0 as fast as possible); ``seek`` needs
    ``position_s`` in [0, MAX_SEEK_S] (seconds from the start of the file); ``window`` needs ``events``
    (``fields.WindowEvents``) and takes ``ms`` (``fields.WindowMs``) or null, 0 or null meaning no time limit (the
    reply has null); ``record_start`` takes an optional ``name``; ``capture`` needs a
    class name ``label`` (1 to MAX_LABEL printable characters, not only spaces) and takes the ``frame`` id of the
    window to capture (default: the newest); ``train`` takes ``epochs`` in [1, MAX_TRAIN_EPOCHS] and the ``classes``
    the client offers for labelling (class names, in their NFC spelling as every class name); the other commands
    take no arguments. Arguments given as null are left out, except the window's ``ms`` (null: no time limit).
    """
    _expect_topic(message, "control")
    header = message.header
    command = header.get("command")
    if not isinstance(command, str) or command not in CONTROL_COMMANDS:
        raise ProtocolError("control", f"unknown control command {short(command)}; expected one of {CONTROL_COMMANDS}")
    schema = _ARGUMENTS.get(command)
    if schema is None:
        return command, {}
    try:
        args = check(schema, header)
    except SchemaError as exc:
        reason = str(exc)
        if exc.where == "label":  # the viewer shows this to whoever typed the name
            reason = (
                f"label must be a class name of 1 to {MAX_LABEL} printable characters, got {short(header.get('label'))}"
            )
        raise ProtocolError("control", f"{command}: {reason}") from None
    if command == "window":
        args["ms"] = args.get("ms") or None  # 0: no time limit, as `mem serve --window-ms 0` says
    return command, {key: value for key, value in args.items() if value is not None or key == "ms"}


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
