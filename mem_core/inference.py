"""Inference on one event window: an exported (or trained) model, and optionally its tokenizer, under inference mode.

The live server (``app/live``) runs a ``Predictor`` on the newest window of a source.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mem_core.configuration import from_dict
from mem_core.events import SensorSize, make_events
from mem_core.representation import InputSpec, histograms_to_input, input_histogram
from mem_core.representation.pipeline import extent_boxes, remove_hot_pixels
from mem_core.runs.export import load_model, load_tokenizer
from mem_core.runs.lineage import tokenizer_of
from mem_core.runs.rundir import RunError


@dataclass
class Output:
    """What one window gives: the arrays the server publishes and the time each stage took."""

    hist: np.ndarray  # (2, H, W) float16 in [0, 1]: the model input folded to OFF / ON
    region: tuple[float, float, float, float]  # (top, left, height, width) in sensor px: what the input shows
    tokens: np.ndarray | None = None  # (h, w) int32 token ids, with a tokenizer
    probs: np.ndarray | None = None  # (K,) float32 class probabilities (classification)
    mask: np.ndarray | None = None  # (H, W) uint8 / uint16 class ids (segmentation)
    stages_ms: dict[str, float] = field(default_factory=dict)


class Predictor:
    """Events of one window -> histogram, token ids and a prediction, under ``torch.inference_mode``.

    Args:
        model: export directory or finetune/segment run directory (``mem_core.runs.export.load_model``).
        tokenizer: tokenizer run or export directory; default: the one that belongs to the model, if any.
        device: torch device for the model and tokenizer.
    """

    def __init__(self, model: Path | str, tokenizer: Path | str | None = None, device: str = "cpu") -> None:
        self.model, self.meta = load_model(model, device)
        tokenizer = tokenizer if tokenizer is not None else tokenizer_of(model)
        self.tokenizer = load_tokenizer(tokenizer, device) if tokenizer is not None else None
        self.device = torch.device(device)
        self.spec: InputSpec = from_dict(InputSpec, self.meta["input"])
        self.task: str = self.meta["task"]
        self.classes: list[str] = [str(c) for c in self.meta["classes"]]
        if self.tokenizer is not None and self.tokenizer.config.in_chans != self.spec.in_chans:
            raise RunError(
                f"{tokenizer}: the tokenizer takes {self.tokenizer.config.in_chans} input channels but the model "
                f"input ({self.spec.channels}) of {model} has {self.spec.in_chans}"
            )

    @property
    def training_window(self) -> tuple[int, float | None]:
        """(events, ms) of the windows the model was trained on; ms is None where the samples' span is unknown."""
        window = self.meta["training_window"]
        return int(window["events"]), None if window["ms"] is None else float(window["ms"])

    def input_region(self, sensor: SensorSize, counts: torch.Tensor | None = None) -> tuple[float, float, float, float]:
        """(top, left, height, width) in sensor px of what the model input shows: the whole sensor, or with
        ``crop="extent"`` the square around the events of the window whose sensor histogram is ``counts``
        (C, H, W); then the centre that is cropped after ``resize_to`` (the crop at evaluation)."""
        spec = self.spec
        top, left, height, width = 0.0, 0.0, float(sensor.height), float(sensor.width)
        if spec.crop == "extent" and counts is not None:
            hist = counts[None].float()
            if spec.hot_pixel_std is not None:
                hist = remove_hot_pixels(hist, spec.hot_pixel_std, spec.count_channels)
            box_top, box_left, side = extent_boxes(hist, spec.count_channels)[0]
            top, left, height, width = float(box_top), float(box_left), float(side), float(side)
        if spec.resize_to is None:
            return top, left, height, width
        (rh, rw), (h, w) = spec.resize_to, spec.size
        sy, sx = height / rh, width / rw  # sensor px per resized px
        return top + (rh - h) // 2 * sy, left + (rw - w) // 2 * sx, h * sy, w * sx

    @property
    def token_grid(self) -> tuple[int, int] | None:
        """(h, w) of the token ids, or None without a tokenizer."""
        return None if self.tokenizer is None else self.tokenizer.config.grid_size

    def warm_up(self) -> None:
        """Run once on a small synthetic window: compiles the histogram kernels and lets torch allocate, so that
        the first real window is not slow (and its events are not counted as skipped)."""
        sensor = SensorSize(32, 32)
        n = 1000
        rng = np.random.default_rng(0)
        self(make_events(np.arange(n), rng.integers(0, 32, n), rng.integers(0, 32, n), rng.integers(0, 2, n)), sensor)

    @torch.inference_mode()
    def __call__(self, events: np.ndarray, sensor: SensorSize) -> Output:
        """Run the whole window ``events`` (time-sorted ``EVENT_DTYPE``) on ``sensor``."""
        spec = self.spec
        start = time.perf_counter()
        counts = torch.from_numpy(input_histogram(events, sensor, spec.channels, spec.temporal_bins))
        x = histograms_to_input(counts[None].to(self.device), spec, train=False)  # (1, C, H, W)
        out = Output(hist=_fold_polarity(x[0], spec), region=self.input_region(sensor, counts))
        stages = out.stages_ms
        stages["preprocess"], start = _ms_since(start)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            logits = self.model(x)
        if self.task == "classification":
            out.probs = logits[0].float().softmax(0).cpu().numpy()  # (K,)
        else:
            mask_dtype = np.uint8 if len(self.classes) <= 256 else np.uint16
            out.mask = logits[0].argmax(0).cpu().numpy().astype(mask_dtype)  # (H, W)
        stages["model"], start = _ms_since(start)
        if self.tokenizer is not None:
            size = self.tokenizer.config.img_size
            x_tok = x if x.shape[-2:] == (size, size) else F.interpolate(x, size=(size, size), mode="bilinear")
            out.tokens = self.tokenizer.token_ids(x_tok)[0].cpu().numpy().astype(np.int32)  # (h, w)
            stages["tokenizer"], start = _ms_since(start)
        return out


def _fold_polarity(x: torch.Tensor, spec: InputSpec) -> np.ndarray:
    """(C, H, W) model input -> (2, H, W) float16 OFF / ON picture (temporal bins summed, timestamp dropped)."""
    counts = x[: spec.count_channels]
    if spec.channels == "temporal":
        counts = counts.reshape(-1, 2, *counts.shape[-2:]).sum(0)  # (bins, 2, H, W) -> (2, H, W)
        counts = counts / counts.max().clamp_min(1e-12)
    return counts.to(torch.float16).cpu().numpy()


def _ms_since(start: float) -> tuple[float, float]:
    now = time.perf_counter()
    return (now - start) * 1e3, now
