"""Training augmentations: event-level (before the histogram) and RandAugment on histogram tensors.

Event augmentations take ``EVENT_DTYPE`` arrays and an explicit ``np.random.Generator`` and return new arrays
(the input is never modified). ``rand_augment`` works on batched float tensors in [0, 1] with any number of
channels (timm's RandAugment is PIL-only, so 2-channel histograms need their own).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from mem_core.events import EVENT_DTYPE, SensorSize

if TYPE_CHECKING:
    from mem_core.representation import InputSpec

# ------------------------------------------------------------------------------------- event augmentations


def flip_polarity(events: np.ndarray) -> np.ndarray:
    """Swap ON and OFF (p -> 1 - p)."""
    out = events.copy()
    out["p"] = 1 - events["p"]
    return out


def hflip_events(events: np.ndarray, sensor: SensorSize) -> np.ndarray:
    """Mirror left-right: x -> W - 1 - x."""
    x = sensor.width - 1 - events["x"].astype(np.int32)
    if x.size and x.min() < 0:
        raise ValueError(f"events have x up to {int(events['x'].max())}, outside the sensor width {sensor.width}")
    out = events.copy()
    out["x"] = x
    return out


def shift_events(events: np.ndarray, sensor: SensorSize, dx: int, dy: int) -> np.ndarray:
    """Move every event by (dx, dy) pixels and drop the events that leave the sensor."""
    x = events["x"].astype(np.int32) + dx
    y = events["y"].astype(np.int32) + dy
    keep = (x >= 0) & (x < sensor.width) & (y >= 0) & (y < sensor.height)
    out = events[keep]  # boolean indexing copies
    out["x"] = x[keep]
    out["y"] = y[keep]
    return out


@njit(cache=True, nogil=True)
def _augment_kernel(events, out, flip, mirror, dx, dy, width, height):
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


def augment_events(events: np.ndarray, sensor: SensorSize, spec: InputSpec, rng: np.random.Generator) -> np.ndarray:
    """Training-time event augmentations drawn from ``rng``: polarity flip with ``spec.flip_polarity_p``,
    horizontal flip with ``spec.hflip_p``, then a shift of up to +-``spec.shift_px`` in x and y (uniform
    integers) that drops events leaving the frame. Returns a new array.

    Equal to composing ``flip_polarity``, ``hflip_events`` and ``shift_events``, done in one numba pass (the
    three numpy steps cost ~1 ms on a 30 000-event window, mostly copies of the 13-byte records).
    """
    flip = bool(rng.random() < spec.flip_polarity_p)
    mirror = bool(rng.random() < spec.hflip_p)
    dx, dy = (int(d) for d in rng.integers(-spec.shift_px, spec.shift_px + 1, size=2)) if spec.shift_px else (0, 0)
    out = np.empty(len(events), EVENT_DTYPE)
    kept, invalid = _augment_kernel(events, out, flip, mirror, dx, dy, sensor.width, sensor.height)
    if invalid:
        raise ValueError(f"{invalid} events fall outside the sensor {sensor.width}x{sensor.height} (width x height)")
    return out[:kept]


# -------------------------------------------------------------------------------------------- RandAugment

MAX_MAGNITUDE = 30
"""Top of the magnitude scale (torchvision's RandAugment uses 31 bins, 0..30)."""

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
_GEOMETRIC = ("identity", *_WARPS, *_TRANSLATES)

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

    Per round, one ``torch.randint`` draws every sample's op and one its sign, so the same generator state gives
    the same plan however the plan is then applied (CPU kernel or torch ops).
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
    bilinearly with zero fill (no events) outside the image. float32/float64 CPU batches run through a
    compiled per-sample kernel (``resize_and_augment``), other devices and dtypes through batched torch ops
    (affine_grid + grid_sample); the two agree up to interpolation rounding and the half-pixel image border of
    rotations and shears. ``inplace=True`` reuses ``x`` (saves a copy when the caller owns it).
    """
    if x.ndim != 4:
        raise ValueError(f"rand_augment expects (B, C, H, W), got shape {tuple(x.shape)}")
    plan = draw_rand_augment(len(x), ops, magnitude, generator, op_names)
    if _kernel_ok(x) and (x.is_contiguous() or not inplace):
        return resize_and_augment(x, tuple(x.shape[-2:]), plan, out=x if inplace else None)
    return _rand_augment_torch(x if inplace else x.clone(), plan)


# ------------------------------------------------------------------------------------- RandAugment, torch ops


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


def _rand_augment_torch(out: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Apply ``plan`` to ``out`` (B, C, H, W) in place, one round at a time, each op batched over its samples.

    The rotations and shears of a round run as one affine_grid + grid_sample call (bilinear, zero fill).
    """
    _, _, height, width = out.shape
    for r in range(len(plan[0]) if plan else 0):
        names = [ops[r][0] for ops in plan]
        level = [ops[r][1] for ops in plan]

        warped = [i for i, name in enumerate(names) if name in _WARPS]
        if warped:
            idx = torch.tensor(warped, device=out.device)
            theta = _warp_theta([names[i] for i in warped], [level[i] for i in warped], height, width)
            grid = _affine_grid(theta.to(out.device, out.dtype), height, width)
            warp = F.grid_sample(out[idx], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
            out[idx] = warp.clamp_(0.0, 1.0)  # bilinear weights sum to 1: the clamp only removes rounding

        for i, name in enumerate(names):
            if name in _TRANSLATES:
                _translate_(out[i], *_translation(name, level[i], height, width))

        for name, op in _PIXEL_OPS.items():
            members = [i for i, other in enumerate(names) if other == name]
            if members:
                idx = torch.tensor(members, device=out.device)
                out[idx] = op(out[idx], torch.tensor([level[i] for i in members], device=out.device, dtype=out.dtype))
    return out


# --------------------------------------------------------------------------- RandAugment, compiled CPU kernel
#
# One pass per sample while it sits in the cache: resample (resize, or resize composed with the sample's leading
# geometric ops), then its remaining ops in place. A batch-wide torch op costs a full pass over the (B, C, 224,
# 224) batch in memory, and a gathered subset two more (index + scatter); this kernel writes each output once.

_K_WARP, _K_SHIFT, _K_BRIGHTNESS, _K_CONTRAST, _K_SHARPNESS, _K_POSTERIZE, _K_AUTOCONTRAST = range(7)
_K_PIXEL = {
    "brightness": _K_BRIGHTNESS,
    "contrast": _K_CONTRAST,
    "sharpness": _K_SHARPNESS,
    "posterize": _K_POSTERIZE,
    "autocontrast": _K_AUTOCONTRAST,
}


def _kernel_ok(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


@functools.lru_cache(maxsize=64)
def _linear_table(n_out: int, n_in: int) -> tuple[np.ndarray, ...]:
    """Source indices and weights (i0, i1, w0, w1) of bilinear resizing along one axis, as F.interpolate computes
    them (align_corners=False, no antialias; float32 arithmetic, source index clamped at 0 and at the last pixel).
    """
    out_index = np.arange(n_out, dtype=np.uintp)
    if n_out == n_in:
        table = out_index, out_index, np.ones(n_out, np.float32), np.zeros(n_out, np.float32)
    else:
        scale = np.float32(n_in) / np.float32(n_out)
        real = np.maximum(scale * (out_index.astype(np.float32) + np.float32(0.5)) - np.float32(0.5), np.float32(0))
        i0 = np.minimum(np.floor(real).astype(np.uintp), n_in - 1)
        w1 = np.clip(real - i0.astype(np.float32), 0, 1).astype(np.float32)
        table = i0, i0 + (i0 < n_in - 1), (np.float32(1) - w1).astype(np.float32), w1
    for a in table:
        a.setflags(write=False)  # cached and shared
    return table


def _pixel_affine(m: np.ndarray, src_hw: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """Normalized (3, 3) affine -> (6,) coefficients (a, b, c, d, e, f): output pixel (X, Y) samples the source
    pixel (a X + b Y + c, d X + e Y + f), with align_corners=False pixel centres on both sides."""
    to_pixel, to_norm = _pixel_frames(*src_hw, *out_hw)
    return (to_pixel @ m @ to_norm)[:2].ravel().astype(np.float32)


@functools.lru_cache(maxsize=64)
def _pixel_frames(h: int, w: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(3, 3) maps: normalized coordinates -> source pixels, output pixels -> normalized coordinates."""
    to_pixel = np.array([[w / 2, 0, (w - 1) / 2], [0, h / 2, (h - 1) / 2], [0, 0, 1]])
    to_norm = np.array([[2 / width, 0, 1 / width - 1], [0, 2 / height, 1 / height - 1], [0, 0, 1]])
    to_pixel.setflags(write=False)
    to_norm.setflags(write=False)
    return to_pixel, to_norm


def _compile_plan(plan: Plan, src_hw: tuple[int, int], out_hw: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Per-sample programs for ``_rand_augment_kernel`` (see ``_sample_program``), stacked over the batch."""
    n, rounds = len(plan), max((len(ops) for ops in plan), default=0)
    lead_warp = np.zeros(n, np.bool_)
    lead = np.zeros((n, 6), np.float32)
    codes = np.full((n, max(rounds, 1)), -1, np.int64)
    params = np.zeros((n, max(rounds, 1), 6), np.float32)
    for i, ops in enumerate(plan):
        if ops:
            lead_warp[i], lead[i], codes[i, : len(ops)], params[i, : len(ops)] = _sample_program(
                tuple(ops), src_hw, out_hw
            )
    return lead_warp, lead, codes, params


@functools.lru_cache(maxsize=4096)  # a batch draws from few distinct op sequences (22 x 22 for two ops)
def _sample_program(
    ops: tuple[tuple[str, float], ...], src_hw: tuple[int, int], out_hw: tuple[int, int]
) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
    """One sample's program: (lead_warp, lead (6,), codes (len(ops),), params (len(ops), 6)).

    The leading run of geometric ops (identity, translate, rotate, shear) is composed with the resize into one
    resampling: a whole-pixel shift of the resized image (``lead_warp`` False, the shift in ``lead[:2]``) or an
    affine (``lead_warp`` True, its coefficients in ``lead``). The ops from the first pixel op on become
    ``codes`` (-1 = none) with ``params``: a warp's coefficients, a shift, a factor or posterize levels.
    """
    height, width = out_hw
    m, shift, warped, r = np.eye(3), [0, 0], False, 0
    while r < len(ops) and ops[r][0] in _GEOMETRIC:
        name, level = ops[r]
        m = m @ _op_matrix(name, level, height, width)
        warped |= name in _WARPS
        if name in _TRANSLATES:
            dx, dy = _translation(name, level, height, width)
            shift = [shift[0] + dx, shift[1] + dy]
        r += 1
    lead = _pixel_affine(m, src_hw, out_hw) if warped else np.array([*shift, 0, 0, 0, 0], np.float32)
    codes, params, k = np.full(len(ops), -1, np.int64), np.zeros((len(ops), 6), np.float32), 0
    for name, level in ops[r:]:
        if name in _WARPS:
            codes[k], params[k] = _K_WARP, _pixel_affine(_op_matrix(name, level, height, width), out_hw, out_hw)
        elif name in _TRANSLATES:
            codes[k], params[k, :2] = _K_SHIFT, _translation(name, level, height, width)
        elif name == "posterize":
            bits = 8 - np.round(4 * abs(np.float32(level)))  # round half to even, as torch.round
            codes[k], params[k, 0] = _K_POSTERIZE, 2.0**bits
        elif name != "identity":
            codes[k], params[k, 0] = _K_PIXEL[name], np.float32(1) + np.float32(0.9) * np.float32(level)  # as torch
        k += name != "identity"
    for a in (lead, codes, params):
        a.setflags(write=False)
    return warped, lead, codes, params


def resize_and_augment(
    x: torch.Tensor, size: tuple[int, int], plan: Plan | None = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Bilinear resize of a CPU float batch x (B, C, h, w) to ``size`` (height, width), then ``plan``'s RandAugment
    ops (from ``draw_rand_augment``), in one compiled pass per sample -> (B, C, *size).

    The resize is ``F.interpolate(mode="bilinear", align_corners=False)`` without antialiasing, so ``size`` must
    not be smaller than (h, w) (shrink with an antialiased resize first). A sample's leading geometric ops are
    composed with the resize into one sampling of ``x`` (a resize is an affine map too): a whole-pixel
    translation is then an exact shift of the resized image, a rotation or shear one bilinear interpolation
    instead of two (edge pixels clamped inside the image, zero outside it). ``out`` may be ``x`` itself.
    """
    if x.ndim != 4 or not _kernel_ok(x):
        raise ValueError(f"resize_and_augment needs a float32/float64 CPU batch (B, C, H, W), got {x.dtype} {x.shape}")
    size = (int(size[0]), int(size[1]))
    src_hw = tuple(x.shape[-2:])
    if size[0] < src_hw[0] or size[1] < src_hw[1]:
        raise ValueError(f"resize_and_augment upsamples only: {src_hw} -> {size} needs an antialiased resize first")
    if out is None:
        # numpy backs arrays of >= 4 MB with transparent huge pages (madvise), torch's allocator does not: first
        # touching a fresh (64, 2, 224, 224) torch tensor costs ~100 page faults per sample, as much as the resize.
        out = torch.from_numpy(np.empty((*x.shape[:2], *size), torch.empty(0, dtype=x.dtype).numpy().dtype))
    elif out.shape != (*x.shape[:2], *size) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {(*x.shape[:2], *size)}")
    if plan is not None and len(plan) != len(x):
        raise ValueError(f"the plan covers {len(plan)} samples, the batch has {len(x)}")
    src = x.detach().contiguous()
    lead_warp, lead, codes, params = _compile_plan(plan or [[] for _ in range(len(x))], src_hw, size)
    alias = src.data_ptr() == out.data_ptr()
    tables = (*_linear_table(size[0], src_hw[0]), *_linear_table(size[1], src_hw[1]))
    _rand_augment_kernel(src.numpy(), out.detach().numpy(), alias, lead_warp, lead, codes, params, *tables)
    return out


@njit(cache=True, nogil=True)
def _resize_shifted(src, out, dx, dy, y0, y1, wy0, wy1, x0, x1, wx0, wx1, rows):
    """out (C, H, W) = bilinear resize of src (C, h, w) moved by (dx, dy) whole output pixels, zero fill.

    The tables (``_linear_table``, indices unsigned so that numba skips negative-index checks) give the source
    rows/columns and weights of each output row/column; loops run over views so their indices start at 0.
    """
    h = src.shape[1]
    height, width = out.shape[1], out.shape[2]
    xa, xb = max(dx, 0), min(width + dx, width)
    ya, yb = max(dy, 0), min(height + dy, height)
    if xa >= xb or ya >= yb:
        out[:] = 0
        return
    cols = xb - xa
    c0, c1, u0, u1 = x0[xa - dx : xb - dx], x1[xa - dx : xb - dx], wx0[xa - dx : xb - dx], wx1[xa - dx : xb - dx]
    for c in range(src.shape[0]):
        plane, dst = src[c], out[c]
        for r in range(h):  # horizontal pass into rows (h, W); the products F.interpolate forms
            line, row = plane[r], rows[r, xa:xb]
            for j in range(cols):
                row[j] = line[c0[j]] * u0[j] + line[c1[j]] * u1[j]
        dst[:ya] = 0
        dst[yb:] = 0
        for i in range(ya, yb):
            k = i - dy
            top, bottom, line = rows[y0[k], xa:xb], rows[y1[k], xa:xb], dst[i]
            u, v = wy0[k], wy1[k]
            line[:xa] = 0
            line[xb:] = 0
            inner = line[xa:xb]
            for j in range(cols):
                inner[j] = top[j] * u + bottom[j] * v


@njit(cache=True, nogil=True)
def _warp(src, out, coef, xs, index, step_x, step_y, frac_x, frac_y, inside):
    """out (C, H, W) = src (C, h, w) sampled bilinearly at source pixel (a X + b Y + c, d X + e Y + f).

    Inside the image extent [-0.5, w - 0.5] x [-0.5, h - 0.5] the point is clamped to the edge pixel centres (as
    F.interpolate does), outside it the output is 0. A row's addresses and weights go to the 1-D buffers first.
    """
    h, w = src.shape[1], src.shape[2]
    height, width = out.shape[1], out.shape[2]
    a, b, c, d, e, f = coef[0], coef[1], coef[2], coef[3], coef[4], coef[5]
    zero, half = np.float32(0), np.float32(0.5)
    x_max, y_max = np.float32(w - 1), np.float32(h - 1)
    for i in range(height):
        row_x = b * np.float32(i) + c
        row_y = e * np.float32(i) + f
        for j in range(width):
            px = a * xs[j] + row_x
            py = d * xs[j] + row_y
            ok = -half <= px <= x_max + half and -half <= py <= y_max + half
            px = min(max(px, zero), x_max)
            py = min(max(py, zero), y_max)
            ix, iy = np.uintp(px), np.uintp(py)  # px, py >= 0: truncation is floor
            frac_x[j], frac_y[j] = px - np.float32(ix), py - np.float32(iy)
            index[j] = iy * np.uintp(w) + ix
            step_x[j] = 1 if ix < x_max else 0
            step_y[j] = w if iy < y_max else 0
            inside[j] = 1 if ok else 0
        for ch in range(src.shape[0]):
            plane, line = src[ch].reshape(h * w), out[ch, i]
            for j in range(width):
                k = index[j]
                k_down = k + step_y[j]
                v00, v01 = plane[k], plane[k + step_x[j]]
                v10, v11 = plane[k_down], plane[k_down + step_x[j]]
                top = v00 + frac_x[j] * (v01 - v00)
                bottom = v10 + frac_x[j] * (v11 - v10)
                line[j] = inside[j] * (top + frac_y[j] * (bottom - top))


@njit(cache=True, nogil=True, fastmath=True)
def _mean(x):
    """Mean of a 1-D array, accumulated in float64 (fastmath: vectorized, order-free reduction)."""
    total = 0.0
    for i in range(x.size):  # an index loop vectorizes, ``for v in x`` does not
        total += np.float64(x[i])
    return total / max(x.size, 1)


@njit(cache=True, nogil=True, fastmath=True)
def _min_max(x):
    """(min, max) of a non-empty 1-D array: elementwise over 64-wide blocks first (this vectorizes, a running
    min/max does not: ~6x faster), then within the block."""
    lanes = 64
    stop = x.size - x.size % lanes
    lo, hi = x[0], x[0]
    if stop:
        lo_lanes, hi_lanes = x[:lanes].copy(), x[:lanes].copy()
        for start in range(lanes, stop, lanes):
            block = x[start : start + lanes]
            for k in range(lanes):
                lo_lanes[k] = min(lo_lanes[k], block[k])
                hi_lanes[k] = max(hi_lanes[k], block[k])
        for k in range(lanes):
            lo, hi = min(lo, lo_lanes[k]), max(hi, hi_lanes[k])
    for i in range(stop, x.size):
        lo, hi = min(lo, x[i]), max(hi, x[i])
    return lo, hi


@njit(cache=True, nogil=True)
def _copy(dst, src):
    """dst[...] = src for C-contiguous arrays of one size: a flat loop, ~3x faster than numba's slice copy."""
    flat_dst, flat_src = dst.reshape(dst.size), src.reshape(src.size)
    for i in range(flat_dst.size):
        flat_dst[i] = flat_src[i]


@njit(cache=True, nogil=True)
def _sharpness(img, f, rows):
    """torchvision's sharpness on img (C, H, W) in place (the torch op's formula and summation order).

    Row i is rewritten from the original rows i - 1, i, i + 1: ``rows`` (3, W) keeps the original of the row
    above (already rewritten) and of the current one, instead of a copy of the whole image.
    """
    height, width = img.shape[1], img.shape[2]
    if height < 3 or width < 3:
        return
    zero, one, four, thirteen = img.dtype.type(0), img.dtype.type(1), img.dtype.type(4), img.dtype.type(13)
    a = f + four * (one - f) / thirteen
    b = (one - f) / thirteen
    colsum = rows[2]
    for c in range(img.shape[0]):
        up, mid = rows[0], rows[1]
        _copy(up, img[c, 0])
        for i in range(1, height - 1):
            line, down = img[c, i], img[c, i + 1]
            _copy(mid, line)
            for j in range(width):
                colsum[j] = up[j] + mid[j] + down[j]
            for j in range(1, width - 1):
                box = colsum[j - 1] + colsum[j] + colsum[j + 1]
                line[j] = min(max(box * b + mid[j] * a, zero), one)
            up, mid = mid, up


@njit(cache=True, nogil=True)
def _rand_augment_kernel(src, out, alias, lead_warp, lead, codes, params, y0, y1, wy0, wy1, x0, x1, wx0, wx1):
    """Every sample of src (B, C, h, w): resize + leading geometry into out (B, C, H, W), then its other ops."""
    n, channels, h = src.shape[0], src.shape[1], src.shape[2]
    height, width = out.shape[2], out.shape[3]
    dtype = out.dtype
    scratch = np.empty((channels, height, width), dtype)
    rows = np.empty((h, width), dtype)
    xs = np.arange(width).astype(np.float32)
    index, step_x, step_y = np.empty(width, np.uintp), np.empty(width, np.uintp), np.empty(width, np.uintp)
    frac_x, frac_y, inside = np.empty(width, np.float32), np.empty(width, np.float32), np.empty(width, dtype)
    rows3 = np.empty((3, width), dtype)
    zero, one = dtype.type(0), dtype.type(1)
    for s in range(n):
        img, flat = out[s], out[s].reshape(out[s].size)
        dx, dy = np.int64(lead[s, 0]), np.int64(lead[s, 1])
        source = src[s]
        if alias and (lead_warp[s] or dx != 0 or dy != 0):
            _copy(scratch, source)
            source = scratch
        if lead_warp[s]:
            _warp(source, img, lead[s], xs, index, step_x, step_y, frac_x, frac_y, inside)
        elif not alias or dx != 0 or dy != 0:
            _resize_shifted(source, img, dx, dy, y0, y1, wy0, wy1, x0, x1, wx0, wx1, rows)
        for r in range(codes.shape[1]):
            code, p = codes[s, r], params[s, r]
            f = dtype.type(p[0])
            if code < 0:
                break
            if code == _K_WARP:
                _copy(scratch, img)
                _warp(scratch, img, p, xs, index, step_x, step_y, frac_x, frac_y, inside)
            elif code == _K_SHIFT:
                sx, sy = np.int64(p[0]), np.int64(p[1])
                _copy(scratch, img)
                img[:] = 0
                if abs(sx) < width and abs(sy) < height:
                    img[:, max(sy, 0) : height + min(sy, 0), max(sx, 0) : width + min(sx, 0)] = scratch[
                        :, max(-sy, 0) : height - max(sy, 0), max(-sx, 0) : width - max(sx, 0)
                    ]
            elif code == _K_BRIGHTNESS:
                for k in range(flat.size):
                    flat[k] = min(max(flat[k] * f, zero), one)
            elif code == _K_CONTRAST:
                offset = (one - f) * dtype.type(_mean(flat))
                for k in range(flat.size):
                    flat[k] = min(max(flat[k] * f + offset, zero), one)
            elif code == _K_SHARPNESS:
                _sharpness(img, f, rows3)
            elif code == _K_POSTERIZE:
                for k in range(flat.size):
                    flat[k] = np.floor(flat[k] * f) / f
            else:  # _K_AUTOCONTRAST
                for c in range(channels):
                    plane = img[c].reshape(height * width)
                    lo, hi = _min_max(plane)
                    span = hi - lo if hi > lo else one
                    for k in range(plane.size):
                        plane[k] = (plane[k] - lo) / span
