"""Config fields declared once: a field's bounds and its help are ``Annotated`` metadata on the field itself.

A ``Range`` on a field bounds its value (or each value of a tuple; None is always allowed where the type allows it).
Three readers meet the same declaration:

- the config: its ``__post_init__`` calls ``check_fields``, so direct construction, a TOML file, ``--set``, a
  command's options and a corpus's metadata are all held to it, and a value outside is a ``FieldError`` naming the
  key (``merge`` prefixes the path of a nested config: ``input.n_max``);
- the wire: pydantic reads a ``Range`` as a constraint (``__get_pydantic_core_schema__``), so a control message
  takes what ``mem serve``'s options take;
- the command line: ``app/cli/options.py`` makes a field with a ``Help`` an option, its default the field's.

A subclass that restates a field's default keeps the bounds its base class declared (``check_fields`` reads every
class of the MRO), so no bound is dropped by restating ``lr: float = 2e-4``. ``__post_init__`` is left with the rules
between fields, which raise ``ConfigConflict``.

The values that cross boundaries have one type here: ``Speed``, ``WindowEvents``, ``WindowMs``, ``TrainEpochs`` and a
model's sizes (``Side``, ``Channels``, ``Width``).
Light to import on purpose: ``mem --help`` reads these fields, and pydantic (0.3 s to import) is imported only when
the wire builds a schema.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import re
import typing
from typing import Annotated, Any

from mem_core.errors import ConfigError, short
from mem_core.limits import (
    MAX_CHANNELS,
    MAX_INPUT_SIDE,
    MAX_SPEED,
    MAX_TRAIN_EPOCHS,
    MAX_WIDTH,
    MAX_WINDOW_EVENTS,
    MAX_WINDOW_MS,
)


class FieldError(ConfigError):
    """A field's value outside its bounds: ``key`` is the field's dotted path, ``reason`` what it must be."""

    def __init__(self, key: str, reason: str, value: Any) -> None:
        super().__init__(f"{key} {reason}, got {short(value)}")
        self.key, self.reason, self.value = key, reason, value

    def under(self, prefix: str) -> FieldError:
        """The same error for the field as a part of the config at ``prefix`` (``input.``)."""
        return FieldError(prefix + self.key, self.reason, self.value)


class ConfigConflict(ConfigError):
    """Fields that do not fit together (``resize_to`` smaller than ``size``): ``--set`` waits until all its
    overrides are in before it reports one."""


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a field may hold: ``lo``/``hi`` (None: unbounded), each end closed unless ``*_open``; never NaN
    or infinite."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, x: Any) -> bool:
        if not isinstance(x, numbers.Real) or (not isinstance(x, numbers.Integral) and not math.isfinite(x)):
            return False  # (an integer is finite, however large: math.isfinite would overflow on it)
        above = self.lo is None or (x > self.lo if self.lo_open else x >= self.lo)
        below = self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)
        return above and below

    def __str__(self) -> str:
        if self.hi is None:
            return f"a number {'>' if self.lo_open else '>='} {_number(self.lo)}" if self.lo is not None else "finite"
        left = ("(" if self.lo_open else "[") + ("-inf" if self.lo is None else _number(self.lo))
        return f"in {left}, {_number(self.hi)}{')' if self.hi_open else ']'}"

    def holds(self, value: Any) -> bool:
        """Whether ``value`` (a number, a tuple or list of numbers, or None) lies in the range."""
        values = value if isinstance(value, tuple | list) else (value,)
        return all(v is None or v in self for v in values)

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema  # the wire's validator only: configs check without pydantic

        def within(value: Any) -> Any:
            if not self.holds(value):
                raise ValueError(f"must be {self}")
            return value

        return core_schema.no_info_after_validator_function(within, handler(source))


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclasses.dataclass(frozen=True)
class Help:
    """A field that is a command option: its help, and its flag where it is not ``--<field-name>``
    (``--duration`` for ``duration_s``; ``--loop/--no-loop`` for a flag with its negation)."""

    text: str
    flag: str | None = None


AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, lo_open=True)
PROBABILITY = Range(0, 1)
FRACTION = Range(0, 1, hi_open=True)  # a share that must leave something: betas, dropout, label smoothing
SHARE = Range(0, 1, lo_open=True)  # a share that must keep something: a label fraction, a decay factor

# The kinds of number a config field holds, one name each (a field adds its own bounds where it has them).
Count = Annotated[int, AT_LEAST_0]  # a number of things: 0 allowed (0 often means "none" or "all")
PositiveCount = Annotated[int, AT_LEAST_1]  # a number of things, at least one
NonNegative = Annotated[float, AT_LEAST_0]  # a quantity: a rate, a time, a weight; 0 allowed
PositiveReal = Annotated[float, POSITIVE]  # a quantity above 0

# ------------------------------------------------------------------------- values that cross boundaries

# Replay and simulator pacing, x real time; 0: as fast as possible (`mem serve`/`mem record --speed`, the `speed`
# control command, recorders.base.Pacer).
Speed = Annotated[float, Range(0, MAX_SPEED)]
# Events of a live window (`mem serve --window-events`, the `window` command, a model's input.n_max).
WindowEvents = Annotated[int, Range(1, MAX_WINDOW_EVENTS)]
# The window every model input, live server and viewer starts from where nothing says otherwise: the paper's n_max.
DEFAULT_WINDOW_EVENTS = 30_000
# The time span a live window may cover, in ms; 0: no time limit (`mem serve --window-ms`, the `window` command).
WindowMs = Annotated[float, Range(0, MAX_WINDOW_MS)]
# Epochs of a run on the viewer's labelled captures (`mem serve --train-epochs`, the `train` command,
# `mem train-labels --epochs`).
TrainEpochs = Annotated[int, Range(1, MAX_TRAIN_EPOCHS)]
# The sizes of a model and its input (``ViTConfig``, ``TokenizerConfig``, ``InputSpec``), checked by every training
# config and every export: px of the input or of a patch; input channels; a width (embedding, hidden, codebook,
# attention heads, a head's channels).
Side = Annotated[int, Range(1, MAX_INPUT_SIDE)]
Channels = Annotated[int, Range(1, MAX_CHANNELS)]
WIDTH = Range(1, MAX_WIDTH)
Width = Annotated[int, WIDTH]


# ------------------------------------------------------------------------------------------------ checks


_DEVICE = re.compile(r"(auto|cpu|cuda)(:\d{1,3})?")


def device_problem(name: object) -> str | None:
    """Why ``name`` names no device, or None: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    match = _DEVICE.fullmatch(name) if isinstance(name, str) else None
    if match is None or (match[2] and match[1] != "cuda"):
        return f"device {name!r} is none of auto, cpu, cuda, cuda:N"
    return None


