"""The model input pipeline (docs/ARCHITECTURE.md, "The model input"): event windows -> normalized, resized tensors.

For one sample (``preprocess``) or a batch (``collate_events`` + ``batch_preprocess``): window of up to
``n_max`` events (random at train, centred at evaluation) -> event augmentations (train) -> histogram -> hot pixels
zeroed -> normalize to [0, 1] -> resize (+ crop) -> log scale (``scale="log"``) -> RandAugment (train). After the
histogram every step is a torch op on ``(B, C, H, W)``, so the same code runs on the CPU and on the model's GPU.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from mem_core.augment import augment_events, rand_augment
from mem_core.events import SensorSize, center_window, random_window
from mem_core.hot_pixels import hot_threshold
from mem_core.representation.histogram import EventBatch, batch_histogram, input_histogram
from mem_core.representation.spec import LOG_GAIN, InputSpec


def remove_hot_pixels(hist: torch.Tensor, num_std: float, count_channels: int | None = None) -> torch.Tensor:
    """Zero hot pixels (``mem_core.hot_pixels``): any count above ``mean + num_std * std`` of the sample's counts.
    hist: (B, C, H, W).

    Mean and (population) std are over all pixels of the first ``count_channels`` channels of each sample. A
    pixel that is hot in any count channel is zeroed in every channel (a hot pixel is a sensor defect, so its
    other polarity and its timestamp are not trusted either). Returns a new tensor.
    """
    n = hist.shape[1] if count_channels is None else count_channels
    counts = hist[:, :n]
    flat = counts.flatten(1)  # (B, n * H * W)
    mean = flat.mean(1, keepdim=True)  # (B, 1)
    std = (flat - mean).square_().mean(1, keepdim=True).sqrt_()  # two passes: torch.std_mean is ~5x slower on CPU
    threshold = hot_threshold(mean, std, num_std)[:, :, None, None]  # (B, 1, 1, 1)
    hot = counts.amax(1, keepdim=True) > threshold  # (B, 1, H, W)
    return hist.masked_fill(hot, 0.0)


def resize_histogram(hist: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of (B, C, H, W) to ``size`` (height, width), antialiased when a side shrinks."""
    height, width = hist.shape[-2:]
    if (height, width) == tuple(size):
        return hist
    antialias = size[0] < height or size[1] < width
    return F.interpolate(hist, size=tuple(size), mode="bilinear", align_corners=False, antialias=antialias)


