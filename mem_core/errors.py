"""``MemError``: the base of every error the library raises for bad input, so the CLI can show it as one line.

Kept free of imports on purpose: the CLI catches ``MemError`` without loading torch or h5py.
"""

import reprlib
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxlong = 2, 4, 6, 60, 40


def short(value: Any, limit: int = 80) -> str:
    """``value`` shown in at most ``limit`` characters, without writing out all of a hostile one: an error stays one
    line whatever the input holds."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MemError(Exception):
    """A user-facing error: the message names the file or value and what is wrong."""


class ConfigError(MemError, ValueError):
    """A config key or value that does not fit the config's dataclass."""


class RunError(MemError, RuntimeError):
    """A run or export directory that cannot be used: missing, incomplete, malformed or from another stage."""


class MissingPackage(MemError, ImportError):
    """An optional package that reading some files needs (hdf5plugin, lz4, zstandard) is not installed; the message
    names the package and what needs it."""
