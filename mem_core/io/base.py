"""What every reader returns and raises, and the checks they share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numba
import numpy as np

from mem_core.errors import MemError
from mem_core.events import SensorSize
from mem_core.files import open_regular, os_problem


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
    """The whole regular file, with OS errors turned into ``EventFileError``."""
    try:
        with open_regular(path) as f:
            return f.read()
    except OSError as e:
        raise EventFileError(path, os_problem(e)) from None


# How far back in time an event may come after the one before it in a file without a checksum (.dat, .bin, .raw):
# cameras reorder events by a few microseconds at most, while random bytes step back by seconds within a few events.
MAX_DISORDER_US = 1000


@numba.njit(cache=True, nogil=True)
def _largest_step_back(t):
    """(index i of the largest backward step t[i-1] -> t[i], its size in us), (0, 0) when ``t`` never goes back."""
    worst, at = 0, 0
    for i in range(1, t.size):
        back = t[i - 1] - t[i]
        if back > worst:
            worst, at = back, i
    return at, worst


def sort_plausible(path: Path, events: np.ndarray) -> np.ndarray:
    """``events`` sorted by ``t``; ``EventFileError`` when the file order steps back by more than ``MAX_DISORDER_US``.

    For formats whose bytes carry no checksum: random data decodes to times that jump back and forth.
    """
    at, back = _largest_step_back(events["t"])
    if back > MAX_DISORDER_US:
        t = events["t"]
        raise EventFileError(
            path,
            f"corrupt: time steps back by {back} us at event {at} (t={t[at - 1]} -> {t[at]}), more than the "
            f"{MAX_DISORDER_US} us a camera reorders events",
        )
    return sort_by_time(events) if back else events


def sort_by_time(events: np.ndarray) -> np.ndarray:
    """``events`` unchanged when already sorted by ``t``, else stably sorted (same-time events keep file order)."""
    if events.size > 1 and np.any(events["t"][1:] < events["t"][:-1]):
        return events[np.argsort(events["t"], kind="stable")]
    return events


def check_column(path: Path, what: str, column: np.ndarray, lo: int, hi: int, shift: int = 0) -> None:
    """``EventFileError`` unless every value of the integer ``column`` plus ``shift`` lies in ``[lo, hi]``, compared
    exactly (as Python ints): a value the event dtype cannot hold is a corrupt file, never wrapped around."""
    if column.size == 0:
        return
    low, high = int(column.min()) + shift, int(column.max()) + shift
    if low < lo or high > hi:
        raise EventFileError(path, f"corrupt: {what} spans {low}..{high}, outside [{lo}, {hi}]")


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
