"""N-ImageNet ``.npz``: one structured array under the key ``event_data`` with fields ``x, y, t, p``.

Assumed units, as N-ImageNet's own loader uses them: ``t`` integer microseconds, ``p`` ON when > 0 (files hold
0/1, bool or -1/+1). Geometry is not stored: N-ImageNet's 640 x 480 (width x height) when the events fit,
else the smallest sensor that holds them.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

from mem_core.events import EVENT_DTYPE, SensorSize, infer_sensor
from mem_core.io.base import EventFile, EventFileError, sort_by_time

NIMAGENET_SENSOR = SensorSize(480, 640)
KEY = "event_data"
FIELDS = ("x", "y", "t", "p")
FILE_DTYPE = np.dtype([("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "?")])
# What numpy's zip/npy parsing raises on a damaged archive.
_DECODE_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    KeyError,
    zipfile.BadZipFile,
    zlib.error,
    struct.error,
    NotImplementedError,
)


def read_npz(path: Path) -> EventFile:
    """Decode an N-ImageNet ``.npz`` file."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            if KEY not in archive.files:
                raise EventFileError(path, f"no '{KEY}' array in the .npz (found {sorted(archive.files)})")
            data = archive[KEY]
    except _DECODE_ERRORS as e:
        raise EventFileError(path, f"corrupt .npz archive ({type(e).__name__}: {e})") from e
    names = data.dtype.names or ()
    if data.ndim != 1 or not set(FIELDS) <= set(names):
        raise EventFileError(
            path,
            f"'{KEY}' must be a 1-D structured array with fields {FIELDS}, got dtype {data.dtype} shape {data.shape}",
        )
    if not all(np.issubdtype(data[f].dtype, np.integer) or data[f].dtype == bool for f in FIELDS):
        kinds = {f: str(data[f].dtype) for f in FIELDS}
        raise EventFileError(path, f"'{KEY}' fields must be integers (t in microseconds), got {kinds}")
    events = np.empty(data.size, dtype=EVENT_DTYPE)
    for f in ("x", "y"):
        if data.size and (int(data[f].min()) < 0 or int(data[f].max()) > np.iinfo(np.uint16).max):
            raise EventFileError(path, f"corrupt: {f} outside [0, 65535]")
        events[f] = data[f]
    events["t"] = data["t"]
    events["p"] = data["p"] > 0
    events = sort_by_time(events)
    inferred = infer_sensor(events)
    fits = inferred.height <= NIMAGENET_SENSOR.height and inferred.width <= NIMAGENET_SENSOR.width
    return EventFile(events, NIMAGENET_SENSOR if fits else inferred)


def write_npz(path: Path, events: np.ndarray, sensor: SensorSize) -> None:
    """Write ``events`` in the N-ImageNet layout (uncompressed; the sensor is not stored)."""
    del sensor  # the layout has no geometry
    data = np.empty(events.size, dtype=FILE_DTYPE)
    for f in FIELDS:
        data[f] = events[f]
    with path.open("wb") as f:  # a file object: np.savez would append ".npz" to a path without it
        np.savez(f, **{KEY: data})
