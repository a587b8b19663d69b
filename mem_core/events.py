"""Events: the one dtype, sensor geometry, validation and windows.

Every event stream in MEM is a numpy structured array of ``EVENT_DTYPE`` sorted by time:
``t`` in microseconds (int64), ``x``/``y`` pixel coordinates (uint16), ``p`` polarity (0 = OFF, 1 = ON).
Readers convert at the boundary, by field name.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mem_core.limits import MAX_SENSOR_SIDE

EVENT_DTYPE = np.dtype([("t", "<i8"), ("x", "<u2"), ("y", "<u2"), ("p", "u1")])
# The largest |t| (us) MEM accepts: 73 000 years either side of 0, beyond any clock, and small enough that the
# difference of two times, and a replay that continues after its last event (time shifted by the span), stay in int64.
MAX_ABS_TIME_US = 1 << 61


class SensorSize(NamedTuple):
    """Sensor geometry in pixels: ``height`` rows by ``width`` columns."""

    height: int
    width: int


def sensor_problem(sensor: SensorSize) -> str | None:
    """Why ``sensor`` cannot be a real sensor (a side below 1 or above ``MAX_SENSOR_SIDE``), or None."""
    if 1 <= sensor.height <= MAX_SENSOR_SIDE and 1 <= sensor.width <= MAX_SENSOR_SIDE:
        return None
    return (
        f"implausible sensor {sensor.width}x{sensor.height} (width x height): "
        f"sides must lie in 1..{MAX_SENSOR_SIDE} pixels"
    )


def time_problem(t_min: int, t_max: int) -> str | None:
    """Why event times from ``t_min`` to ``t_max`` us are implausible (beyond +-``MAX_ABS_TIME_US``), or None."""
    if t_min >= -MAX_ABS_TIME_US and t_max <= MAX_ABS_TIME_US:
        return None
    return f"event times {t_min}..{t_max} us reach beyond +-2^61 us (73 000 years from 0)"


def make_events(t, x, y, p) -> np.ndarray:
    """Pack column arrays into an ``EVENT_DTYPE`` array (values are cast, not checked)."""
    t = np.asarray(t)
    out = np.empty(t.shape[0], dtype=EVENT_DTYPE)
    out["t"] = t
    out["x"] = x
    out["y"] = y
    out["p"] = p
    return out


def validate_events(events: np.ndarray, sensor: SensorSize | None = None) -> None:
    """Raise ``ValueError`` naming the first problem: wrong dtype, unsorted time, times beyond +-``MAX_ABS_TIME_US``,
    coordinates off-sensor, bad polarity."""
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        got = getattr(events, "dtype", type(events).__name__)
        raise ValueError(f"events must be a numpy array of EVENT_DTYPE {EVENT_DTYPE}, got {got}")
    if events.ndim != 1:
        raise ValueError(f"events must be 1-D, got shape {events.shape}")
    if events.size == 0:
        return
    dt = np.diff(events["t"])
    if dt.size and dt.min() < 0:
        i = int(np.argmax(dt < 0))
        raise ValueError(f"events are not sorted by time: t[{i}]={events['t'][i]} > t[{i + 1}]={events['t'][i + 1]}")
    if (problem := time_problem(int(events["t"][0]), int(events["t"][-1]))) is not None:
        raise ValueError(problem)
    p_max = int(events["p"].max())
    if p_max > 1:
        raise ValueError(f"polarity must be 0 (OFF) or 1 (ON), found {p_max}")
    if sensor is not None:
        x_max, y_max = int(events["x"].max()), int(events["y"].max())
        if x_max >= sensor.width or y_max >= sensor.height:
            raise ValueError(
                f"event coordinates (x<={x_max}, y<={y_max}) fall outside the sensor "
                f"{sensor.width}x{sensor.height} (width x height)"
            )


def infer_sensor(events: np.ndarray) -> SensorSize:
    """The smallest sensor that holds every event (for formats that do not store the geometry)."""
    if events.size == 0:
        return SensorSize(0, 0)
    return SensorSize(int(events["y"].max()) + 1, int(events["x"].max()) + 1)


def window_start(total: int, n: int, rng: np.random.Generator | None) -> int:
    """Start of an ``n``-event window in a stream of ``total`` events: random with ``rng``, centred without."""
    if n <= 0:
        raise ValueError(f"window size must be positive, got {n}")
    if total <= n:
        return 0
    if rng is None:
        return (total - n) // 2
    return int(rng.integers(0, total - n + 1))


def random_window(events: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """A random contiguous window of ``min(n, len(events))`` events, drawn with ``rng`` (a view)."""
    start = window_start(len(events), n, rng)
    return events[start : start + n]


def center_window(events: np.ndarray, n: int) -> np.ndarray:
    """The deterministic evaluation window: the ``n`` events in the middle of the stream (a view)."""
    start = window_start(len(events), n, None)
    return events[start : start + n]
