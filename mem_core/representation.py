"""Model input: event histograms and the events -> tensor pipeline (DESIGN.md §3 "Representation").

Histograms are numpy float32 at sensor resolution with exact counts (no uint8/int16 wrap-around):

- ``event_histogram``      (2, H, W): channel 0 = OFF, 1 = ON.
- ``temporal_histogram``   (2 * bins, H, W): channel ``2 * b + p`` counts polarity ``p`` in time bin ``b``.
- ``timestamp_histogram``  (3, H, W): OFF and ON counts, then the normalized time of each pixel's newest event.

The model input for one sample (``preprocess``) or a padded batch (``collate_events`` + ``batch_preprocess``):
window of up to ``n_max`` events (random at train, centred at evaluation) -> event augmentations (train) ->
histogram -> hot pixels zeroed -> normalize to [0, 1] -> resize (+ crop) -> log scale (``scale="log"``) ->
RandAugment (train).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit
from torch.utils.data import get_worker_info

from mem_core.augment import (
    MAX_MAGNITUDE,
    Plan,
    _kernel_ok,
    _mean,
    _min_max,
    augment_events,
    draw_rand_augment,
    rand_augment,
    resize_and_augment,
)
from mem_core.events import EVENT_DTYPE, SensorSize, center_window, random_window

Channels = Literal["hist", "temporal", "timestamp"]
CHANNELS: tuple[str, ...] = ("hist", "temporal", "timestamp")
Scale = Literal["linear", "log"]
SCALES: tuple[str, ...] = ("linear", "log")
LOG_GAIN = 50.0  # default gain of the log scale (``log_scale``)

# float32 holds every integer up to 2**24 exactly, so a window of at most that many events is counted straight
# into float32; longer streams are counted in int64 and converted (counts above 2**24 then round to float32).
_FLOAT32_EXACT = 2**24


# --------------------------------------------------------------------------------------------- numba kernels


@njit(cache=True, nogil=True)
def _count_kernel(x, y, p, counts):
    """``counts[p, y, x] += 1`` per event; returns how many events were skipped as out of range."""
    height, width = counts.shape[1], counts.shape[2]
    skipped = 0
    for i in range(x.shape[0]):
        xi, yi, pi = x[i], y[i], p[i]
        if 0 <= xi < width and 0 <= yi < height and 0 <= pi < 2:
            counts[pi, yi, xi] += 1
        else:
            skipped += 1
    return skipped


@njit(cache=True, nogil=True)
def _temporal_kernel(t, x, y, p, t0, ticks, counts):
    """``counts[b, p, y, x] += 1`` with time bin ``b = (t - t0) * bins // ticks``; returns the skipped count."""
    bins, height, width = counts.shape[0], counts.shape[2], counts.shape[3]
    skipped = 0
    for i in range(x.shape[0]):
        b = (t[i] - t0) * bins // ticks
        xi, yi, pi = x[i], y[i], p[i]
        if 0 <= b < bins and 0 <= xi < width and 0 <= yi < height and 0 <= pi < 2:
            counts[b, pi, yi, xi] += 1
        else:
            skipped += 1
    return skipped


@njit(cache=True, nogil=True)
def _timestamp_kernel(t, x, y, p, t0, span, counts, newest):
    """Counts as ``_count_kernel`` plus ``newest[y, x] = (t - t0) / span`` of the pixel's last event."""
    height, width = counts.shape[1], counts.shape[2]
    skipped = 0
    for i in range(x.shape[0]):
        dt = t[i] - t0
        xi, yi, pi = x[i], y[i], p[i]
        if 0 <= dt <= span and 0 <= xi < width and 0 <= yi < height and 0 <= pi < 2:
            counts[pi, yi, xi] += 1
            # Events are sorted by time, so the last write is the newest event; a zero span means "all newest".
            newest[yi, xi] = dt / span if span > 0 else 1.0
        else:
            skipped += 1
    return skipped


