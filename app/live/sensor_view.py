"""The window's events as the sensor saw them: the picture ``mem view`` shows by default (the ``sensor`` message).

The model input is the window resized to the model's size (64 x 64, 224 x 224): square, whatever the sensor, and
without the hot pixels it removes. This view keeps the sensor's geometry and every event: raw counts per pixel
(binned on sensors larger than ``MAX_VIEW_SIDE``), scaled so that the brightest non-hot pixel is 1.
"""

from __future__ import annotations

import numpy as np

from mem_core.events import SensorSize
from mem_core.hot_pixels import hot_threshold

MAX_VIEW_SIDE = 640  # px: larger sensors are binned (a 1280 x 720 Gen4 is sent as 640 x 360, 0.9 MB per frame)


def view_binning(sensor: SensorSize) -> int:
    """Sensor px per view px along each side: the smallest integer that brings the longer side to the limit."""
    return max(1, -(-max(sensor.height, sensor.width) // MAX_VIEW_SIDE))


def sensor_view(events: np.ndarray, sensor: SensorSize) -> tuple[np.ndarray, int]:
    """(2, h, w) float16 OFF / ON counts of ``events`` scaled to [0, 1] (hot pixels, ``mem_core.hot_pixels``, clipped
    at 1), and the binning."""
    binning = view_binning(sensor)
    height, width = -(-sensor.height // binning), -(-sensor.width // binning)
    index = (events["p"].astype(np.intp) * height + events["y"] // binning) * width + events["x"] // binning
    counts = np.bincount(index, minlength=2 * height * width)  # (2 * h * w,) events per pixel
    # statistics from how many pixels hold each count: a few passes over a short array, not over the picture
    pixels = np.bincount(counts)
    values = np.arange(len(pixels))
    mean = pixels @ values / counts.size
    threshold = hot_threshold(mean, np.sqrt(max(pixels @ values**2 / counts.size - mean**2, 0.0)))
    present = values[(pixels > 0) & (values > 0)]
    peak = present[present <= threshold].max(initial=0) or present.max(initial=1)
    brightness = np.minimum(values / peak, 1.0).astype(np.float16)  # per count
    return brightness[counts].reshape(2, height, width), binning