def extent_boxes(hist: torch.Tensor, count_channels: int | None = None) -> list[tuple[int, int, int]]:
    """(top, left, side) of the square that ``crop="extent"`` resizes to the input, per sample of (B, C, H, W).

    The square is the events' bounding box (pixels with a count in any count channel) grown to its longer side
    around its centre, so an object keeps its aspect ratio; at least a quarter of the shorter sensor side, so a
    window of a few events is not blown up to the whole input. It is kept inside the sensor where it fits and
    may reach past a side where it does not (those pixels read as empty). An empty window gets the whole sensor,
    centred. Hot pixels must be removed first or one of them stretches the box.
    """
    n = hist.shape[1] if count_channels is None else count_channels
    height, width = hist.shape[-2:]
    lit = hist[:, :n].amax(1) > 0  # (B, H, W)
    rows, cols = lit.any(2), lit.any(1)  # (B, H), (B, W)
    boxes = []
    for r, c in zip(rows.cpu().numpy(), cols.cpu().numpy(), strict=True):
        ys, xs = np.flatnonzero(r), np.flatnonzero(c)
        y0, y1, x0, x1 = (ys[0], ys[-1] + 1, xs[0], xs[-1] + 1) if len(ys) else (0, height, 0, width)
        side = int(max(y1 - y0, x1 - x0, min(height, width) // 4, 1))
        boxes.append((_place(y0 + y1, side, height), _place(x0 + x1, side, width), int(side)))
    return boxes


def _place(twice_centre: int, side: int, extent: int) -> int:
    """Start of a ``side`` span centred at ``twice_centre / 2``, moved inside ``[0, extent)`` where it fits."""
    start = (int(twice_centre) - side) // 2
    return int(min(max(start, 0), extent - side) if side <= extent else (extent - side) // 2)


def crop_to_extent(hist: torch.Tensor, boxes: list[tuple[int, int, int]], size: tuple[int, int]) -> torch.Tensor:
    """Each sample's square ``boxes`` (``extent_boxes``) of (B, C, H, W), resized to ``size`` (zeros past the
    sensor's sides)."""
    height, width = hist.shape[-2:]
    out = []
    for sample, (top, left, side) in zip(hist, boxes, strict=True):
        y0, x0 = max(top, 0), max(left, 0)
        square = sample[None, :, y0 : top + side, x0 : left + side]
        pad = (x0 - left, left + side - min(left + side, width), y0 - top, top + side - min(top + side, height))
        out.append(resize_histogram(F.pad(square, pad) if any(pad) else square, size))
    return torch.cat(out) if out else hist.new_zeros((0, hist.shape[1], *size))


def resize_labels(labels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest-neighbour resize of label images (B, H, W) to ``size``: class ids stay class ids. int64 out."""
    if tuple(labels.shape[-2:]) == tuple(size):
        return labels.long()
    return F.interpolate(labels[:, None].float(), size=tuple(size), mode="nearest")[:, 0].long()


def crop_offsets(
    n: int, shape: tuple[int, int], size: tuple[int, int], generator: torch.Generator | None = None
) -> list[tuple[int, int]]:
    """(top, left) of a ``size`` crop of ``shape`` (height, width) for each of ``n`` samples: the centre without
    ``generator``, a random window per sample with it (drawn on the CPU)."""
    (height, width), (h, w) = shape, size
    if h > height or w > width:
        raise ValueError(f"cannot crop {size} from a histogram of {(height, width)}")
    if generator is None:
        return [((height - h) // 2, (width - w) // 2)] * n
    tops = torch.randint(height - h + 1, (n,), generator=generator).tolist()
    lefts = torch.randint(width - w + 1, (n,), generator=generator).tolist()
    return list(zip(tops, lefts, strict=True))


def crop_histogram(images: torch.Tensor, size: tuple[int, int], offsets: list[tuple[int, int]]) -> torch.Tensor:
    """Crop (B, ..., H, W) to ``size`` at each sample's (top, left) ``offsets`` (``crop_offsets``)."""
    h, w = size
    if len(set(offsets)) == 1:  # one window for all (the centre): a view
        top, left = offsets[0]
        return images[..., top : top + h, left : left + w]
    return torch.stack([s[..., i : i + h, j : j + w] for s, (i, j) in zip(images, offsets, strict=True)])


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
    hist: torch.Tensor,
    spec: InputSpec,
    *,
    train: bool,
    generator: torch.Generator | None = None,
    labels: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sensor-resolution histograms (B, C, h, w) -> model input (B, C, *spec.size) in [0, 1] (a new tensor).

    With ``labels`` (B, h, w) label images of the same samples, returns ``(input, labels)``: the labels go through
    the same resize (nearest neighbour) and the same crop, so every label stays on its pixel. RandAugment moves
    pixels without moving labels: a spec for labelled images must have ``randaug_ops = 0``.

    Order: hot pixels -> normalize -> resize (of the sensor or of the events' extent, ``spec.crop``) (+ crop) ->
    log scale -> RandAugment (train). Hot pixels are removed at sensor resolution: there a hot pixel is one
    outlier that the mean + k * std rule removes exactly, while after an upsampling resize its interpolated halo
    survives the threshold and would set the normalization scale. Normalizing before the resize gives the same image up to one scalar (the resize is
    linear), keeps the peak count of the sensor as the unit, and costs a pass over the small histogram instead of
    the large one; the bilinear resize is a convex combination, so values stay in [0, 1]. At train time the random
    crop and RandAugment draw from ``generator`` (a CPU ``torch.Generator``).
    """
    if train and generator is None:
        raise ValueError("training mode needs an explicit torch.Generator for the random crop and RandAugment")
    if spec.hot_pixel_std is not None:
        hist = remove_hot_pixels(hist, spec.hot_pixel_std, spec.count_channels)
    if labels is not None and train and spec.randaug_ops > 0:
        raise ValueError("RandAugment would move pixels away from their labels: use randaug_ops = 0 with labels")
    hist = normalize_histogram(hist, spec.count_channels)  # a new tensor: the steps below may work in place
    if spec.crop == "extent":
        if labels is not None:
            raise ValueError('crop="extent" resizes each window by its own scale: label images need crop="sensor"')
        hist = crop_to_extent(hist, extent_boxes(hist, spec.count_channels), spec.resize_to or spec.size)
    else:
        hist = resize_histogram(hist, spec.resize_to or spec.size)
    # label images come pinned from the loader: copied to a GPU without waiting for it
    labels = (
        None
        if labels is None
        else resize_labels(labels.to(hist.device, non_blocking=True), spec.resize_to or spec.size)
    )
    if spec.resize_to is not None:
        offsets = crop_offsets(len(hist), spec.resize_to, spec.size, generator if train else None)
        hist = crop_histogram(hist, spec.size, offsets)
        labels = None if labels is None else crop_histogram(labels, spec.size, offsets)
    if spec.scale == "log":
        hist = log_scale(hist, spec.count_channels, spec.log_gain, inplace=True)
    hist = hist.contiguous()
    if train and spec.randaug_ops > 0:
        hist = rand_augment(hist, spec.randaug_ops, spec.randaug_magnitude, generator, inplace=True)
    return hist if labels is None else (hist, labels.contiguous())


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
    return histograms_to_input(hist[None], spec, train=train, generator=generator)[0]


# ----------------------------------------------------------------------------------------------- batched


def batch_preprocess(
    batch: EventBatch,
    spec: InputSpec,
    *,
    train: bool,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    labels: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A batch of windows -> model inputs, float32 (B, C, *spec.size) in [0, 1] on ``device``.

    The windows must already be cut and, for training, event-augmented by ``prepare_events`` (in the dataset or
    DataLoader worker, before ``collate_events``); this function does the histogram and ``histograms_to_input``
    (with ``labels``, label images at sensor resolution: returns ``(input, labels)``, see there). At evaluation it
    equals ``preprocess`` applied to each window.
    """
    if len(batch) and int(batch.lengths.max()) > spec.n_max:
        raise ValueError(
            f"a window has {int(batch.lengths.max())} events, more than spec.n_max={spec.n_max}: "
            "cut windows with prepare_events before collate_events"
        )
    if train and generator is None:
        raise ValueError("training mode needs an explicit torch.Generator for the random crop and RandAugment")
    hist = batch_histogram(batch, spec.channels, spec.temporal_bins, device=device)
    return histograms_to_input(hist, spec, train=train, generator=generator, labels=labels)