def _fill_histogram(out: np.ndarray, channels: str, t, x, y, p) -> int:
    """Fill the zeroed float32 ``out`` (C, H, W) from event columns; returns the number of skipped events."""
    n = len(x)
    if n == 0:
        return 0
    n_counts = 2 if channels == "timestamp" else out.shape[0]
    exact = n <= _FLOAT32_EXACT
    counts = out[:n_counts] if exact else np.zeros((n_counts, *out.shape[1:]), np.int64)
    if channels == "hist":
        skipped = _count_kernel(x, y, p, counts)
    elif channels == "temporal":
        height, width = out.shape[1:]
        t0 = int(t[0])
        ticks = int(t[-1]) - t0 + 1  # the window covers ticks microseconds [t0, t_last], split evenly into bins
        skipped = _temporal_kernel(t, x, y, p, t0, ticks, counts.reshape(-1, 2, height, width))  # (bins, 2, H, W)
    else:
        skipped = _timestamp_kernel(t, x, y, p, int(t[0]), int(t[-1]) - int(t[0]), counts, out[2])
    if not exact:
        out[:n_counts] = counts
    return skipped


@njit(cache=True, nogil=True, fastmath=True)
def _mean_square_deviation(x, mean):
    total = 0.0
    for i in range(x.size):  # an index loop vectorizes, ``for v in x`` does not
        d = np.float64(x[i]) - mean
        total += d * d
    return total / max(x.size, 1)


@njit(cache=True, nogil=True)
def _hot_normalize_kernel(hist, n_counts, remove_hot, num_std, tiny):
    """In place, per sample of hist (B, C, H, W): ``remove_hot_pixels`` (if ``remove_hot``), then
    ``normalize_histogram``, both over the first ``n_counts`` channels (mean and std accumulated in float64)."""
    channels, pixels = hist.shape[1], hist.shape[2] * hist.shape[3]
    hot = np.empty(pixels, np.bool_)
    for b in range(hist.shape[0]):
        sample = hist[b].reshape(channels, pixels)
        counts = hist[b, :n_counts].reshape(n_counts * pixels)
        peak = _min_max(counts)[1]
        if remove_hot:
            mean = _mean(counts)
            threshold = hist.dtype.type(mean + num_std * np.sqrt(_mean_square_deviation(counts, mean)))
            if peak > threshold:  # some pixel is hot
                hot[:] = False
                for c in range(n_counts):
                    for i in range(pixels):
                        hot[i] |= sample[c, i] > threshold
                for c in range(channels):
                    for i in range(pixels):
                        if hot[i]:
                            sample[c, i] = 0
                peak = _min_max(counts)[1]
        peak = hist.dtype.type(max(peak, tiny))
        for k in range(counts.size):
            counts[k] = counts[k] / peak


# ------------------------------------------------------------------------------------------ numpy histograms


def _n_channels(channels: str, bins: int) -> int:
    if channels not in CHANNELS:
        raise ValueError(f"unknown histogram channels {channels!r}; expected one of {CHANNELS}")
    if bins < 1:
        raise ValueError(f"temporal bins must be >= 1, got {bins}")
    return {"hist": 2, "temporal": 2 * bins, "timestamp": 3}[channels]


def _skipped_error(skipped: int, n: int, sensor: SensorSize) -> ValueError:
    return ValueError(
        f"{skipped} of {n} events fall outside the sensor {sensor.width}x{sensor.height} (width x height), "
        f"have polarity > 1, or are not sorted by time"
    )


def input_histogram(events: np.ndarray, sensor: SensorSize, channels: Channels = "hist", bins: int = 4) -> np.ndarray:
    """Histogram of ``events`` at sensor resolution: float32 (C, H, W) for ``channels`` (see module docstring)."""
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        raise ValueError(f"events must be a numpy array of EVENT_DTYPE, got {getattr(events, 'dtype', type(events))}")
    if sensor.height <= 0 or sensor.width <= 0:
        raise ValueError(f"sensor must have a positive size, got {sensor}")
    out = np.zeros((_n_channels(channels, bins), sensor.height, sensor.width), np.float32)
    skipped = _fill_histogram(out, channels, events["t"], events["x"], events["y"], events["p"])
    if skipped:
        raise _skipped_error(skipped, len(events), sensor)
    return out


def event_histogram(events: np.ndarray, sensor: SensorSize) -> np.ndarray:
    """Exact per-pixel event counts, float32 (2, H, W): channel 0 = OFF, channel 1 = ON."""
    return input_histogram(events, sensor, "hist")


