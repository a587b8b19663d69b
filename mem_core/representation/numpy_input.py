"""The evaluation pipeline of one window in numpy, for the torch-free live path (an ONNX model in onnxruntime).

It computes what ``histogram.input_histogram`` and ``pipeline.histograms_to_input(train=False)`` compute, step by
step in the same order and in float32: histogram -> hot pixels zeroed -> normalized -> resized (the sensor, or the
square around the events) -> centre crop -> log scale. The resize reproduces ``torch.nn.functional.interpolate``'s
bilinear weights (``align_corners=False``; antialiased as torch's ``_upsample_bilinear2d_aa`` when a side shrinks):
the model input differs from torch's by float32 rounding only (tests/test_onnx.py checks it on real recordings).
Imports neither torch nor numba: counts come from ``np.bincount`` on a flat index.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mem_core.events import EVENT_DTYPE, SensorSize
from mem_core.hot_pixels import hot_threshold
from mem_core.representation.spec import InputSpec, n_channels


def count_histogram(events: np.ndarray, sensor: SensorSize, channels: str = "hist", bins: int = 4) -> np.ndarray:
    """Histogram of ``events`` at sensor resolution, float32 (C, H, W): ``input_histogram``'s counts (and newest
    timestamps), refusing the same events (off the sensor, polarity > 1, or outside their window's time span)."""
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        raise ValueError(f"events must be a numpy array of EVENT_DTYPE, got {getattr(events, 'dtype', type(events))}")
    height, width = sensor
    num_channels = n_channels(channels, bins)
    if len(events) == 0:
        return np.zeros((num_channels, height, width), np.float32)
    t, x, y, p = (events[k] for k in ("t", "x", "y", "p"))
    keep = (x < width) & (y < height) & (p <= 1)
    t0, t_last = int(t[0]), int(t[-1])
    if channels != "hist":
        keep &= (t >= t0) & (t <= t_last)
    if not keep.all():
        raise ValueError(
            f"{int(np.count_nonzero(~keep))} of {len(events)} events fall outside the sensor {width}x{height} "
            "(width x height), have polarity > 1, or are not sorted by time"
        )
    pixel = y.astype(np.intp) * width + x  # (N,)
    channel = p.astype(np.intp)
    if channels == "temporal":  # the even split of the numba kernel: bin = (t - t0) * bins // ticks
        channel = channel + 2 * ((t - t0) * bins // (t_last - t0 + 1)).astype(np.intp)
    n_counts = 2 if channels == "timestamp" else num_channels
    counts = np.bincount(channel * (height * width) + pixel, minlength=n_counts * height * width)
    if n_counts == num_channels:
        return counts.astype(np.float32).reshape(num_channels, height, width)
    out = np.zeros((num_channels, height, width), np.float32)  # the counts, then the newest event of each pixel
    out[:n_counts] = counts.reshape(n_counts, height, width)
    if channels == "timestamp":  # times are sorted: a pixel's newest event is its last occurrence
        span = t_last - t0
        last = len(pixel) - 1 - np.unique(pixel[::-1], return_index=True)[1]
        newest = (t[last] - t0) / span if span > 0 else np.ones(len(last))
        out[2].flat[pixel[last]] = newest.astype(np.float32)
    return out


def remove_hot_pixels(hist: np.ndarray, num_std: float, count_channels: int) -> np.ndarray:
    """``pipeline.remove_hot_pixels`` of one (C, H, W) histogram: pixels above mean + num_std * std of the counts
    zeroed in every channel. Returns a new array."""
    counts = hist[:count_channels]
    flat = counts.reshape(-1)
    mean = float(flat.sum(dtype=np.float64)) / flat.size
    std = math.sqrt(max(float(np.dot(flat, flat)) / flat.size - mean * mean, 0.0))  # (one pass: torch takes two)
    hot = np.flatnonzero(counts.max(0) > hot_threshold(mean, std, num_std))  # (flat H x W)
    out = hist.copy()
    out.reshape(len(out), -1)[:, hot] = 0  # (4 x faster than np.where over the whole histogram)
    return out


def normalize(hist: np.ndarray, count_channels: int) -> np.ndarray:
    """The count channels divided by their peak, in place (an empty window stays zeros); later channels as they
    are. Returns ``hist``."""
    peak = max(float(hist[:count_channels].max(initial=0.0)), float(np.finfo(np.float32).tiny))
    hist[:count_channels] /= np.float32(peak)
    return hist


def extent_box(hist: np.ndarray, count_channels: int) -> tuple[int, int, int]:
    """(top, left, side) of ``crop="extent"``'s square: ``pipeline.extent_boxes`` of one (C, H, W) histogram."""
    height, width = hist.shape[-2:]
    lit = hist[:count_channels].max(0) > 0  # (H, W)
    ys, xs = np.flatnonzero(lit.any(1)), np.flatnonzero(lit.any(0))
    y0, y1, x0, x1 = (ys[0], ys[-1] + 1, xs[0], xs[-1] + 1) if len(ys) else (0, height, 0, width)
    side = int(max(y1 - y0, x1 - x0, min(height, width) // 4, 1))
    return _place(y0 + y1, side, height), _place(x0 + x1, side, width), side


def _place(twice_centre: int, side: int, extent: int) -> int:
    start = (int(twice_centre) - side) // 2
    return int(min(max(start, 0), extent - side) if side <= extent else (extent - side) // 2)


def crop_square(hist: np.ndarray, box: tuple[int, int, int]) -> np.ndarray:
    """The square ``box`` of (C, H, W), zeros where it reaches past the sensor."""
    top, left, side = box
    height, width = hist.shape[-2:]
    out = np.zeros((hist.shape[0], side, side), hist.dtype)
    y0, x0, y1, x1 = max(top, 0), max(left, 0), min(top + side, height), min(left + side, width)
    out[:, y0 - top : y1 - top, x0 - left : x1 - left] = hist[:, y0:y1, x0:x1]
    return out


@functools.cache
def _linear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(index, weight), each (out, 2): torch's bilinear interpolation without antialiasing (``align_corners=False``),
    source coordinates computed in float32 as torch's CPU kernel does."""
    scale = np.float32(in_size / out_size)
    src = np.maximum(scale * (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5), 0)
    i0 = src.astype(np.intp)
    lam = np.clip(src - i0.astype(np.float32), 0, 1)
    i1 = i0 + (i0 < in_size - 1)
    return np.stack([i0, i1], 1), np.stack([1 - lam, lam], 1).astype(np.float32)


@functools.cache
def _antialias_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(index, weight), each (out, taps): torch's antialiased bilinear interpolation, a triangle filter stretched by
    the scale where it shrinks and normalized over the taps inside the input (``_compute_weights_aa``, in float32 as
    there)."""
    f32 = np.float32
    scale = f32(in_size / out_size)
    support, invscale = (scale, f32(1) / scale) if scale >= 1 else (f32(1), f32(1))
    taps = math.ceil(support) * 2 + 1
    index, weight = np.zeros((out_size, taps), np.intp), np.zeros((out_size, taps), np.float32)
    for i in range(out_size):
        centre = f32(float(scale) * (i + 0.5))
        start = max(int(float(centre) - float(support) + 0.5), 0)
        size = min(int(float(centre) + float(support) + 0.5), in_size) - start
        offsets = np.arange(size) + start - np.float64(centre) + 0.5
        w = np.maximum(f32(0), f32(1) - np.abs((offsets * np.float64(invscale)).astype(f32)))
        total = f32(0)
        for v in w:  # summed in order, as there
            total = f32(total + v)
        index[i, :size] = np.arange(start, start + size)
        weight[i, :size] = w / total if total != 0 else w
    return index, weight


def resize(hist: np.ndarray, size: tuple[int, int], antialias: bool | None = None) -> np.ndarray:
    """Bilinear resize of (C, H, W) to ``size``, by default antialiased when a side shrinks (as
    ``pipeline.resize_histogram``); ``antialias=False`` is ``F.interpolate(mode="bilinear")``'s default. Width first,
    then height, as torch's separable kernel."""
    height, width = hist.shape[-2:]
    if (height, width) == tuple(size):
        return hist
    if antialias is None:
        antialias = size[0] < height or size[1] < width
    out = hist
    if size[1] != width:  # (C, H, W) -> (C, H, size[1])
        out = _banded_product(out, _taps_bands(width, size[1], antialias), axis=2)
    if size[0] != height:  # (C, H, W') -> (C, size[0], W')
        out = _banded_product(out, _taps_bands(height, size[0], antialias), axis=1)
    return np.ascontiguousarray(out, np.float32)


_BAND = 8  # outputs per block of the banded product: 3 x faster than 4 or 64 on a 640 x 480 window


def _banded_product(hist: np.ndarray, bands: list[tuple[int, int, int, int, np.ndarray]], axis: int) -> np.ndarray:
    """``hist`` (C, H, W) resized along ``axis`` (1: H, 2: W) by the taps in ``bands``, one matrix product per
    block of outputs over the inputs their taps reach: the taps matrix is banded, and the dense product spent most
    of its time on zeros (0.8 against 2.4 ms on a 640 x 480 window, the same sums)."""
    shape = list(hist.shape)
    shape[axis] = bands[-1][3]
    out = np.empty(shape, np.float32)
    for i0, i1, o0, o1, taps in bands:
        if axis == 2:
            out[:, :, o0:o1] = hist[:, :, i0:i1] @ taps
        else:
            out[:, o0:o1, :] = taps.T @ hist[:, i0:i1, :]
    return out


@functools.cache
def _taps_bands(in_size: int, out_size: int, antialias: bool) -> list[tuple[int, int, int, int, np.ndarray]]:
    """(first input, end input, first output, end output, taps (inputs, outputs)) for blocks of ``_BAND`` outputs:
    the rows of the taps matrix their taps reach."""
    matrix = _taps_matrix(in_size, out_size, antialias)
    bands = []
    for o0 in range(0, out_size, _BAND):
        o1 = min(o0 + _BAND, out_size)
        reached = np.flatnonzero(matrix[:, o0:o1].any(1))
        i0, i1 = (int(reached[0]), int(reached[-1]) + 1) if reached.size else (0, 1)
        bands.append((i0, i1, o0, o1, np.ascontiguousarray(matrix[i0:i1, o0:o1])))
    return bands


def _taps_matrix(in_size: int, out_size: int, antialias: bool) -> np.ndarray:
    """(in, out) float32: column ``o`` holds output ``o``'s tap weights at its taps' input positions."""
    index, weight = (_antialias_taps if antialias else _linear_taps)(in_size, out_size)
    matrix = np.zeros((in_size, out_size), np.float32)
    for k in range(index.shape[1]):  # a repeated index (a clamped edge tap) adds up, as its taps do
        np.add.at(matrix, (index[:, k], np.arange(out_size)), weight[:, k])
    return matrix


def log_scale(hist: np.ndarray, count_channels: int, gain: float) -> np.ndarray:
    """``log1p(gain * x) / log1p(gain)`` of the count channels, in place."""
    counts = hist[:count_channels]
    np.multiply(counts, np.float32(gain), out=counts)
    np.log1p(counts, out=counts)
    np.divide(counts, np.float32(math.log1p(gain)), out=counts)
    return hist


def window_input(counts: np.ndarray, spec: InputSpec) -> tuple[np.ndarray, tuple[int, int, int] | None]:
    """A window's sensor histogram (C, h, w) -> model input float32 (C, *spec.size), at evaluation; and the square
    it showed with ``crop="extent"`` (else None)."""
    n = spec.count_channels
    # one copy of the sensor-sized histogram, which the steps up to the resize then change in place
    hist = counts.copy() if spec.hot_pixel_std is None else remove_hot_pixels(counts, spec.hot_pixel_std, n)
    normalize(hist, n)
    box = None
    target = spec.resize_to or spec.size
    if spec.crop == "extent":
        box = extent_box(hist, n)
        hist = resize(crop_square(hist, box), target)
    else:
        hist = resize(hist, target)
    if spec.resize_to is not None:  # the centre crop of evaluation
        (rh, rw), (h, w) = spec.resize_to, spec.size
        top, left = (rh - h) // 2, (rw - w) // 2
        hist = hist[:, top : top + h, left : left + w]
    hist = np.array(hist, np.float32)  # a new array: the log scale works in place
    if spec.scale == "log":
        log_scale(hist, n, spec.log_gain)
    return hist, box


def input_region(
    spec: InputSpec, sensor: SensorSize, box: tuple[int, int, int] | None
) -> tuple[float, float, float, float]:
    """(top, left, height, width) in sensor px of what the model input shows: the whole sensor or the extent
    ``box``, then the centre kept by ``resize_to``'s crop."""
    top, left, height, width = 0.0, 0.0, float(sensor.height), float(sensor.width)
    if box is not None:
        top, left, height, width = float(box[0]), float(box[1]), float(box[2]), float(box[2])
    if spec.resize_to is None:
        return top, left, height, width
    (rh, rw), (h, w) = spec.resize_to, spec.size
    sy, sx = height / rh, width / rw  # sensor px per resized px
    return top + (rh - h) // 2 * sy, left + (rw - w) // 2 * sx, h * sy, w * sx


def fold_polarity(x: np.ndarray, spec: InputSpec) -> np.ndarray:
    """(C, H, W) model input -> the (2, H, W) float16 OFF / ON picture the server publishes (``inference``'s)."""
    counts = x[: spec.count_channels]
    if spec.channels == "temporal":
        counts = counts.reshape(-1, 2, *counts.shape[-2:]).sum(0)  # (bins, 2, H, W) -> (2, H, W)
        counts = counts / max(float(counts.max()), 1e-12)
    return counts.astype(np.float16)
