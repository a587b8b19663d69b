"""N-MNIST / N-Caltech101 ``.bin`` (also ``.bs2``): 5 bytes per event, no header.

Byte layout per event: ``x = b0``, ``y = b1``, ``p = b2 >> 7``, ``t = (b2 & 0x7F) << 16 | b3 << 8 | b4`` (us).
A record with ``y == 240`` is not an event but a timestamp-overflow marker that adds 2^13 us to every later
event (the convention of the datasets' own reader, Orchard et al.); both sensors are smaller than 240 rows.
"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np

from mem_core.events import EVENT_DTYPE, SensorSize
from mem_core.io.base import EventFile, EventFileError, read_bytes, sort_plausible

RECORD_BYTES = 5
OVERFLOW_Y = 240
OVERFLOW_US = 1 << 13
MAX_T = 1 << 23
NMNIST_SENSOR = SensorSize(34, 34)
EXTENSIONS = (".bin", ".bs2")


@numba.njit(cache=True, nogil=True)
def _decode(rec, out):
    """Fill ``out`` from (N, 5) records, dropping overflow markers -> (events, sorted by t?, x max, y max)."""
    n = 0
    offset = 0
    ordered = True
    x_max = 0
    y_max = 0
    for i in range(rec.shape[0]):
        if rec[i, 1] == OVERFLOW_Y:
            offset += OVERFLOW_US
            continue
        b2 = np.int64(rec[i, 2])
        t = offset + ((b2 & 0x7F) << 16 | np.int64(rec[i, 3]) << 8 | np.int64(rec[i, 4]))
        if n and t < out[n - 1].t:
            ordered = False
        x_max = max(x_max, rec[i, 0])
        y_max = max(y_max, rec[i, 1])
        out[n].t = t
        out[n].x = rec[i, 0]
        out[n].y = rec[i, 1]
        out[n].p = b2 >> 7
        n += 1
    return n, ordered, x_max, y_max


def read_bin(path: Path) -> EventFile:
    """Decode a ``.bin``/``.bs2`` file.

    The format stores no geometry: the sensor is inferred from the events, and is at least N-MNIST's 34 x 34
    for ``.bs2`` files and for files whose events all fit in 34 x 34 (N-Caltech101 files are far larger).
    """
    buf = read_bytes(path)
    if len(buf) % RECORD_BYTES:
        raise EventFileError(
            path,
            f"truncated: {len(buf)} bytes is not a whole number of {RECORD_BYTES}-byte events "
            f"({len(buf) % RECORD_BYTES} trailing bytes after {len(buf) // RECORD_BYTES} whole records)",
        )
    rec = np.frombuffer(buf, dtype=np.uint8).reshape(-1, RECORD_BYTES)  # (N, 5)
    out = np.empty(len(rec), dtype=EVENT_DTYPE)
    n, ordered, x_max, y_max = _decode(rec, out)
    events = out[:n] if ordered else sort_plausible(path, out[:n])
    sensor = SensorSize(int(y_max) + 1, int(x_max) + 1) if n else SensorSize(0, 0)
    if path.suffix.lower() == ".bs2" or (sensor.height <= NMNIST_SENSOR.height and sensor.width <= NMNIST_SENSOR.width):
        sensor = SensorSize(max(sensor.height, NMNIST_SENSOR.height), max(sensor.width, NMNIST_SENSOR.width))
    return EventFile(events, sensor)


def write_bin(path: Path, events: np.ndarray, sensor: SensorSize) -> None:
    """Write ``events`` as 5-byte records; ``ValueError`` for what the format cannot hold.

    Limits: x, y <= 255 with y != 240 (the overflow marker), 0 <= t < 2^23 us. The sensor is not stored.
    """
    del sensor  # the format has no header
    if not events.size:
        raise ValueError(".bin cannot hold an empty recording (a 0-byte file reads as an empty, broken file)")
    x_max, y_max = int(events["x"].max()), int(events["y"].max())
    t_min, t_max = int(events["t"].min()), int(events["t"].max())
    if x_max > 255 or y_max > 255:
        raise ValueError(f".bin holds 8-bit coordinates (<= 255), got x up to {x_max}, y up to {y_max}")
    if np.any(events["y"] == OVERFLOW_Y):
        raise ValueError(f".bin cannot hold events at y={OVERFLOW_Y}: that row marks a timestamp overflow")
    if t_min < 0 or t_max >= MAX_T:
        raise ValueError(f".bin holds timestamps 0 <= t < 2^23 us ({MAX_T}), got t in [{t_min}, {t_max}]")
    rec = np.empty((events.size, RECORD_BYTES), dtype=np.uint8)  # (N, 5)
    t = events["t"].astype(np.int64)
    rec[:, 0] = events["x"]
    rec[:, 1] = events["y"]
    rec[:, 2] = (events["p"].astype(np.int64) << 7) | (t >> 16)
    rec[:, 3] = (t >> 8) & 0xFF
    rec[:, 4] = t & 0xFF
    path.write_bytes(rec.tobytes())
