"""What every reader returns and raises, and the checks they share."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numba
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


class NotRegularFile(OSError):
    """A path that is (or links to) a FIFO, a device, a socket or a directory where a regular file is read.

    A FIFO blocks whoever opens it until a writer comes (``mem inspect`` hung on one), and a device such as
    ``/dev/zero`` never ends (a reader filled the memory): readers open regular files only.
    """

    def __init__(self, mode: int) -> None:
        kinds = (
            (stat.S_ISDIR, "a directory"),
            (stat.S_ISFIFO, "a FIFO"),
            (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"),
        )
        super().__init__(f"not a regular file ({next((k for test, k in kinds if test(mode)), 'of an unknown kind')})")


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` (symlinks resolved) opened for reading; ``NotRegularFile`` unless it is a regular file, other
    ``OSError``s as the system raises them. Opened without blocking and checked on the open descriptor, so a FIFO
    put in the file's place after a check cannot block the open either."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(mode)
    return os.fdopen(fd, "rb")


def check_regular(path: str | os.PathLike) -> None:
    """``open_regular``'s checks alone, for a library that opens the file by name itself (h5py)."""
    open_regular(path).close()


def os_problem(error: OSError) -> str:
    """An ``OSError`` met opening or reading a file, as a reason: missing, not a regular file, or what the OS said."""
    if isinstance(error, FileNotFoundError):
        return "no such file or directory"
    if isinstance(error, NotRegularFile):
        return str(error)
    return f"cannot read the file ({error.strerror or error})"


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
