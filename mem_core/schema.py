"""Structured input checked against a declared schema: the one way MEM validates JSON and TOML values.

A schema is a type (a ``TypedDict``, a dataclass field's annotation, ``Annotated`` with bounds) checked by pydantic in
strict mode, so a value is taken only as the type it already has (``"3"`` is no integer, ``true`` no number). The
types shared by several boundaries, class names above all, are declared here once from ``mem_core.limits``. Each
boundary turns a ``SchemaError`` into its own one-line error. Hand-written checks remain where a schema has nothing to
say: the parse of a wire header (nesting, NaN) and numpy arrays (``mem_core/protocol/``).
"""

from __future__ import annotations

import functools
import json
import unicodedata
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

from mem_core.errors import short
from mem_core.fields import AT_LEAST_0, Range
from mem_core.limits import MAX_CLASS_NAME, MAX_CLASSES, MAX_LABEL_NAMES, MAX_TEXT


def _nfc(name: Any) -> Any:
    # one spelling per name, before its length is counted: "é" typed as one character and as "e" + a combining
    # accent look the same and must be one class
    return unicodedata.normalize("NFC", name) if isinstance(name, str) else name


def _printable(name: str) -> str:
    if not name.isprintable() or not name.strip():  # control characters would reach a header escaped, 6 bytes each
        raise ValueError("a class name must be printable and not only spaces")
    return name


Text = Annotated[StrictStr, Field(max_length=MAX_TEXT)]
# ``fields.Count`` and ``fields.NonNegative`` as JSON carries them: an integer that is no bool or float (and fits
# int64), a finite number
Count = Annotated[StrictInt, Range(0, (1 << 63) - 1)]
NonNegative = Annotated[float, AT_LEAST_0]
Flag = StrictBool
ClassName = Annotated[
    Annotated[StrictStr, Field(min_length=1, max_length=MAX_CLASS_NAME)],
    BeforeValidator(_nfc),
    AfterValidator(_printable),
]
ClassNames = Annotated[list[ClassName], Field(min_length=1, max_length=MAX_CLASSES)]
LabelNames = Annotated[list[ClassName], Field(max_length=MAX_LABEL_NAMES)]


class SchemaError(ValueError):
    """A value that does not fit its schema: ``where`` is the dotted path to the first wrong part, ``reason`` why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.where = where
        self.reason = reason


@functools.cache
def adapter(schema: Any) -> TypeAdapter:
    """The (cached) validator of a schema type."""
    return TypeAdapter(schema)


def check(schema: Any, value: Any) -> Any:
    """``value`` validated against ``schema`` (strict; JSON objects become dicts, arrays lists); ``SchemaError``."""
    try:
        return adapter(schema).validate_python(value, strict=True)
    except ValidationError as exc:
        raise _first(exc) from None


def check_json_value(schema: Any, value: Any) -> Any:
    """``value`` (as TOML or JSON give it: lists where ``schema`` may say tuple) validated against ``schema``."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):  # a TOML date or time: no config field takes one
        raise SchemaError("", f"expected a number, a string, true or false or a list, got {short(value)}") from None
    try:
        return adapter(schema).validate_json(text, strict=True)
    except ValidationError as exc:
        raise _first(exc) from None


def class_name(name: Any) -> str:
    """``name`` as a class name, in its one Unicode spelling (NFC); ``SchemaError`` when it cannot be one."""
    return check(ClassName, name)


def class_names(names: Any) -> list[str]:
    """``names`` as a model's or a labels corpus's classes, each in its one Unicode spelling (NFC): 1 to
    ``MAX_CLASSES`` distinct printable names of at most ``MAX_CLASS_NAME`` characters (what the live wire carries);
    ``SchemaError`` (where ``classes.K``) otherwise."""
    try:
        checked = check(ClassNames, names)
    except SchemaError as exc:
        raise SchemaError(f"classes{'.' if exc.where else ''}{exc.where}", exc.reason) from None
    seen: set[str] = set()
    for k, name in enumerate(checked):
        if name in seen:
            alike = " (the same name in two Unicode spellings)" if names[k] not in names[:k] else ""
            raise SchemaError("classes", f"names must be distinct, {short(name)} is there twice{alike}")
        seen.add(name)
    return checked


def class_names_problem(names: Any) -> str | None:
    """Why ``names`` cannot be classes (``class_names``), or None."""
    try:
        class_names(names)
    except SchemaError as exc:
        return str(exc)
    return None


_PHRASES = {  # pydantic's error types in the words MEM's errors use
    "int_type": "expected an integer",
    "bool_type": "expected true or false",
    "float_type": "expected a number",
    "finite_number": "expected a finite number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "dataclass_type": "expected an object",
    "missing": "missing",
}


def _first(exc: ValidationError) -> SchemaError:
    """The first error of ``exc`` as a ``SchemaError``: the path, and the reason with the value it refused."""
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"] if part != "[key]"]
    if error["type"] == "missing" and loc and loc[-1].isdigit():  # a fixed-length tuple given too few values
        return SchemaError(".".join(loc[:-1]), "too few values")
    if error["type"] == "too_long" and "max_length" in error.get("ctx", {}):  # a list or tuple given too many
        return SchemaError(".".join(loc), f"at most {error['ctx']['max_length']} values, got {short(error['input'])}")
    reason = _PHRASES.get(error["type"])
    if reason is None:
        reason = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        reason = reason[0].lower() + reason[1:]
    if error["type"] != "missing":
        reason += f", got {short(error['input'])}"
    return SchemaError(".".join(loc), reason)
