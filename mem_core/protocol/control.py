"""Control requests (viewer -> server, REQ/REP): the commands, their arguments' schemas, ``encode_control`` and
``decode_control``. A reply is a ``control`` message with ``ok``, ``error`` and ``state`` (``state.decode_reply``)."""

from __future__ import annotations

from typing import Annotated, Any, Required

from pydantic import AfterValidator
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.fields import Speed, TrainEpochs, WindowEvents, WindowMs
from mem_core.limits import MAX_LABEL, MAX_SEEK_S
from mem_core.protocol.framing import Message, ProtocolError, encode, expect_topic
from mem_core.protocol.values import between
from mem_core.schema import ClassName, Count, LabelNames, SchemaError, Text, check, short

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
    position_s: between(0.0, MAX_SEEK_S)


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
    expect_topic(message, "control")
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
