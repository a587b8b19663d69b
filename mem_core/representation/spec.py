"""``InputSpec``: how events become a model input. It is stored with every model, so serving builds the same input."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mem_core.augment import MAX_MAGNITUDE

Channels = Literal["hist", "temporal", "timestamp"]
CHANNELS: tuple[str, ...] = ("hist", "temporal", "timestamp")
Scale = Literal["linear", "log"]
SCALES: tuple[str, ...] = ("linear", "log")
Crop = Literal["sensor", "extent"]
CROPS: tuple[str, ...] = ("sensor", "extent")
LOG_GAIN = 50.0  # default gain of the log scale (``log_scale``)


def n_channels(channels: str, bins: int) -> int:
    """Channels of a histogram kind: 2 (OFF, ON), 2 per time bin, or 3 (OFF, ON, newest timestamp)."""
    if channels not in CHANNELS:
        raise ValueError(f"unknown histogram channels {channels!r}; expected one of {CHANNELS}")
    if bins < 1:
        raise ValueError(f"temporal bins must be >= 1, got {bins}")
    return {"hist": 2, "temporal": 2 * bins, "timestamp": 3}[channels]


@dataclass(frozen=True)
class InputSpec:
    """How events become a model input; stored with every model so that serving builds the same input.

    ``randaug_magnitude`` uses torchvision's RandAugment scale 0..30 (see ``mem_core.augment.rand_augment``).
    ``resize_to`` (e.g. (256, 341) for N-ImageNet) resizes first, then crops ``size``: random at train, centred
    at evaluation. ``hot_pixel_std=None`` disables hot-pixel removal; ``temporal_bins`` is used by "temporal".
    ``scale`` is how counts map to [0, 1]: "linear" (divide by the peak, the paper's) or "log" (then
    ``log_scale`` with ``log_gain`` after the resize). ``crop`` is what is resized to the input: the whole
    sensor ("sensor"), or the square around each window's events ("extent", see
    ``mem_core.representation.pipeline.extent_boxes``): for datasets whose samples are object crops of varying
    size in a corner of a fixed frame (N-Cars), it shows every object at the full input resolution.
    """

    n_max: int = 30000
    size: tuple[int, int] = (224, 224)
    channels: Channels = "hist"
    resize_to: tuple[int, int] | None = None
    hot_pixel_std: float | None = 10.0
    scale: Scale = "linear"
    crop: Crop = "sensor"
    log_gain: float = LOG_GAIN
    shift_px: int = 15
    flip_polarity_p: float = 0.5
    hflip_p: float = 0.5
    event_drop_p: float = 0.0  # EventDrop (mem_core.augment.drop_events) on this share of training windows
    scale_jitter: float = 0.0  # zoom of training windows by up to 1 + this (or its inverse), about their events
    noise_events: float = 0.0  # background activity added to training windows: up to this share of their events
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
        n_channels(self.channels, self.temporal_bins)
        if self.n_max <= 0:
            raise ValueError(f"n_max must be positive, got {self.n_max}")
        if self.shift_px < 0 or self.randaug_ops < 0:
            raise ValueError(f"shift_px and randaug_ops must be >= 0, got {self.shift_px}, {self.randaug_ops}")
        if self.scale not in SCALES:
            raise ValueError(f"unknown input scale {self.scale!r}; expected one of {SCALES}")
        if self.crop not in CROPS:
            raise ValueError(f"unknown input crop {self.crop!r}; expected one of {CROPS}")
        if not (math.isfinite(self.log_gain) and self.log_gain > 0):
            raise ValueError(f"log_gain must be a positive number, got {self.log_gain}")
        for name in ("flip_polarity_p", "hflip_p", "event_drop_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")
        for name in ("scale_jitter", "noise_events"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.randaug_magnitude <= MAX_MAGNITUDE:
            raise ValueError(f"randaug_magnitude must be in [0, {MAX_MAGNITUDE}], got {self.randaug_magnitude}")

    @property
    def in_chans(self) -> int:
        """Number of input channels of the model (2, 2 * temporal_bins or 3)."""
        return n_channels(self.channels, self.temporal_bins)

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
