"""N-ImageNet ``.npz``: one structured array under the key ``event_data`` with fields ``x, y, t, p``.

Assumed units, as N-ImageNet's own loader uses them: ``t`` integer microseconds, ``p`` ON when > 0 (files hold
0/1, bool or -1/+1). Geometry is not stored: N-ImageNet's 640 x 480 (width x height) when the events fit,
else the smallest sensor that holds them.
"""

from __future__ import annotations

import math
import struct
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from mem_core.events import EVENT_DTYPE, MAX_ABS_TIME_US, SensorSize, infer_sensor
from mem_core.files import NotRegularFile, open_regular
from mem_core.io.base import EventFile, EventFileError, check_column, sort_by_time

NIMAGENET_SENSOR = SensorSize(480, 640)
KEY = "event_data"
FIELDS = ("x", "y", "t", "p")
FILE_DTYPE = np.dtype([("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "?")])
# What zipfile and numpy's npy parsing raise on a damaged archive (RuntimeError: an encrypted member;
# TokenError, SyntaxError: a damaged array header, which numpy parses as Python source).
_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    tokenize.TokenError,
    ValueError,
    EOFError,
    KeyError,
    RuntimeError,
    zipfile.BadZipFile,
    zlib.error,
    struct.error,
    NotImplementedError,
)
MAX_DEFLATE_RATIO = 1100  # deflate expands at most 1032:1
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_npz(path: Path) -> EventFile:
    """Decode an N-ImageNet ``.npz`` file."""
    try:
        with open_regular(path) as f, zipfile.ZipFile(f) as archive:
            data = _event_data(path, archive)
    except NotRegularFile as e:
        raise EventFileError(path, str(e)) from None
    except _DECODE_ERRORS as e:
        raise EventFileError(path, f"corrupt .npz archive ({type(e).__name__}: {e})") from e
    names = data.dtype.names or ()
    if data.ndim != 1 or not set(FIELDS) <= set(names) or any(data.dtype[f].shape for f in FIELDS):
        raise EventFileError(
            path,
            f"'{KEY}' must be a 1-D structured array with one value per field {FIELDS}, got dtype {data.dtype} "
            f"shape {data.shape}",
        )
    if not all(np.issubdtype(data[f].dtype, np.integer) or data[f].dtype == bool for f in FIELDS):
        kinds = {f: str(data[f].dtype) for f in FIELDS}
        raise EventFileError(path, f"'{KEY}' fields must be integers (t in microseconds), got {kinds}")
    for f in ("x", "y"):
        check_column(path, f, data[f], 0, np.iinfo(EVENT_DTYPE[f]).max)
    check_column(path, "t", data["t"], -MAX_ABS_TIME_US, MAX_ABS_TIME_US)
    events = np.empty(data.size, dtype=EVENT_DTYPE)
    for f in ("x", "y", "t"):
        events[f] = data[f]
    events["p"] = data["p"] > 0
    events = sort_by_time(events)
    inferred = infer_sensor(events)
    fits = inferred.height <= NIMAGENET_SENSOR.height and inferred.width <= NIMAGENET_SENSOR.width
    return EventFile(events, NIMAGENET_SENSOR if fits else inferred)


def _event_data(path: Path, archive: zipfile.ZipFile) -> np.ndarray:
    """The ``event_data`` array, read only after its declared shape is checked against the bytes the archive holds
    (numpy allocates the declared shape first: a damaged header could ask for terabytes)."""
    names = [name.removesuffix(".npy") for name in archive.namelist()]
    if KEY not in names:
        raise EventFileError(path, f"no '{KEY}' array in the .npz (found {sorted(names)})")
    info = archive.getinfo(f"{KEY}.npy")
    stored = info.compress_type == zipfile.ZIP_STORED
    if info.file_size > info.compress_size * (1 if stored else MAX_DEFLATE_RATIO):
        raise EventFileError(
            path, f"corrupt: '{KEY}' claims {info.file_size} bytes from {info.compress_size} stored bytes"
        )
    with archive.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in _NPY_HEADERS:
            raise EventFileError(path, f"'{KEY}' is stored as .npy version {version}, not 1.0 or 2.0")
        shape, _, dtype = _NPY_HEADERS[version](f)
        needed = math.prod(shape) * dtype.itemsize
        if needed > info.file_size:
            raise EventFileError(
                path, f"corrupt: '{KEY}' declares shape {shape} ({needed} bytes) in a {info.file_size}-byte member"
            )
    with archive.open(info) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def write_npz(path: Path, events: np.ndarray, sensor: SensorSize) -> None:
    """Write ``events`` in the N-ImageNet layout (uncompressed; the sensor is not stored)."""
    del sensor  # the layout has no geometry
    data = np.empty(events.size, dtype=FILE_DTYPE)
    for f in FIELDS:
        data[f] = events[f]
    with path.open("wb") as f:  # a file object: np.savez would append ".npz" to a path without it
        np.savez(f, **{KEY: data})
