"""Training augmentations: event-level (before the histogram) and RandAugment on batched histogram tensors.

``augment_events`` takes ``EVENT_DTYPE`` arrays and an explicit ``np.random.Generator`` and returns a new array (the
input is never modified). ``rand_augment`` works on batched float tensors in [0, 1] with any number of channels, on
any device (timm's RandAugment is PIL-only, so 2-channel histograms need their own).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from mem_core.events import EVENT_DTYPE, SensorSize, random_window
from mem_core.limits import MAX_MAGNITUDE

# ------------------------------------------------------------------------------------- event augmentations


class EventAugmentation(Protocol):
    """The event-level augmentation settings (``InputSpec`` has them)."""

    flip_polarity_p: float
    hflip_p: float
    shift_px: int
    event_drop_p: float
    scale_jitter: float
    noise_events: float
    n_max: int


@njit(cache=True, nogil=True)
def _augment_kernel(events, out, flip, mirror, dx, dy, width, height, zoom, cx, cy):
    """One pass of ``augment_events``: writes the kept events to ``out``; returns (kept, off-sensor inputs)."""
    kept = 0
    invalid = 0
    for i in range(events.shape[0]):
        e = events[i]
        x = np.int64(e.x)
        y = np.int64(e.y)
        if x >= width or y >= height:
            invalid += 1
            continue
        if mirror:
            x = width - 1 - x
        if zoom != 1.0:
            x = np.int64(np.floor(cx + (x + 0.5 - cx) * zoom))
            y = np.int64(np.floor(cy + (y + 0.5 - cy) * zoom))
        x += dx
        y += dy
        if 0 <= x < width and 0 <= y < height:
            o = out[kept]
            o.t = e.t
            o.x = x
            o.y = y
            o.p = 1 - e.p if flip else e.p
            kept += 1
    return kept, invalid


def augment_events(
    events: np.ndarray, sensor: SensorSize, spec: EventAugmentation, rng: np.random.Generator
) -> np.ndarray:
    """Training-time event augmentations drawn from ``rng``: polarity flip with ``spec.flip_polarity_p``,
    horizontal flip with ``spec.hflip_p``, a zoom about the window's events by a factor drawn log-uniformly from
    [1 / (1 + ``spec.scale_jitter``), 1 + ``spec.scale_jitter``] (other object sizes and distances), then a shift of
    up to +-``spec.shift_px`` in x and y (uniform integers) that drops events leaving the frame, then EventDrop with
    ``spec.event_drop_p`` (``drop_events``), then background activity (``add_noise``, up to
    ``spec.noise_events`` times the window's events; past ``spec.n_max`` events a random contiguous ``spec.n_max``
    of them are kept, as a noisier sensor's window of that many events spans less time). Returns a new array. A
    setting at 0 draws nothing from ``rng``, so the other augmentations draw as they did without it.

    One numba pass (three numpy steps - flip, mirror, shift and drop - cost ~1 ms on a 30 000-event window, mostly
    copies of the 13-byte records).
    """
    flip = bool(rng.random() < spec.flip_polarity_p)
    mirror = bool(rng.random() < spec.hflip_p)
    zoom, cx, cy = 1.0, 0.0, 0.0
    if spec.scale_jitter > 0 and len(events):
        zoom = math.exp(rng.uniform(-1.0, 1.0) * math.log1p(spec.scale_jitter))
        cx, cy = float(events["x"].mean()) + 0.5, float(events["y"].mean()) + 0.5
        if mirror:
            cx = sensor.width - cx
    dx, dy = (int(d) for d in rng.integers(-spec.shift_px, spec.shift_px + 1, size=2)) if spec.shift_px else (0, 0)
    out = np.empty(len(events), EVENT_DTYPE)
    kept, invalid = _augment_kernel(events, out, flip, mirror, dx, dy, sensor.width, sensor.height, zoom, cx, cy)
    if invalid:
        raise ValueError(f"{invalid} events fall outside the sensor {sensor.width}x{sensor.height} (width x height)")
    out = out[:kept]
    if spec.event_drop_p > 0 and rng.random() < spec.event_drop_p:
        out = drop_events(out, sensor, rng)
    if spec.noise_events > 0:
        out = add_noise(out, sensor, spec.noise_events, rng)
        if len(out) > spec.n_max:
            out = random_window(out, spec.n_max, rng)
    return out


def add_noise(events: np.ndarray, sensor: SensorSize, most: float, rng: np.random.Generator) -> np.ndarray:
    """``events`` with background activity added: a uniform share in [0, ``most``] of their count as events at
    uniform random pixels, polarities and times within the window's span, merged in time order (a noisier sensor
    or other bias settings)."""
    if len(events) == 0:
        return events
    n = round(rng.uniform(0.0, most) * len(events))
    if n == 0:
        return events
    noise = np.empty(n, EVENT_DTYPE)
    noise["t"] = rng.integers(int(events["t"][0]), int(events["t"][-1]) + 1, n)
    noise["x"] = rng.integers(0, sensor.width, n)
    noise["y"] = rng.integers(0, sensor.height, n)
    noise["p"] = rng.integers(0, 2, n)
    merged = np.concatenate([events, noise])
    return merged[np.argsort(merged["t"], kind="stable")]


DROP_RATIO = (0.1, 0.9)
"""Range of the uniform ratio of an EventDrop: the share of the window's duration, of the sensor's sides or of the
events that is dropped (the paper draws it from 0.1, 0.2, ..., 0.9)."""


def drop_events(events: np.ndarray, sensor: SensorSize, rng: np.random.Generator) -> np.ndarray:
    """EventDrop (Gu et al., IJCAI 2021): drop the events of a random time interval, of a random box, or a random
    subset, one of the three chosen uniformly, with a ratio drawn uniformly from ``DROP_RATIO``.

    - time: an interval of ``ratio`` x the window's duration, at a uniform position within it (a pause in motion);
    - area: a box of ``ratio`` x the sensor's width and height, centred anywhere on the sensor (an occluder);
    - random: each event independently with probability ``ratio`` (a higher contrast threshold, a slower object).

    Returns ``events`` itself when the drop would leave no event (an empty window teaches nothing about its label).
    """
    kind = int(rng.integers(3))
    ratio = float(rng.uniform(*DROP_RATIO))
    if len(events) == 0:
        return events
    if kind == 0:
        t = events["t"]
        t0, t1 = int(t[0]), int(t[-1])
        span = (t1 - t0) * ratio
        start = t0 + rng.uniform(0.0, (t1 - t0) - span)
        keep = (t < start) | (t > start + span)
    elif kind == 1:
        cx, cy = rng.uniform(0, sensor.width), rng.uniform(0, sensor.height)
        inside_x = np.abs(events["x"].astype(np.float64) - cx) < ratio * sensor.width / 2
        inside_y = np.abs(events["y"].astype(np.float64) - cy) < ratio * sensor.height / 2
        keep = ~(inside_x & inside_y)
    else:
        keep = rng.random(len(events)) >= ratio
    return events[keep] if keep.any() else events


# -------------------------------------------------------------------------------------------- RandAugment

# Chosen for [0, 1] event histograms. Left out on purpose:
# - "solarize" (x -> 1 - x above a threshold) turns the densest edges into the emptiest pixels, breaking the one
#   property a count image has (more events = larger value);
# - "equalize": ~90 % of a histogram's pixels are empty, so equalization sends the smallest non-zero count to
#   ~0.9 and binarizes the input, erasing the counts;
# - "color"/"invert" have no meaning without RGB channels / for counts.
RANDAUG_OPS: tuple[str, ...] = (
    "identity",
    "rotate",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "brightness",  # scales all counts: other contrast thresholds / speeds
    "contrast",  # blend with the mean
    "sharpness",  # blend with a 3x3 smoothed copy
    "posterize",  # quantize to 2**bits levels: drops the weakest pixels (noise-like events)
    "autocontrast",  # stretch each channel to [0, 1]: rebalances the two polarities
)
_WARPS = ("rotate", "shear_x", "shear_y")
_TRANSLATES = ("translate_x", "translate_y")

Plan = list[list[tuple[str, float]]]
"""Per sample, its RandAugment ops in application order as (op name, signed level in [-1, 1])."""


def _translation(op: str, level: float, height: int, width: int) -> tuple[int, int]:
    """Whole-pixel shift (dx, dy) of a translate op: +-(150/331) * side * level, rounded."""
    pixels = round(150 / 331 * (width if op == "translate_x" else height) * level)
    return (pixels, 0) if op == "translate_x" else (0, pixels)


@functools.lru_cache(maxsize=4096)  # a plan repeats few (op, level, size) triples; returned arrays are read-only
def _op_matrix(op: str, level: float, height: int, width: int) -> np.ndarray:
    """(3, 3) affine of a geometric op in affine_grid's normalized coordinates: output point -> input point.

    Rotations and shears are built in pixel units around the image centre (so a rotation is not skewed on a
    non-square input) and mapped to [-1, 1]: theta = S A S^-1 with S = diag(2/W, 2/H). A translation by whole
    pixels (dx, dy) moves the content: output(p) = input(p - d). Applying op 1 then op 2 samples the input at
    ``M1 @ M2 @ p``.
    """
    m = np.eye(3)
    if op == "rotate":
        angle = math.radians(30.0 * level)
        c, si = math.cos(angle), math.sin(angle)
        m[:2, :2] = [[c, -si * height / width], [si * width / height, c]]
    elif op == "shear_x":
        m[0, 1] = 0.3 * level * height / width
    elif op == "shear_y":
        m[1, 0] = 0.3 * level * width / height
    elif op in _TRANSLATES:
        dx, dy = _translation(op, level, height, width)
        m[0, 2], m[1, 2] = -2.0 * dx / width, -2.0 * dy / height
    m.setflags(write=False)
    return m


def draw_rand_augment(
    n: int,
    ops: int = 2,
    magnitude: float = 20,
    generator: torch.Generator | None = None,
    op_names: Sequence[str] = RANDAUG_OPS,
) -> Plan:
    """Draw the RandAugment ops of ``n`` samples (see ``rand_augment``): per sample ``ops`` (name, signed level).

    Per round, one ``torch.randint`` draws every sample's op and one its sign (``generator`` is a CPU generator).
    """
    if not 0 <= magnitude <= MAX_MAGNITUDE:
        raise ValueError(f"magnitude must be in [0, {MAX_MAGNITUDE}], got {magnitude}")
    unknown = sorted(set(op_names) - set(RANDAUG_OPS))
    if unknown or not op_names:
        raise ValueError(f"unknown RandAugment ops {unknown} (or none given); known: {RANDAUG_OPS}")
    plan: Plan = [[] for _ in range(n)]
    for _ in range(ops):
        choice = torch.randint(len(op_names), (n,), generator=generator).tolist()
        sign = torch.randint(2, (n,), generator=generator) * 2.0 - 1.0
        level = (sign * (magnitude / MAX_MAGNITUDE)).tolist()  # signed level in [-1, 1] per sample
        for i in range(n):
            plan[i].append((op_names[choice[i]], level[i]))
    return plan


def rand_augment(
    x: torch.Tensor,
    ops: int = 2,
    magnitude: float = 20,
    generator: torch.Generator | None = None,
    op_names: Sequence[str] = RANDAUG_OPS,
    *,
    inplace: bool = False,
) -> torch.Tensor:
    """RandAugment for histogram batches: x (B, C, H, W) in [0, 1] -> (B, C, H, W) in [0, 1].

    Each sample draws its own ``ops`` operations from ``op_names`` (uniformly, with repetition) and its own
    sign per operation, all from ``generator`` (a CPU torch.Generator; the tensors may live on any device).
    ``magnitude`` is on torchvision's 0..30 scale; with ``level = magnitude / 30`` and a random sign:
    rotate +-30 deg * level, shear +-0.3 * level, translate +-(150/331) * side * level rounded to whole pixels
    (an exact shift of the counts, no interpolation blur), brightness/contrast/sharpness factor 1 +- 0.9 * level,
    posterize to 8 - round(4 * level) bits; identity and autocontrast ignore it. Rotations and shears sample
    bilinearly with zero fill (no events) outside the image. Each op runs batched over the samples that drew it
    (one affine_grid + grid_sample per round for the warps). ``inplace=True`` reuses ``x`` (saves a copy when
    the caller owns it).
    """
    if x.ndim != 4:
        raise ValueError(f"rand_augment expects (B, C, H, W), got shape {tuple(x.shape)}")
    plan = draw_rand_augment(len(x), ops, magnitude, generator, op_names)
    return apply_rand_augment(x if inplace else x.clone(), plan)


def _warp_theta(ops: list[str], level: list[float], height: int, width: int) -> torch.Tensor:
    """affine_grid matrices (k, 2, 3) for a rotation or shear per sample (see ``_op_matrix``)."""
    theta = np.stack([_op_matrix(op, s, height, width)[:2] for op, s in zip(ops, level, strict=True)])
    return torch.from_numpy(theta).float()


def _affine_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Same as ``F.affine_grid(theta, (k, C, H, W), align_corners=False)`` -> (k, H, W, 2), ~5x faster on CPU.

    affine_grid multiplies a (k, H*W, 3) base grid by theta; two broadcast multiply-adds per coordinate
    written straight into the output do the same with less memory traffic.
    """
    xs = (torch.arange(width, device=theta.device, dtype=theta.dtype) * 2 + 1) / width - 1  # pixel centres in [-1, 1]
    ys = (torch.arange(height, device=theta.device, dtype=theta.dtype) * 2 + 1) / height - 1
    grid = torch.empty(len(theta), height, width, 2, device=theta.device, dtype=theta.dtype)
    for i in range(2):
        offset = (theta[:, i, 1, None] * ys + theta[:, i, 2, None])[:, :, None]  # (k, H, 1)
        torch.add(offset, theta[:, i, 0, None, None] * xs, out=grid[..., i])  # (k, H, W)
    return grid


