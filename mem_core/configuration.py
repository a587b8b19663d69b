"""Typed configs from dataclasses: TOML files, ``--set key=value`` overrides, checked against the dataclass.

A config is a (possibly nested) dataclass whose defaults are the only defaults there are. ``merge`` applies a
(nested or dotted) table of values, ``apply_overrides`` the ``--set`` strings of the command line; every key is
checked against the dataclass: an unknown key or a value of the wrong type (the field's annotation, checked by
``mem_core.schema``) is a ``ConfigError`` that names the key, and so is a value outside the bounds the field declares
(``mem_core.fields``: the dataclass checks them itself, however it is built).
Which tables of a preset apply to which training stage is ``mem_core.train.configs.stage_config``'s business.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

from mem_core.errors import ConfigError, short
from mem_core.fields import ConfigConflict, FieldError
from mem_core.limits import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, deeper_than

T = TypeVar("T")

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_toml(path: Path) -> dict[str, Any]:
    """The tables of the TOML file ``path``: a regular file of at most ``MAX_CONFIG_BYTES``, nested at most
    ``MAX_CONFIG_DEPTH`` deep; a ``ConfigError`` naming the file otherwise."""
    from mem_core.files import file_problem, read_bounded  # the event readers' checks: not for `mem --help`

    try:
        text = read_bounded(path, MAX_CONFIG_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {file_problem(exc)}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return _parse_toml(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _parse_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``, with every failure a ``ValueError`` that says what is wrong in words: a syntax error,
    nesting deeper than ``MAX_CONFIG_DEPTH`` (tomllib recurses: a RecursionError says nothing), an integer of more
    digits than Python converts; a dotted key of more than ``MAX_CONFIG_DEPTH`` parts is refused before parsing
    (tomllib takes quadratic time and memory in its parts: 44 s and 10.5 GB for 50,000)."""
    if _key_longer_than(text, MAX_CONFIG_DEPTH):
        raise ValueError(f"a key of more than {MAX_CONFIG_DEPTH} parts, no config has one")
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_CONFIG_DEPTH} levels") from None
    except ValueError:  # int() of a decimal integer beyond Python's limit, the only other error tomllib lets through
        raise ValueError(f"an integer of more than {sys.get_int_max_str_digits()} digits") from None
    if deeper_than(tables, MAX_CONFIG_DEPTH + 1):  # (the file's top table and MAX_CONFIG_DEPTH levels in it)
        raise ValueError(f"nested deeper than {MAX_CONFIG_DEPTH} levels")
    return tables


_KEY_TEXT = re.compile(r"[A-Za-z0-9_\-. \t]*")  # bare key parts, their dots and the blanks around them
_STRING = {  # a quoted text from its opening quote to its end (unterminated: to the end of its line, or the text)
    '"""': re.compile(r'"""(?:[^\\]|\\.)*?"""', re.DOTALL),
    "'''": re.compile(r"'''.*?'''", re.DOTALL),
    '"': re.compile(r'"(?:[^"\\\n]|\\.)*"?'),
    "'": re.compile(r"'[^'\n]*'?"),
}


def _key_longer_than(text: str, parts: int) -> bool:
    """Whether a dotted key (``a.b.c = 1``, ``[a."b".c]``) in the TOML ``text`` has more than ``parts`` parts, found
    in one pass: the dots between key parts, strings and comments skipped (a value has at most one dot, ``1.5``)."""
    dots = i = 0
    while True:
        end = _KEY_TEXT.match(text, i).end()
        dots += text.count(".", i, end)
        if dots >= parts:
            return True
        if end == len(text):
            return False
        i, c = end, text[end]
        if c in "\"'":  # a quoted key part, or a string value: no dot inside it counts
            quote = text[i : i + 3] if text[i : i + 3] in _STRING else c
            found = _STRING[quote].match(text, i)
            i = found.end() if found else len(text)
        elif c == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        else:  # anything else ends a key
            dots = 0
            i += 1


def load_preset(name: str) -> dict[str, Any]:
    path = PRESET_DIR / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; bundled presets: {', '.join(preset_names())}")
    return load_toml(path)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


# config keys under their former names -> their names now: refused in a setting, read in a run's stored config
RENAMED_KEYS = {"data.labels": "data.label_fraction"}


