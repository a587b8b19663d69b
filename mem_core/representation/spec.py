"""``InputSpec``: how events become a model input. It is stored with every model, so serving builds the same input."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from mem_core.errors import ConfigError
from mem_core.fields import (
    AT_LEAST_0,
    DEFAULT_WINDOW_EVENTS,
    POSITIVE,
    PROBABILITY,
    ConfigConflict,
    Range,
    Side,
    WindowEvents,
    check_fields,
)
from mem_core.hot_pixels import HOT_PIXEL_STD
from mem_core.limits import MAX_MAGNITUDE, MAX_TEMPORAL_BINS

Channels = Literal["hist", "temporal", "timestamp"]
CHANNELS: tuple[str, ...] = ("hist", "temporal", "timestamp")
Scale = Literal["linear", "log"]
SCALES: tuple[str, ...] = ("linear", "log")
Crop = Literal["sensor", "extent"]
CROPS: tuple[str, ...] = ("sensor", "extent")
LOG_GAIN = 50.0  # default gain of the log scale (``log_scale``)
Probability = Annotated[float, PROBABILITY]
# the fields that only training reads: what it draws from a window, not how a window becomes the input
AUGMENTATIONS = (
    "shift_px",
    "flip_polarity_p",
    "hflip_p",
    "event_drop_p",
    "scale_jitter",
    "noise_events",
    "randaug_ops",
    "randaug_magnitude",
)


def n_channels(channels: str, bins: int) -> int:
    """Channels of a histogram kind: 2 (OFF, ON), 2 per time bin, or 3 (OFF, ON, newest timestamp)."""
    if channels not in CHANNELS:
        raise ConfigError(f"unknown histogram channels {channels!r}; expected one of {CHANNELS}")
    if bins < 1:
        raise ConfigError(f"temporal bins must be >= 1, got {bins}")
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

    n_max: WindowEvents = DEFAULT_WINDOW_EVENTS  # the live server serves a model on windows of n_max events
    size: tuple[Side, Side] = (224, 224)
    channels: Channels = "hist"
    resize_to: tuple[Side, Side] | None = None
    hot_pixel_std: float | None = HOT_PIXEL_STD
    scale: Scale = "linear"
    crop: Crop = "sensor"
    log_gain: Annotated[float, POSITIVE] = LOG_GAIN
    shift_px: Annotated[int, AT_LEAST_0] = 15
    flip_polarity_p: Probability = 0.5
    hflip_p: Probability = 0.5
    event_drop_p: Probability = 0.0  # EventDrop (mem_core.augment.drop_events) on this share of training windows
    scale_jitter: Probability = 0.0  # zoom of training windows by up to 1 + this (or its inverse), about their events
    noise_events: Probability = 0.0  # background activity added to training windows: up to this share of their events
    randaug_ops: Annotated[int, AT_LEAST_0] = 2
    randaug_magnitude: Annotated[float, Range(0, MAX_MAGNITUDE)] = 20
    temporal_bins: Annotated[int, Range(1, MAX_TEMPORAL_BINS)] = 4

    def __post_init__(self) -> None:
        # Accept lists (from JSON/TOML) for the sizes and store tuples, so specs compare and hash by value.
        object.__setattr__(self, "size", _size_pair("size", self.size))
        if self.resize_to is not None:
            object.__setattr__(self, "resize_to", _size_pair("resize_to", self.resize_to))
        if self.scale not in SCALES:
            raise ConfigError(f"unknown input scale {self.scale!r}; expected one of {SCALES}")
        if self.crop not in CROPS:
            raise ConfigError(f"unknown input crop {self.crop!r}; expected one of {CROPS}")
        check_fields(self)
        n_channels(self.channels, self.temporal_bins)
        if self.resize_to is not None and (self.resize_to[0] < self.size[0] or self.resize_to[1] < self.size[1]):
            raise ConfigConflict(f"resize_to {self.resize_to} must be at least size {self.size} to crop from")

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

    def input_differences(self, other: InputSpec) -> list[str]:
        """The fields in which ``other`` builds another model input from the same window, each as ``name=value``
        of ``other`` (the training augmentations aside: they change only what training draws)."""
        return [
            f"{f.name}={getattr(other, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name not in AUGMENTATIONS and getattr(self, f.name) != getattr(other, f.name)
        ]


def _size_pair(name: str, value: Sequence[int]) -> tuple[int, int]:
    pair = tuple(int(v) for v in value)
    if len(pair) != 2:
        raise ConfigError(f"{name} must be (height, width), got {value!r}")
    return pair  # type: ignore[return-value]