def _translate_(img: torch.Tensor, dx: int, dy: int) -> None:
    """In place: img (C, H, W) -> img shifted by whole pixels, out[y, x] = in[y - dy, x - dx], zero fill."""
    height, width = img.shape[-2:]
    src = img[..., max(-dy, 0) : height - max(dy, 0), max(-dx, 0) : width - max(dx, 0)].clone()
    img.zero_()
    if src.numel():
        img[..., max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] = src


def _per_sample(level: torch.Tensor) -> torch.Tensor:
    return level[:, None, None, None]  # (k,) -> (k, 1, 1, 1)


def _brightness_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x.mul_(_per_sample(1 + 0.9 * s)).clamp_(0.0, 1.0)


def _contrast_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    f = 1 + 0.9 * s
    mean = x.flatten(1).mean(1)  # (k,) torchvision blends with the image mean
    return x.mul_(_per_sample(f)).add_(_per_sample((1 - f) * mean)).clamp_(0.0, 1.0)


def _sharpness_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Blend with torchvision's smoothed image (3x3 kernel [[1,1,1],[1,5,1],[1,1,1]] / 13, borders kept).

    f * x + (1 - f) * (box_sum + 4 * x) / 13 = a * x + b * box_sum on the interior. The 3x3 box sum is four
    shifted adds (avg_pool2d and depthwise conv2d are ~10x slower on CPU).
    """
    if x.shape[-1] < 3 or x.shape[-2] < 3:
        return x
    f = 1 + 0.9 * s
    a, b = _per_sample(f + 4 * (1 - f) / 13), _per_sample((1 - f) / 13)
    box = x[..., :-2, :] + x[..., 1:-1, :]
    box += x[..., 2:, :]  # (k, C, H-2, W) vertical 3-sums
    inner = x[..., 1:-1, 1:-1]
    blended = box[..., :-2] + box[..., 1:-1]
    blended += box[..., 2:]  # (k, C, H-2, W-2) 3x3 sums
    blended.mul_(b).add_(inner * a)
    inner.copy_(blended)
    return x.clamp_(0.0, 1.0)


def _posterize_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    levels = _per_sample(2.0 ** (8 - torch.round(4 * s.abs())))  # 8 bits at level 0, 4 bits at level 1
    return x.mul_(levels).floor_().div_(levels)


def _autocontrast_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    lo = x.amin((2, 3), keepdim=True)  # (k, C, 1, 1)
    span = x.amax((2, 3), keepdim=True) - lo
    return x.sub_(lo).div_(torch.where(span > 0, span, 1.0))


# Pixel ops on a gathered copy (modified in place): (x (k, C, H, W), signed level (k,) in [-1, 1]) -> x in [0, 1].
_PIXEL_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "brightness": _brightness_,
    "contrast": _contrast_,
    "sharpness": _sharpness_,
    "posterize": _posterize_,
    "autocontrast": _autocontrast_,
}


def _to_device(values: torch.Tensor | list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host tensor (or list) on ``device``: on a GPU through pinned memory without blocking, so the host
    goes on queueing work instead of waiting for the copy behind the work already queued (a plain copy from pageable
    memory waits)."""
    host = torch.as_tensor(values, dtype=dtype)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


