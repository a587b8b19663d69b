"""The hot-pixel rule: a pixel whose count lies above ``mean + num_std * std`` of the counts of its window (all its
pixels, population std) is a sensor defect, not the scene. The model input zeroes such pixels
(``representation.pipeline.remove_hot_pixels``, ``InputSpec.hot_pixel_std``); the live sensor view leaves them out of
its brightness scale (``app.live.sensor_view``). Free of torch and numpy: it takes numbers or arrays of either."""

from __future__ import annotations

from typing import TypeVar

HOT_PIXEL_STD = 10.0  # the paper's num_std
T = TypeVar("T")


def hot_threshold(mean: T, std: T, num_std: float = HOT_PIXEL_STD) -> T:
    """The count above which a pixel is hot, from the mean and std of its window's counts."""
    return mean + num_std * std
