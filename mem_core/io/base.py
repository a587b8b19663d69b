"""What every reader returns and raises, and the checks they share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mem_core.errors import MemError
from mem_core.events import SensorSize


class EventFile(NamedTuple):
    """A decoded recording: ``EVENT_DTYPE`` events sorted by ``t`` and the sensor they were recorded on."""

    events: np.ndarray
    sensor: SensorSize


class EventFileError(MemError):
    """A file that cannot be read as events: missing, empty, truncated, corrupt or of an unknown format.

    ``str(error)`` is ``"<path>: <reason>"``; ``.path`` and ``.reason`` hold the two parts.
    """

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        # args = (path, reason) keeps the error picklable across worker processes
        super().__init__(os.fspath(path), reason)
        self.path = os.fspath(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def read_bytes(path: Path) -> bytes:
    """The whole file, with OS errors turned into ``EventFileError``."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise EventFileError(path, f"cannot read the file ({e.strerror or e})") from e


def sort_by_time(events: np.ndarray) -> np.ndarray:
    """``events`` unchanged when already sorted by ``t``, else stably sorted (same-time events keep file order)."""
    if events.size > 1 and np.any(events["t"][1:] < events["t"][:-1]):
        return events[np.argsort(events["t"], kind="stable")]
    return events


def check_on_sensor(path: Path, events: np.ndarray, sensor: SensorSize, source: str) -> None:
    """Raise ``EventFileError`` when an event lies outside ``sensor`` (declared by ``source``): a corrupt file."""
    if events.size == 0:
        return
    x_max, y_max = int(events["x"].max()), int(events["y"].max())
    if x_max >= sensor.width or y_max >= sensor.height:
        raise EventFileError(
            path,
            f"corrupt: event at x<={x_max}, y<={y_max} outside the {sensor.width}x{sensor.height} "
            f"(width x height) sensor declared by {source}",
        )
