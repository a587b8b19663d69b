"""The server's state as ``stats`` messages and control replies carry it: the window, the source and its replay, the
recording, the label-a-few loop, the model. Every field is optional and checked when present (unknown ones are left
out), so a viewer takes a server that says more or less than it knows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Required

from pydantic import BeforeValidator
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.fields import Speed, TrainEpochs, WindowEvents, WindowMs
from mem_core.limits import MAX_CLASSES
from mem_core.protocol.framing import Message, checked, expect_topic
from mem_core.protocol.values import Endpoint, ImageSide, Side, sized
from mem_core.schema import ClassName, ClassNames, Count, Flag, LabelNames, NonNegative, Text


def _at_most(n: int) -> Callable[[Any], Any]:
    """A check of a JSON object's size before its entries: pydantic would check (and report) every entry first."""

    def within(value: Any) -> Any:
        if isinstance(value, dict) and len(value) > n:
            raise ValueError(f"at most {n} entries, got {len(value)}")
        return value

    return within


class _Replay(TypedDict, total=False):
    playing: Flag
    speed: Speed
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
    epochs: TrainEpochs
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
    token_grid: sized(ImageSide, 2) | None


class _Reply(TypedDict, total=False):
    command: Text
    ok: Required[Flag]
    error: Text | None
    state: _State | None


def decode_stats(message: Message) -> dict[str, Any]:
    """The fields of a ``stats`` message that are present, each checked (unknown fields are left out)."""
    expect_topic(message, "stats")
    return checked(_Stats, message.header, "stats")


def decode_reply(message: Message) -> dict[str, Any]:
    """A control reply's ``command``, ``ok``, ``error`` and ``state`` (its known fields, checked)."""
    expect_topic(message, "control")
    return checked(_Reply, message.header, "control")