def apply_rand_augment(out: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Apply ``plan`` to ``out`` (B, C, H, W) in place, one round at a time, each op batched over its samples.

    The rotations and shears of a round run as one affine_grid + grid_sample call (bilinear, zero fill).
    """
    _, _, height, width = out.shape
    for r in range(len(plan[0]) if plan else 0):
        names = [ops[r][0] for ops in plan]
        level = [ops[r][1] for ops in plan]

        warped = [i for i, name in enumerate(names) if name in _WARPS]
        if warped:
            idx = _to_device(warped, out.device)
            theta = _warp_theta([names[i] for i in warped], [level[i] for i in warped], height, width)
            grid = _affine_grid(_to_device(theta, out.device, out.dtype), height, width)
            warp = F.grid_sample(out[idx], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
            out[idx] = warp.clamp_(0.0, 1.0)  # bilinear weights sum to 1: the clamp only removes rounding

        for i, name in enumerate(names):
            if name in _TRANSLATES:
                _translate_(out[i], *_translation(name, level[i], height, width))

        for name, op in _PIXEL_OPS.items():
            members = [i for i, other in enumerate(names) if other == name]
            if members:
                idx = _to_device(members, out.device)
                out[idx] = op(out[idx], _to_device([level[i] for i in members], out.device, out.dtype))
    return out
