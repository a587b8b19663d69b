"""The library's user-facing error types, gathered so the CLI can show them as one clear line."""

from __future__ import annotations

from mem_core.configuration import ConfigError
from mem_core.corpus import CorpusError
from mem_core.datasets import DatasetError
from mem_core.io import EventFileError
from mem_core.train.engine import NonFiniteLossError
from mem_core.train.rundir import RunError

USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    CorpusError,
    DatasetError,
    EventFileError,
    NonFiniteLossError,
    RunError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
)