def check_fields(config: Any) -> None:
    """Raise a ``FieldError`` naming the first field of the dataclass instance ``config`` whose value lies outside
    a ``Range`` declared on it (by its class or any base class)."""
    for name, ranges in _ranges(type(config)):
        value = getattr(config, name)
        for bound in ranges:
            if not bound.holds(value):
                raise FieldError(name, f"must be {bound}", value)


def check_value(key: str, value: Any, bound: Range | Any) -> Any:
    """``value`` if it lies in ``bound`` (a ``Range`` or a type annotated with ranges), else a ``FieldError``
    naming ``key``: for arguments that are no config field."""
    for rng in [bound] if isinstance(bound, Range) else list(_find(bound, Range)):
        if not rng.holds(value):
            raise FieldError(key, f"must be {rng}", value)
    return value


def help_of(cls: type, name: str) -> Help | None:
    """The ``Help`` declared on field ``name`` of ``cls``, or None when it is no command option."""
    return next(_find(_hints(cls)[name], Help), None)


@functools.cache
def _ranges(cls: type) -> tuple[tuple[str, tuple[Range, ...]], ...]:
    """Each field of ``cls`` with the ranges its class and base classes declare on it."""
    out = []
    for field in dataclasses.fields(cls):
        found: list[Range] = []
        for klass in cls.__mro__:
            if field.name in inspect.get_annotations(klass):  # its own annotations, not inherited ones
                found += [r for r in _find(_hints(klass)[field.name], Range) if r not in found]
        if found:
            out.append((field.name, tuple(found)))
    return tuple(out)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _find(tp: Any, kind: type) -> typing.Iterator[Any]:
    """The metadata of class ``kind`` anywhere in the annotation ``tp`` (``X | None``, ``tuple[X, X]``)."""
    for meta in getattr(tp, "__metadata__", ()):
        if isinstance(meta, kind):
            yield meta
    for arg in typing.get_args(tp):
        if not isinstance(arg, Range | Help):
            yield from _find(arg, kind)
