"""The window's events as the sensor saw them: the picture ``mem view`` shows by default (the ``sensor`` message).

The model input is the window resized to the model's size (64 x 64, 224 x 224): square, whatever the sensor, and
without the hot pixels it removes. This view keeps the sensor's geometry and every event: raw counts per pixel
(binned on sensors larger than ``MAX_VIEW_SIDE``), scaled so that the brightest non-hot pixel is 1.
"""

from __future__ import annotations

import numpy as np

from mem_core.events import SensorSize

MAX_VIEW_SIDE = 640  # px: larger sensors are binned (a 1280 x 720 Gen4 is sent as 640 x 360, 0.9 MB per frame)
HOT_PIXEL_STD = 10.0  # counts above mean + 10 std (the model input's rule) do not set the brightness scale


def view_binning(sensor: SensorSize) -> int:
    """Sensor px per view px along each side: the smallest integer that brings the longer side to the limit."""
    return max(1, -(-max(sensor.height, sensor.width) // MAX_VIEW_SIDE))


def sensor_view(events: np.ndarray, sensor: SensorSize) -> tuple[np.ndarray, int]:
    """(2, h, w) float16 OFF / ON counts of ``events`` scaled to [0, 1] (hot pixels clipped at 1), and the binning."""
    binning = view_binning(sensor)
    height, width = -(-sensor.height // binning), -(-sensor.width // binning)
    index = (events["p"].astype(np.intp) * height + events["y"] // binning) * width + events["x"] // binning
    counts = np.bincount(index, minlength=2 * height * width).astype(np.float32).reshape(2, height, width)
    threshold = counts.mean() + HOT_PIXEL_STD * counts.std()
    peak = float(counts[counts <= threshold].max(initial=0.0)) or float(counts.max()) or 1.0
    return np.minimum(counts / peak, 1.0).astype(np.float16), binning
