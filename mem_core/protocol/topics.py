"""What a topic's message holds, checked before anything is drawn or stored: ``events`` (a batch of the event
columns and its sensor) and what the viewer draws, ``sensor``, ``hist``, ``tokens`` and ``pred`` (``stats`` is in
``state``). Each ``decode_<topic>`` raises ``ProtocolError`` naming the topic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Required

import numpy as np
from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.events import EVENT_DTYPE, SensorSize, validate_events
from mem_core.limits import MAX_CLASSES, MAX_IMAGE_SIDE, MAX_NUM_TOKENS, MAX_SENSOR_SIDE
from mem_core.protocol.framing import Message, ProtocolError, checked, encode, expect_topic
from mem_core.protocol.state import decode_stats
from mem_core.protocol.values import Side, between, ints, sized
from mem_core.schema import ClassName, ClassNames, Count, short


def _array(message: Message, name: str, kinds: str, ndim: int) -> np.ndarray:
    array = message.arrays.get(name)
    if array is None or array.dtype.kind not in kinds or array.ndim != ndim:
        got = "none" if array is None else f"{array.dtype.str} {array.shape}"
        raise ProtocolError(message.topic, f"buffer {name!r} must be a {ndim}-D array of kind {kinds!r}, got {got}")
    return array


def _image_sides(message: Message, name: str, shape: tuple[int, ...]) -> None:
    if not all(1 <= side <= MAX_IMAGE_SIDE for side in shape):
        raise ProtocolError(message.topic, f"{name} of shape {shape}: each side must be in [1, {MAX_IMAGE_SIDE}]")


# ------------------------------------------------------------------------------------------------------ events


class _EventsHeader(TypedDict):
    height: ints(1, MAX_SENSOR_SIDE)
    width: ints(1, MAX_SENSOR_SIDE)


def encode_events(seq: int, events: np.ndarray, sensor: SensorSize, **fields: Any) -> list[bytes]:
    """An ``events`` message: the batch as four columns plus the sensor size."""
    arrays = {name: events[name] for name in EVENT_DTYPE.names}
    return encode("events", seq, arrays, height=int(sensor.height), width=int(sensor.width), **fields)


def decode_events(message: Message) -> tuple[np.ndarray, SensorSize]:
    """The event batch and sensor of an ``events`` message, checked: columns of one length whose dtypes convert
    without loss, a sensor of at most ``MAX_SENSOR_SIDE`` per side, events sorted, binary and on the sensor."""
    expect_topic(message, "events")
    if any(name not in message.arrays for name in EVENT_DTYPE.names):
        raise ProtocolError("events", "needs buffers t, x, y, p and header fields height, width")
    columns = [message.arrays[name] for name in EVENT_DTYPE.names]
    for name, column in zip(EVENT_DTYPE.names, columns, strict=True):
        if not np.can_cast(column.dtype, EVENT_DTYPE[name], "safe"):
            raise ProtocolError("events", f"column {name!r} of {column.dtype.str} does not fit {EVENT_DTYPE[name].str}")
    n = len(columns[0]) if columns[0].ndim == 1 else -1
    if any(c.ndim != 1 or len(c) != n for c in columns):
        raise ProtocolError("events", "columns differ in length or are not 1-D")
    header = checked(_EventsHeader, message.header, "events")
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
    expect_topic(message, "hist")
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


class _SensorHeader(TypedDict, total=False):
    sensor: Required[sized(Side, 2)]  # a side of 0 fails the shape check
    binning: Required[ints(1, MAX_SENSOR_SIDE)]
    input_region: sized(between(-MAX_SENSOR_SIDE, MAX_SENSOR_SIDE), 4)
    frame: Count | None


def decode_sensor(message: Message) -> SensorView:
    """The checked view of a ``sensor`` message: a finite float16/32 (2, h, w) image whose sides follow from the
    header's ``sensor`` and ``binning``, and an ``input_region`` inside it (default: the whole image) or inside the
    square of its longer side centred on it (the extent crop of a wide object, ``InputSpec.crop``)."""
    expect_topic(message, "sensor")
    image = _array(message, "sensor", "f", 3)
    if image.dtype.itemsize > 4 or image.shape[0] != 2:
        raise ProtocolError(
            "sensor", f"sensor must be float16/32 of shape (2, h, w), got {image.dtype.str} {image.shape}"
        )
    _image_sides(message, "sensor", image.shape[1:])
    header = checked(_SensorHeader, message.header, "sensor")
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
    num_tokens: ints(1, MAX_NUM_TOKENS)


def decode_tokens(message: Message) -> tuple[np.ndarray, int]:
    """The (h, w) token ids and the codebook size ``num_tokens`` of a ``tokens`` message (ids < num_tokens)."""
    expect_topic(message, "tokens")
    tokens = _array(message, "tokens", "iu", 2)
    _image_sides(message, "token grid", tokens.shape)
    num_tokens = checked(_TokensHeader, message.header, "tokens")["num_tokens"]
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
    id: ints(0, MAX_CLASSES - 1)
    name: ClassName
    prob: between(0.0, 1.0)


class _PredHeader(TypedDict, total=False):
    task: Required[Literal["classification", "segmentation"]]
    classes: Required[ClassNames]
    top_k: Annotated[list[_TopK], Field(max_length=MAX_CLASSES)]
    model_version: Count | None  # which model of the server made it (it counts the models it served)
    frame: Count | None  # the window's id (a ``capture`` names it)


def decode_pred(message: Message) -> Prediction:
    """The checked prediction of a ``pred`` message (docs/protocol.md)."""
    expect_topic(message, "pred")
    header = checked(_PredHeader, message.header, "pred")
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


# What the viewer draws, in drawing order: each topic's content check (the server -> viewer messages).
VIEW_DECODERS: dict[str, Callable[[Message], Any]] = {
    "sensor": decode_sensor,
    "hist": decode_hist,
    "tokens": decode_tokens,
    "pred": decode_pred,
    "stats": decode_stats,
}