def temporal_histogram(events: np.ndarray, sensor: SensorSize, bins: int = 4) -> np.ndarray:
    """Counts per time bin and polarity, float32 (2 * bins, H, W); channel ``2 * b + p`` is bin ``b``, polarity ``p``.

    The bins split the window's time span ``[t_first, t_last]`` into ``bins`` equal parts; summing over the
    bins (``reshape(bins, 2, H, W).sum(0)``) gives ``event_histogram``.
    """
    return input_histogram(events, sensor, "temporal", bins)


def timestamp_histogram(events: np.ndarray, sensor: SensorSize) -> np.ndarray:
    """OFF and ON counts plus the newest event time per pixel, float32 (3, H, W).

    Channel 2 is ``(t_newest - t_first) / (t_last - t_first)`` in [0, 1] for pixels with events (1 when the
    window has zero duration) and 0 where there is no event.
    """
    return input_histogram(events, sensor, "timestamp")


# ---------------------------------------------------------------------------------------------- input spec


@dataclass(frozen=True)
class InputSpec:
    """How events become a model input; stored with every model so that serving builds the same input.

    ``randaug_magnitude`` uses torchvision's RandAugment scale 0..30 (see ``mem_core.augment.rand_augment``).
    ``resize_to`` (e.g. (256, 341) for N-ImageNet) resizes first, then crops ``size``: random at train, centred
    at evaluation. ``hot_pixel_std=None`` disables hot-pixel removal; ``temporal_bins`` is used by "temporal".
    ``scale`` is how counts map to [0, 1]: "linear" (divide by the peak, the paper's) or "log" (then
    ``log_scale`` with ``log_gain`` after the resize).
    """

    n_max: int = 30000
    size: tuple[int, int] = (224, 224)
    channels: Channels = "hist"
    resize_to: tuple[int, int] | None = None
    hot_pixel_std: float | None = 10.0
    scale: Scale = "linear"
    log_gain: float = LOG_GAIN
    shift_px: int = 15
    flip_polarity_p: float = 0.5
    hflip_p: float = 0.5
    randaug_ops: int = 2
    randaug_magnitude: float = 20
    temporal_bins: int = 4

    def __post_init__(self) -> None:
        # Accept lists (from JSON/TOML) for the sizes and store tuples, so specs compare and hash by value.
        object.__setattr__(self, "size", _size_pair("size", self.size))
        if self.resize_to is not None:
            object.__setattr__(self, "resize_to", _size_pair("resize_to", self.resize_to))
            if self.resize_to[0] < self.size[0] or self.resize_to[1] < self.size[1]:
                raise ValueError(f"resize_to {self.resize_to} must be at least size {self.size} to crop from")
        _n_channels(self.channels, self.temporal_bins)
        if self.n_max <= 0:
            raise ValueError(f"n_max must be positive, got {self.n_max}")
        if self.shift_px < 0 or self.randaug_ops < 0:
            raise ValueError(f"shift_px and randaug_ops must be >= 0, got {self.shift_px}, {self.randaug_ops}")
        if self.scale not in SCALES:
            raise ValueError(f"unknown input scale {self.scale!r}; expected one of {SCALES}")
        if not (math.isfinite(self.log_gain) and self.log_gain > 0):
            raise ValueError(f"log_gain must be a positive number, got {self.log_gain}")
        for name in ("flip_polarity_p", "hflip_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.randaug_magnitude <= MAX_MAGNITUDE:
            raise ValueError(f"randaug_magnitude must be in [0, {MAX_MAGNITUDE}], got {self.randaug_magnitude}")

    @property
    def in_chans(self) -> int:
        """Number of input channels of the model (2, 2 * temporal_bins or 3)."""
        return _n_channels(self.channels, self.temporal_bins)

    @property
    def count_channels(self) -> int:
        """How many leading channels hold counts (the timestamp channel is not a count)."""
        return 2 if self.channels == "timestamp" else self.in_chans

    def to_dict(self) -> dict:
        """Plain dict for JSON/TOML (``InputSpec(**d)`` restores it)."""
        return dataclasses.asdict(self)


def _size_pair(name: str, value: Sequence[int]) -> tuple[int, int]:
    pair = tuple(int(v) for v in value)
    if len(pair) != 2 or min(pair) <= 0:
        raise ValueError(f"{name} must be (height, width) with positive values, got {value!r}")
    return pair  # type: ignore[return-value]


# ------------------------------------------------------------------------------------ tensor pipeline stages


def remove_hot_pixels(hist: torch.Tensor, num_std: float, count_channels: int | None = None) -> torch.Tensor:
    """Zero hot pixels: any count above ``mean + num_std * std`` of the sample's counts. hist: (B, C, H, W).

    Mean and (population) std are over all pixels of the first ``count_channels`` channels of each sample. A
    pixel that is hot in any count channel is zeroed in every channel (a hot pixel is a sensor defect, so its
    other polarity and its timestamp are not trusted either). Returns a new tensor.
    """
    n = hist.shape[1] if count_channels is None else count_channels
    counts = hist[:, :n]
    flat = counts.flatten(1)  # (B, n * H * W)
    mean = flat.mean(1, keepdim=True)  # (B, 1)
    std = (flat - mean).square_().mean(1, keepdim=True).sqrt_()  # two passes: torch.std_mean is ~5x slower on CPU
    threshold = (mean + num_std * std)[:, :, None, None]  # (B, 1, 1, 1)
    hot = counts.amax(1, keepdim=True) > threshold  # (B, 1, H, W)
    return hist.masked_fill(hot, 0.0)


def resize_histogram(hist: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of (B, C, H, W) to ``size`` (height, width), antialiased when a side shrinks."""
    height, width = hist.shape[-2:]
    if (height, width) == tuple(size):
        return hist
    antialias = size[0] < height or size[1] < width
    return F.interpolate(hist, size=tuple(size), mode="bilinear", align_corners=False, antialias=antialias)


def crop_histogram(hist: torch.Tensor, size: tuple[int, int], generator: torch.Generator | None = None) -> torch.Tensor:
    """Crop (B, C, H, W) to ``size``: the centre without ``generator``, a random window per sample with it."""
    height, width = hist.shape[-2:]
    h, w = size
    if h > height or w > width:
        raise ValueError(f"cannot crop {size} from a histogram of {(height, width)}")
    if generator is None:
        top, left = (height - h) // 2, (width - w) // 2
        return hist[..., top : top + h, left : left + w]
    tops = torch.randint(height - h + 1, (len(hist),), generator=generator).tolist()
    lefts = torch.randint(width - w + 1, (len(hist),), generator=generator).tolist()
    return torch.stack([s[:, i : i + h, j : j + w] for s, i, j in zip(hist, tops, lefts, strict=True)])


def normalize_histogram(hist: torch.Tensor, count_channels: int | None = None) -> torch.Tensor:
    """Divide the count channels of each sample by their maximum: values in [0, 1], the peak exactly 1.

    Why the maximum: a linear map keeps what the counts mean (an edge with twice the events stays twice as
    bright, the OFF/ON balance is kept), it removes the dependence on window length and resolution, and it
    lands exactly in the [0, 1] range that RandAugment's ops assume (the reference implementation does the
    same). Hot pixels must be removed first or one of them sets the scale. An empty sample stays all zeros
    (no NaN). Channels after ``count_channels`` (the timestamp) are already in [0, 1] and are left alone.
    """
    n = hist.shape[1] if count_channels is None else count_channels
    counts = hist[:, :n]
    peak = counts.flatten(1).amax(1).clamp_min(torch.finfo(hist.dtype).tiny)  # (B,); 0 / tiny = 0 for empty
    scaled = counts / peak[:, None, None, None]
    return scaled if n == hist.shape[1] else torch.cat([scaled, hist[:, n:]], 1)


def log_scale(
    hist: torch.Tensor, count_channels: int | None = None, gain: float = LOG_GAIN, *, inplace: bool = False
) -> torch.Tensor:
    """``log1p(gain * x) / log1p(gain)`` of the count channels of normalized, resized inputs: [0, 1] -> [0, 1].

    Empty pixels stay 0 and the peak stays 1, but a pixel at ``1 / gain`` of the peak is lifted from near-black to
    ``log 2 / log(1 + gain)`` (0.18 at the default 50). Sparse short windows (N-Cars: 100 ms, 18 % of pixels lit)
    are mostly single events, and a small model learns from them much faster in this scale (docs/RESULTS.md).
    It runs after the resize: a shrinking resize averages a lone event with its empty neighbours, and a log taken
    before it would leave that faint structure at a fraction of the brightness (-6 points top-1 on N-Cars).
    """
    n = hist.shape[1] if count_channels is None else count_channels
    counts = hist[:, :n] if inplace else hist[:, :n].clone()
    counts.mul_(gain).log1p_().div_(math.log1p(gain))
    if inplace or n == hist.shape[1]:
        return hist if inplace else counts
    return torch.cat([counts, hist[:, n:]], 1)


def histograms_to_input(
    hist: torch.Tensor, spec: InputSpec, *, train: bool, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Sensor-resolution histograms (B, C, h, w) -> model input (B, C, *spec.size) in [0, 1].

    Order: hot pixels -> normalize -> resize (+ crop) -> log scale -> RandAugment (train). Hot pixels are
    removed at sensor resolution: there a hot pixel is one outlier that the mean + k * std rule removes exactly,
    while after an upsampling resize its interpolated halo survives the threshold and would set the
    normalization scale.
    Normalizing before the resize gives the same image up to one scalar (the resize is linear), keeps the peak
    count of the sensor as the unit, and costs a pass over the small histogram instead of the large one; the
    bilinear resize is a convex combination, so values stay in [0, 1]. float32/float64 CPU batches run through
    compiled kernels (``_histograms_to_input_cpu``), other devices through torch ops; both give the same input
    up to float rounding, and at train time the same augmentations up to the interpolation of rotations/shears.
    """
    if train and generator is None:
        raise ValueError("training mode needs an explicit torch.Generator for the random crop and RandAugment")
    return _to_input(hist, spec, train, generator, owned=False)


def _to_input(
    hist: torch.Tensor, spec: InputSpec, train: bool, generator: torch.Generator | None, owned: bool
) -> torch.Tensor:
    """``histograms_to_input``; ``owned`` says the caller's ``hist`` may be modified in place."""
    if _kernel_ok(hist) and hist.ndim == 4:
        own = hist if owned and hist.is_contiguous() else hist.clone(memory_format=torch.contiguous_format)
        return _histograms_to_input_cpu(own, spec, train, generator)
    if spec.hot_pixel_std is not None:
        hist = remove_hot_pixels(hist, spec.hot_pixel_std, spec.count_channels)
    hist = normalize_histogram(hist, spec.count_channels)
    if spec.resize_to is None:
        hist = resize_histogram(hist, spec.size)
    else:
        hist = crop_histogram(resize_histogram(hist, spec.resize_to), spec.size, generator if train else None)
    if spec.scale == "log":  # ``hist`` is a new tensor since normalize_histogram: scale it in place
        hist = log_scale(hist, spec.count_channels, spec.log_gain, inplace=True)
    hist = hist.contiguous()
    if train and spec.randaug_ops > 0:
        hist = rand_augment(hist, spec.randaug_ops, spec.randaug_magnitude, generator, inplace=True)
    return hist


def _hot_normalize(hist: np.ndarray, spec: InputSpec) -> None:
    """``remove_hot_pixels`` (unless disabled) and ``normalize_histogram`` of ``hist`` (B, C, H, W), in place."""
    remove_hot = spec.hot_pixel_std is not None
    num_std = spec.hot_pixel_std if remove_hot else 0.0
    tiny = float(np.finfo(hist.dtype).tiny)
    _hot_normalize_kernel(hist, spec.count_channels, remove_hot, num_std, tiny)


def _resize_scale_augment(
    hist: torch.Tensor, spec: InputSpec, plan: Plan | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Upsampling resize to ``spec.size``, log scale (if any), then ``plan``'s RandAugment: one fused compiled pass
    for the linear scale; the log scale goes between the resize and RandAugment, so there it takes two."""
    if spec.scale == "linear":
        return resize_and_augment(hist, spec.size, plan, out=out)
    if out is None and tuple(hist.shape[-2:]) == spec.size:
        out = hist  # already at size and owned by the pipeline: scale it in place
    else:
        out = resize_and_augment(hist, spec.size, None, out=out)
    log_scale(out, spec.count_channels, spec.log_gain, inplace=True)
    return out if plan is None else resize_and_augment(out, spec.size, plan, out=out)


def _histograms_to_input_cpu(
    hist: torch.Tensor, spec: InputSpec, train: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """``histograms_to_input`` on a CPU float batch that may be modified in place, with compiled kernels.

    Hot pixels and normalization run in one pass per sample; an upsampling resize runs fused with RandAugment
    (``resize_and_augment``: one write of the output per sample, the leading geometric ops composed with the
    resize). A shrinking resize (e.g. N-ImageNet 640 x 480 -> 256 x 341) needs antialiasing: it and the crop
    stay torch ops, RandAugment then runs on the cropped batch.
    """
    _hot_normalize(hist.numpy(), spec)
    height, width = hist.shape[-2:]
    if spec.resize_to is not None or spec.size[0] < height or spec.size[1] < width:
        resized = resize_histogram(hist, spec.resize_to or spec.size)
        hist = crop_histogram(resized, spec.size, generator if train else None).contiguous()
    plan = None
    if train and spec.randaug_ops > 0:
        plan = draw_rand_augment(len(hist), spec.randaug_ops, spec.randaug_magnitude, generator)
    return _resize_scale_augment(hist, spec, plan)


# -------------------------------------------------------------------------------------------- per sample


def prepare_events(
    events: np.ndarray, sensor: SensorSize, spec: InputSpec, *, train: bool, rng: np.random.Generator | None = None
) -> np.ndarray:
    """The event-level half of the pipeline: the window, then the event augmentations at train time.

    Training draws a random contiguous window of ``spec.n_max`` events and augments it with ``rng``; evaluation
    takes the centred window (a view, no randomness). Run it in the dataset/worker before ``collate_events``.
    """
    if not train:
        return center_window(events, spec.n_max)
    if rng is None:
        raise ValueError("training mode needs an explicit np.random.Generator (rng)")
    return augment_events(random_window(events, spec.n_max, rng), sensor, spec, rng)


def preprocess(
    events: np.ndarray,
    sensor: SensorSize,
    spec: InputSpec,
    *,
    train: bool,
    rng: np.random.Generator | None = None,
) -> torch.Tensor:
    """One event stream -> model input, float32 (C, *spec.size) in [0, 1].

    Deterministic at evaluation (``train=False``, no ``rng``). At train time every random choice (window,
    event augmentations, crop, RandAugment) comes from ``rng``, so the same seed gives the same tensor.
    """
    window = prepare_events(events, sensor, spec, train=train, rng=rng)
    hist = torch.from_numpy(input_histogram(window, sensor, spec.channels, spec.temporal_bins))
    generator = torch.Generator().manual_seed(int(rng.integers(2**63 - 1))) if train else None
    return _to_input(hist[None], spec, train, generator, owned=True)[0]


# ----------------------------------------------------------------------------------------------- batched


@dataclass
class EventBatch:
    """Padded event windows of one sensor: row ``b`` holds ``lengths[b]`` valid events, then zero padding."""

    t: torch.Tensor  # (B, N) int64, microseconds
    x: torch.Tensor  # (B, N) int32
    y: torch.Tensor  # (B, N) int32
    p: torch.Tensor  # (B, N) uint8, 0 = OFF, 1 = ON
    lengths: torch.Tensor  # (B,) int64
    sensor: SensorSize

    def __len__(self) -> int:
        return self.t.shape[0]

    def _map(self, fn) -> EventBatch:
        return EventBatch(fn(self.t), fn(self.x), fn(self.y), fn(self.p), fn(self.lengths), self.sensor)

    def to(self, device: str | torch.device, non_blocking: bool = False) -> EventBatch:
        """The batch on ``device``."""
        return self._map(lambda v: v.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> EventBatch:
        """Page-locked copy (called by ``DataLoader(pin_memory=True)``)."""
        return self._map(lambda v: v.pin_memory())


def collate_events(windows: Sequence[np.ndarray], sensor: SensorSize) -> EventBatch:
    """Pad a list of ``EVENT_DTYPE`` windows into an ``EventBatch`` (usable inside a DataLoader ``collate_fn``).

    Inside a DataLoader worker the padded tensors are allocated in shared memory, as torch's default collate
    does: sending them to the main process then moves no data (otherwise pickling copies them there).
    """
    for i, w in enumerate(windows):
        if not isinstance(w, np.ndarray) or w.dtype != EVENT_DTYPE or w.ndim != 1:
            raise ValueError(f"window {i} must be a 1-D numpy array of EVENT_DTYPE, got {getattr(w, 'dtype', w)}")
    lengths = np.array([len(w) for w in windows], np.int64)
    shape = (len(windows), int(lengths.max(initial=0)))
    shared = get_worker_info() is not None
    columns = tuple(_empty(shape, dtype, shared) for dtype in (np.int64, np.int32, np.int32, np.uint8))
    t, x, y, p = (c.numpy() for c in columns)
    for i, w in enumerate(windows):
        _unpack_kernel(w, t[i], x[i], y[i], p[i])
    return EventBatch(*columns, torch.from_numpy(lengths), sensor=SensorSize(*sensor))


def _empty(shape: tuple[int, int], dtype: type, shared: bool) -> torch.Tensor:
    """An uninitialized tensor, with its storage created in shared memory if ``shared``.

    Otherwise the memory comes from numpy, which backs arrays of >= 4 MB with transparent huge pages and so
    saves the page fault per 4 KB that a fresh torch tensor of the same size costs on first touch.
    """
    if not shared or shape[0] * shape[1] == 0:
        return torch.from_numpy(np.empty(shape, dtype))
    storage = torch.UntypedStorage._new_shared(shape[0] * shape[1] * np.dtype(dtype).itemsize)
    return torch.empty(0, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).set_(storage, 0, shape)


@njit(cache=True, nogil=True)
def _unpack_kernel(events, t, x, y, p):
    """The fields of one window into the rows ``t, x, y, p``, zero-padded past its length."""
    n = events.shape[0]
    for i in range(n):
        e = events[i]
        t[i], x[i], y[i], p[i] = e.t, e.x, e.y, e.p
    t[n:] = 0
    x[n:] = 0
    y[n:] = 0
    p[n:] = 0


def _batch_histogram_numba(batch: EventBatch, channels: str, n_channels: int) -> torch.Tensor:
    height, width = batch.sensor
    out = np.zeros((len(batch), n_channels, height, width), np.float32)
    _fill_rows(out, batch, channels, 0)
    return torch.from_numpy(out)


def _fill_rows(out: np.ndarray, batch: EventBatch, channels: str, start: int) -> None:
    """Fill the zeroed histograms ``out`` (k, C, H, W) from the CPU batch rows ``start .. start + k``."""
    t, x, y, p = (v.numpy() for v in (batch.t, batch.x, batch.y, batch.p))
    lengths = batch.lengths.tolist()
    for b in range(start, start + len(out)):
        n = lengths[b]
        skipped = _fill_histogram(out[b - start], channels, t[b, :n], x[b, :n], y[b, :n], p[b, :n])
        if skipped:
            raise ValueError(f"batch sample {b}: {_skipped_error(skipped, n, batch.sensor)}")


def _batch_histogram_torch(batch: EventBatch, channels: str, bins: int, n_channels: int) -> torch.Tensor:
    height, width = batch.sensor
    n_batch, n_events = batch.t.shape
    device = batch.t.device
    if n_events == 0:
        return torch.zeros(n_batch, n_channels, height, width, device=device)
    t, x, y, p = batch.t, batch.x.long(), batch.y.long(), batch.p.long()
    valid = torch.arange(n_events, device=device)[None] < batch.lengths[:, None]  # (B, N)
    t0 = t[:, :1]  # (B, 1)
    t_last = t.gather(1, (batch.lengths - 1).clamp_min(0)[:, None])  # (B, 1)
    channel = p
    if channels == "temporal":
        time_bin = (t - t0) * bins // (t_last - t0 + 1)  # same even split as _temporal_kernel
        channel = 2 * time_bin + p
    bad = valid & ((x >= width) | (y >= height) | (p > 1))
    if channels != "hist":  # time bins and the newest-time plane need sorted windows, like the numba kernels
        bad |= valid & ((t < t0) | (t > t_last))
    if bool(bad.any()):
        b = int(bad.any(1).nonzero()[0])
        n = int(batch.lengths[b])
        raise ValueError(f"batch sample {b}: {_skipped_error(int(bad[b].sum()), n, batch.sensor)}")
    sample = torch.arange(n_batch, device=device)[:, None]  # (B, 1)
    flat = (((sample * n_channels + channel) * height + y) * width + x)[valid]  # index into (B, C, H, W)
    out = torch.bincount(flat, minlength=n_batch * n_channels * height * width).to(torch.float32)
    out = out.view(n_batch, n_channels, height, width)
    if channels == "timestamp":
        span = (t_last - t0).to(torch.float64)
        newest = torch.where(span > 0, (t - t0) / span.clamp_min(1), 1.0).to(torch.float32)  # (B, N)
        plane = torch.zeros(n_batch * height * width, device=device)
        pixel = ((sample * height + y) * width + x)[valid]
        plane.scatter_reduce_(0, pixel, newest[valid], reduce="amax")  # sorted times: amax = newest event
        out[:, 2] = plane.view(n_batch, height, width)
    return out


def batch_histogram(
    batch: EventBatch,
    channels: Channels = "hist",
    bins: int = 4,
    *,
    device: str | torch.device = "cpu",
    backend: Literal["auto", "numba", "torch"] = "auto",
) -> torch.Tensor:
    """Histograms of a padded batch, float32 (B, C, H, W) on ``device``, equal to ``input_histogram`` per row.

    ``backend="auto"`` runs the numba kernels per sample on CPU (faster than a CPU scatter) and one torch
    ``bincount`` over the flat (B * C * H * W) index elsewhere.
    """
    n_channels = _n_channels(channels, bins)
    device = torch.device(device)
    if backend == "auto":
        backend = "numba" if device.type == "cpu" else "torch"
    if backend == "numba":
        if device.type != "cpu":
            raise ValueError(f"the numba backend runs on CPU only, got device {device}")
        return _batch_histogram_numba(batch.to("cpu"), channels, n_channels)
    if backend != "torch":
        raise ValueError(f"unknown histogram backend {backend!r}; expected 'auto', 'numba' or 'torch'")
    return _batch_histogram_torch(batch.to(device), channels, bins, n_channels)


def batch_preprocess(
    batch: EventBatch,
    spec: InputSpec,
    *,
    train: bool,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """A padded batch of windows -> model inputs, float32 (B, C, *spec.size) in [0, 1] on ``device``.

    The windows must already be cut and, for training, event-augmented by ``prepare_events`` (in the dataset or
    DataLoader worker, before ``collate_events``); this function does the histogram, hot pixels, resize (+ crop),
    normalization and, at train time, RandAugment drawn from ``generator`` (a CPU torch.Generator). At
    evaluation it equals ``preprocess`` applied to each window.
    """
    if len(batch) and int(batch.lengths.max()) > spec.n_max:
        raise ValueError(
            f"a window has {int(batch.lengths.max())} events, more than spec.n_max={spec.n_max}: "
            "cut windows with prepare_events before collate_events"
        )
    if train and generator is None:
        raise ValueError("training mode needs an explicit torch.Generator for the random crop and RandAugment")
    upsampling = spec.resize_to is None and spec.size[0] >= batch.sensor.height and spec.size[1] >= batch.sensor.width
    if torch.device(device).type == "cpu" and upsampling and len(batch):
        return _batch_preprocess_cpu(batch.to("cpu"), spec, train, generator)
    hist = batch_histogram(batch, spec.channels, spec.temporal_bins, device=device)
    return _to_input(hist, spec, train, generator, owned=True)


_CHUNK = 8  # samples per pass of the CPU pipeline: their sensor-resolution histograms stay in the L2 cache


def _batch_preprocess_cpu(
    batch: EventBatch, spec: InputSpec, train: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """``batch_preprocess`` on CPU for an upsampling resize: histogram -> hot pixels + normalization ->
    resize + RandAugment, ``_CHUNK`` samples at a time (~10 % faster than whole-batch passes). The RandAugment
    plan is drawn for the whole batch first, so the result equals the unchunked ``histograms_to_input``.
    """
    n = len(batch)
    plan = None
    if train and spec.randaug_ops > 0:
        plan = draw_rand_augment(n, spec.randaug_ops, spec.randaug_magnitude, generator)
    out = torch.from_numpy(np.empty((n, spec.in_chans, *spec.size), np.float32))  # numpy: huge pages, see _empty
    hist = np.empty((min(n, _CHUNK), spec.in_chans, *batch.sensor), np.float32)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        chunk = hist[: stop - start]
        chunk.fill(0)
        _fill_rows(chunk, batch, spec.channels, start)
        _hot_normalize(chunk, spec)
        part = None if plan is None else plan[start:stop]
        _resize_scale_augment(torch.from_numpy(chunk), spec, part, out=out[start:stop])
    return out
