"""DSEC ``events.h5``: datasets ``events/{x,y,t,p}``, ``ms_to_idx`` and ``t_offset`` (Blosc/ZSTD compressed).

``events/t`` holds microseconds relative to ``t_offset``; ``read_dsec`` returns absolute times
``t + t_offset`` (the clock DSEC's image and label timestamps use). ``ms_to_idx[m]`` is the index of the first
event with relative ``t >= 1000 * m``. Geometry: ``width``/``height`` attributes of the ``events`` group when
present (our writer adds them), else DSEC's 640 x 480 when the events fit, else inferred from the events.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import hdf5plugin  # registers the Blosc/ZSTD filters before h5py opens a DSEC file
import numpy as np

from mem_core.events import EVENT_DTYPE, SensorSize, infer_sensor
from mem_core.io.base import EventFile, EventFileError, check_on_sensor, sort_by_time

DSEC_SENSOR = SensorSize(480, 640)
FIELDS = ("x", "y", "t", "p")
_DECODE_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


def read_dsec(path: Path) -> EventFile:
    """Decode a DSEC-layout ``events.h5`` file."""
    try:
        with h5py.File(path, "r") as f:
            group = f.get("events")
            if not isinstance(group, h5py.Group) or not all(isinstance(group.get(k), h5py.Dataset) for k in FIELDS):
                top = sorted(f.keys())[:8]
                raise EventFileError(path, f"not a DSEC events file: no events/{{x,y,t,p}} datasets (top level: {top})")
            columns = {k: group[k][()] for k in FIELDS}
            t_offset = int(np.asarray(f["t_offset"][()]).reshape(-1)[0]) if "t_offset" in f else 0
            attrs = {k: int(group.attrs[k]) for k in ("width", "height") if k in group.attrs}
    except _DECODE_ERRORS as e:
        raise EventFileError(path, f"corrupt HDF5 file ({type(e).__name__}: {e})") from e
    sizes = {k: v.shape for k, v in columns.items()}
    if any(v.ndim != 1 for v in columns.values()) or len({v.size for v in columns.values()}) != 1:
        raise EventFileError(path, f"corrupt: events/x, y, t, p must be 1-D of equal length, got shapes {sizes}")
    if not all(np.issubdtype(v.dtype, np.integer) for v in columns.values()):
        raise EventFileError(
            path, f"events/x, y, t, p must be integers, got { ({k: str(v.dtype) for k, v in columns.items()}) }"
        )
    events = np.empty(columns["t"].size, dtype=EVENT_DTYPE)
    events["t"] = columns["t"].astype(np.int64) + t_offset
    events["x"] = columns["x"]
    events["y"] = columns["y"]
    events["p"] = columns["p"] > 0
    events = sort_by_time(events)
    if len(attrs) == 2:
        sensor = SensorSize(attrs["height"], attrs["width"])
        check_on_sensor(path, events, sensor, "the events group attributes")
        return EventFile(events, sensor)
    inferred = infer_sensor(events)
    fits = inferred.height <= DSEC_SENSOR.height and inferred.width <= DSEC_SENSOR.width
    return EventFile(events, DSEC_SENSOR if fits else inferred)


def write_dsec(path: Path, events: np.ndarray, sensor: SensorSize) -> None:
    """Write ``events`` in the DSEC layout (Blosc/ZSTD), ``t_offset`` = the first timestamp.

    ``ValueError`` when the recording spans 2^32 us or more (``events/t`` is uint32, as in DSEC).
    """
    t = events["t"].astype(np.int64)
    t_offset = int(t[0]) if t.size else 0
    rel = t - t_offset
    if rel.size and rel[-1] >= 1 << 32:
        raise ValueError(f"DSEC .h5 holds relative times < 2^32 us, the events span {int(rel[-1])} us")
    n_ms = int(rel[-1]) // 1000 + 2 if rel.size else 1
    ms_to_idx = np.searchsorted(rel, np.arange(n_ms, dtype=np.int64) * 1000, side="left").astype(np.uint64)
    blosc = hdf5plugin.Blosc(cname="zstd", clevel=1, shuffle=hdf5plugin.Blosc.SHUFFLE)
    with h5py.File(path, "w") as f:
        group = f.create_group("events")
        chunks = (min(max(t.size, 1), 1 << 16),)
        for name, column in (("x", events["x"]), ("y", events["y"]), ("t", rel.astype(np.uint32)), ("p", events["p"])):
            # resizable (maxshape None) so an empty recording still gets a chunked, compressed dataset
            group.create_dataset(name, data=column, chunks=chunks, maxshape=(None,), **blosc)
        group.attrs["width"] = sensor.width
        group.attrs["height"] = sensor.height
        f.create_dataset("ms_to_idx", data=ms_to_idx)
        f.create_dataset("t_offset", data=np.int64(t_offset))