def _unknown_key(key: str, known: list[str], where: str) -> ConfigError:
    if (renamed := RENAMED_KEYS.get(f"{where}{key}")) is not None:
        return ConfigError(f"config key '{where}{key}' is now '{renamed}'")
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known keys: {', '.join(sorted(known))}"
    return ConfigError(f"unknown config key {where}{key!r}{hint}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (TOML values; strings from ``--set`` are parsed first)."""
    if dataclasses.is_dataclass(tp):  # a nested config: merged key by key, so an unknown key is named
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table of {tp.__name__} fields, got {short(value)}")
        return from_dict(tp, value, prefix=f"{key}.")
    from mem_core.schema import SchemaError, check_json_value  # pydantic takes 0.3 s to import: not for `mem --help`

    try:
        return check_json_value(tp, value)
    except SchemaError as exc:
        raise ConfigError(f"{key}{'.' if exc.where else ''}{exc.where}: {exc.reason}") from None


def _expand_dotted(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if rest:
            out.setdefault(head, {})
            if not isinstance(out[head], dict):
                raise ConfigError(f"config key {head!r} is a value, not a table (in {key!r})")
            out[head][rest] = value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return {k: _expand_dotted(v) if isinstance(v, dict) else v for k, v in out.items()}


def from_dict(cls: type[T], values: dict[str, Any], prefix: str = "") -> T:
    """Build ``cls`` from a (nested) dict, checking every key and type; missing keys keep their defaults."""
    return merge(cls(), values, prefix)


def merge(config: T, values: dict[str, Any], prefix: str = "") -> T:
    """A copy of ``config`` with ``values`` (nested or dotted keys) applied and type-checked."""
    types_ = _field_types(type(config))
    changes: dict[str, Any] = {}
    for key, value in _expand_dotted(values).items():
        if key not in types_:
            raise _unknown_key(key, list(types_), prefix)
        current = getattr(config, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            changes[key] = merge(current, value, f"{prefix}{key}.")
        else:
            changes[key] = _coerce(value, types_[key], f"{prefix}{key}")
    try:
        return dataclasses.replace(config, **changes)
    except FieldError as exc:  # the nested config's own check names its field; the path to it is known here
        raise exc.under(prefix) from None


def parse_override(text: str) -> tuple[str, Any, str]:
    """``key=value`` -> (key, value read as TOML, raw text); a value that is not TOML (a bare path) is a string."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    if key.count(".") >= MAX_CONFIG_DEPTH:
        raise ConfigError(f"--set {key[:40]}...: a key of more than {MAX_CONFIG_DEPTH} parts, no config has one")
    try:
        value = _parse_toml(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except ValueError as exc:
        raise ConfigError(f"--set {key}: {exc}") from None
    return key, value, raw


def to_dict(config: Any) -> dict[str, Any]:
    """A plain (JSON/TOML-serialisable) dict of a config: tuples become lists."""

    def plain(v: Any) -> Any:
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(config))


def _shown(text: str, limit: int = 80) -> str:
    """An override as an error shows it: whole up to ``limit`` characters (a 240 KB value is not repeated)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def apply_overrides(config: T, overrides: list[str] | tuple[str, ...]) -> T:
    """``config`` with ``--set key=value`` overrides applied in order (values read as TOML, else as strings).

    Settings that are only consistent together (``model.embed_dim`` with ``model.num_heads``) may come in any order:
    one that the dataclass rejects on its own waits until the others are in, and is checked then.
    """
    waiting: dict[str, tuple[Any, str]] = {}  # key -> (value, override text)
    for text in overrides:
        key, value, raw = parse_override(text)
        waiting.pop(key, None)
        try:
            config = merge(config, {key: value})
        except ConfigConflict:  # inconsistent with the other fields as they stand: maybe not once all are in
            waiting[key] = (value, text)
        except ConfigError:
            if raw == value:
                raise
            try:  # a string field given a word TOML reads otherwise (name=true, tag=1e3)
                config = merge(config, {key: raw})
            except ConfigError:
                raise ConfigError(f"--set {_shown(text)}: " + str(_override_error(config, key, value))) from None
    if waiting:
        try:
            config = merge(config, {key: value for key, (value, _) in waiting.items()})
        except ConfigError as exc:
            raise ConfigError(f"--set {', '.join(_shown(text) for _, text in waiting.values())}: {exc}") from None
    return config


def _override_error(config: Any, key: str, value: Any) -> ConfigError:
    try:
        merge(config, {key: value})
    except ConfigError as exc:
        return exc
    return ConfigError(f"{key}: bad value {short(value)}")
