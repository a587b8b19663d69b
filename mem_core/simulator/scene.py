"""The scene of the simulated camera: moving shapes over a static background, rendered into a log-intensity frame
and a label mask by a compiled kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from mem_core.events import SensorSize
from mem_core.simulator.config import SHAPES, SimulatorConfig


@dataclass
class Objects:
    """The moving objects of a scene, one array entry per object (drawn bottom to top)."""

    class_id: np.ndarray  # (n,) int64
    shape_id: np.ndarray  # (n,) int64, index into SHAPES
    center: np.ndarray  # (n, 2) float64, (x, y)
    velocity: np.ndarray  # (n, 2) float64, px/s
    angle: np.ndarray  # (n,) rad
    angular_speed: np.ndarray  # (n,) rad/s
    radius: np.ndarray  # (n,) circumscribed radius, px
    log_brightness: np.ndarray  # (n,) log intensity relative to the background mean
    stripe_freq: np.ndarray  # (n,) rad/px
    stripe_phase: np.ndarray  # (n,) rad


def spawn_objects(class_id: np.ndarray, config: SimulatorConfig, rng: np.random.Generator) -> Objects:
    """Random poses and appearance; the draws do not depend on the classes (same seed -> same poses)."""
    n = class_id.size
    h, w = config.sensor
    radius = rng.uniform(*config.size_range, n) * min(h, w)
    lo, hi = center_bounds(radius, config.sensor)
    center = rng.uniform(lo, hi)
    heading = rng.uniform(0, 2 * np.pi, n)
    speed = rng.uniform(*config.speed_range, n)
    velocity = np.stack([np.cos(heading), np.sin(heading)], axis=1) * speed[:, None]  # (n, 2)
    contrast = rng.uniform(0.4, 1.0, n) * rng.choice([-1.0, 1.0], n)
    shape_id = np.array([SHAPES.index(config.classes[c]) for c in class_id], dtype=np.int64)
    return Objects(
        class_id=class_id,
        shape_id=shape_id,
        center=center,
        velocity=velocity,
        angle=rng.uniform(0, 2 * np.pi, n),
        angular_speed=rng.uniform(-1, 1, n) * config.max_angular_speed,
        radius=radius,
        log_brightness=contrast,
        stripe_freq=2 * np.pi / (radius * rng.uniform(0.35, 0.7, n)),
        stripe_phase=rng.uniform(0, 2 * np.pi, n),
    )


def center_bounds(radius: np.ndarray, sensor: SensorSize) -> tuple[np.ndarray, np.ndarray]:
    """Per-object (x, y) limits that keep the object on the sensor; an oversized object stays centred."""
    size = np.array([sensor.width - 1, sensor.height - 1], dtype=np.float64)
    lo = np.minimum(radius[:, None], size / 2)  # (n, 2)
    return lo, size - lo


def background(sensor: SensorSize, texture: float, rng: np.random.Generator) -> np.ndarray:
    """Static log-intensity background (H, W): smooth two-octave noise with std ``texture`` (0 = flat)."""
    if texture == 0:
        return np.zeros(sensor, dtype=np.float32)
    field_ = 0.75 * _smooth_noise(sensor, 16, rng) + 0.25 * _smooth_noise(sensor, 4, rng)
    # C order, as the flat background's: the fancy indexing of the noise leaves a column-major array, and the compiled
    # steps would be compiled again for that layout
    return np.ascontiguousarray(texture * (field_ - field_.mean()) / max(field_.std(), 1e-12), dtype=np.float32)


def _smooth_noise(sensor: SensorSize, cell: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian values on a grid of ``cell``-pixel spacing, bilinearly interpolated to (H, W)."""
    h, w = sensor
    grid = rng.standard_normal((h // cell + 2, w // cell + 2))
    ys, xs = np.arange(h) / cell, np.arange(w) / cell
    y0, x0 = ys.astype(np.int64), xs.astype(np.int64)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx  # (H, W)
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


@numba.njit(cache=True)
def _signed_distance(shape: int, u: float, v: float, r: float) -> float:
    """Distance (px) from object-frame point (u, v) to the outline of a shape of circumradius r; < 0 inside.

    Polygons use the max of their edge half-planes: exact inside and along edges, slightly short near corners.
    """
    if shape == 0:  # disc
        return math.sqrt(u * u + v * v) - r
    if shape == 1:  # square
        return max(abs(u), abs(v)) - r * 0.7071067811865476
    if shape == 2:  # equilateral triangle, inradius r / 2, one vertex pointing up
        d = max(v, max(-0.8660254037844386 * u - 0.5 * v, 0.8660254037844386 * u - 0.5 * v))
        return d - 0.5 * r
    if shape == 3:  # plus-shaped cross: union of two bars
        long, short = 0.92 * r, 0.3 * r
        return min(max(abs(u) - long, abs(v) - short), max(abs(u) - short, abs(v) - long))
    return abs(math.sqrt(u * u + v * v) - 0.75 * r) - 0.25 * r  # ring, inner radius r / 2


@numba.njit(cache=True)
def render_scene(log_bg, shape_id, label, params, texture, out_log, out_label):
    """Composite objects (bottom to top) over the background into ``out_log`` (H, W) and ``out_label`` (H, W).

    ``params`` is (n, 7): center x, center y, angle, radius, log brightness, stripe frequency, stripe phase.
    Coverage is 0.5 - signed distance, clipped to [0, 1] (one-pixel anti-aliasing), blended in linear
    intensity; a pixel takes an object's label where that object covers at least half of it.
    """
    h, w = log_bg.shape
    for y in range(h):  # loops, not slice assignments: those compile numba's shape checks (seconds per process)
        for x in range(w):
            out_log[y, x] = log_bg[y, x]
            out_label[y, x] = 0
    for k in range(shape_id.size):
        cx, cy, angle, r = params[k, 0], params[k, 1], params[k, 2], params[k, 3]
        log_brightness, freq, phase = params[k, 4], params[k, 5], params[k, 6]
        cos_a, sin_a = math.cos(angle), math.sin(angle)
        x0, x1 = max(int(cx - r - 1), 0), min(int(cx + r + 1) + 2, w)  # int() floors: values >= 0 once clipped
        y0, y1 = max(int(cy - r - 1), 0), min(int(cy + r + 1) + 2, h)
        for y in range(y0, y1):
            dy = y - cy
            for x in range(x0, x1):
                dx = x - cx
                u = cos_a * dx + sin_a * dy
                v = -sin_a * dx + cos_a * dy
                cover = 0.5 - _signed_distance(shape_id[k], u, v, r)
                if cover <= 0.0:
                    continue
                log_obj = log_brightness + texture * math.sin(freq * u + phase)
                if cover >= 1.0:
                    out_log[y, x] = log_obj
                else:  # edge pixel: mix linear intensities (the exp/log is only paid on the outline)
                    under = math.exp(out_log[y, x])
                    out_log[y, x] = math.log(under + cover * (math.exp(log_obj) - under))
                if cover >= 0.5:
                    out_label[y, x] = label[k]
