"""Inference on one event window: an exported (or trained) model, and optionally its tokenizer, under inference mode.

The live server (``app/live``) runs a ``Predictor`` on the newest window of a source. On a GPU a window reads nothing
back before its model runs (the histogram it publishes is copied to the host behind the model's kernels), and two
switches cut the per-window work further: ``bf16_weights`` casts the model's weights once instead of autocast casting
them in every window, and ``cuda_graph`` records the model and the tokenizer as one CUDA graph at ``warm_up``, replayed
per window (the model input's shape is fixed by the input spec), instead of launching their kernels one by one from
Python. docs/BENCHMARKS.md (live, GPU) says how each is measured.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mem_core.configuration import from_dict
from mem_core.events import SensorSize, make_events
from mem_core.prediction import Output
from mem_core.representation import InputSpec, histograms_to_input, input_histogram
from mem_core.representation.pipeline import extent_boxes, remove_hot_pixels
from mem_core.runs.export import load_model, load_tokenizer
from mem_core.runs.lineage import tokenizer_of
from mem_core.runs.rundir import RunError

log = logging.getLogger(__name__)


class Predictor:
    """Events of one window -> histogram, token ids and a prediction, under ``torch.inference_mode``.

    Args:
        model: export directory or finetune/segment run directory (``mem_core.runs.export.load_model``).
        tokenizer: tokenizer run or export directory; default: the one that belongs to the model, if any.
        device: torch device for the model and tokenizer.
        bf16_weights: the model's weights in bf16, cast once (any device; the tokenizer stays in fp32, so the tokens do
            not change). Without it the model runs under bf16 autocast on a GPU and in fp32 on a CPU.
        cuda_graph: on a GPU, the model and the tokenizer recorded as one CUDA graph at ``warm_up`` and replayed for
            every window; elsewhere (or should the recording fail, with a warning) they run as they are.
    """

    def __init__(
        self,
        model: Path | str,
        tokenizer: Path | str | None = None,
        device: str = "cpu",
        *,
        bf16_weights: bool = False,
        cuda_graph: bool = False,
    ) -> None:
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
        self.bf16_weights = bf16_weights
        if bf16_weights:
            self.model.to(torch.bfloat16)
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        self._graph: _Graph | None = None

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

    @property
    def num_tokens(self) -> int | None:
        """The tokenizer's codebook size, or None without one."""
        return None if self.tokenizer is None else self.tokenizer.config.num_tokens

    @property
    def graphed(self) -> bool:
        """Whether windows replay a CUDA graph of the model and the tokenizer (``cuda_graph``, after ``warm_up``)."""
        return self._graph is not None

    def warm_up(self) -> None:
        """Run once on a small synthetic window: compiles the histogram kernels and lets torch allocate, so that
        the first real window is not slow (and its events are not counted as skipped); with ``cuda_graph`` on a GPU,
        then records the graph."""
        sensor = SensorSize(32, 32)
        n = 1000
        rng = np.random.default_rng(0)
        events = make_events(np.arange(n), rng.integers(0, 32, n), rng.integers(0, 32, n), rng.integers(0, 2, n))
        self(events, sensor)
        if self.cuda_graph and self._graph is None:
            self._record_graph(sensor, events)

    @torch.inference_mode()
    def __call__(self, events: np.ndarray, sensor: SensorSize) -> Output:
        """Run the whole window ``events`` (time-sorted ``EVENT_DTYPE``) on ``sensor``."""
        start = time.perf_counter()
        x, counts = self._input(events, sensor)
        hist = _to_host_behind(_fold_polarity(x[0], self.spec))  # read at the end, once later copies have waited
        out = Output(hist=np.empty(0, np.float16), region=self.input_region(sensor, counts))
        stages = out.stages_ms
        stages["preprocess"], start = _ms_since(start)
        if self._graph is not None and x.shape == self._graph.x.shape:
            self._graph.x.copy_(x)
            self._graph.graph.replay()
            logits, ids = self._graph.out
        else:
            logits, ids = self._model(x), None
        if self.task == "classification":
            out.probs = logits[0].float().softmax(0).cpu().numpy()  # (K,)
        else:
            mask_dtype = np.uint8 if len(self.classes) <= 256 else np.uint16
            out.mask = logits[0].argmax(0).cpu().numpy().astype(mask_dtype)  # (H, W)
        stages["model"], start = _ms_since(start)
        if self.tokenizer is not None:
            recorded = ids is not None
            ids = ids if recorded else self._token_ids(x)
            out.tokens = ids[0].cpu().numpy().astype(np.int32)  # (h, w)
            if not recorded:
                stages["tokenizer"], start = _ms_since(start)
        out.hist = hist.numpy()  # the prediction's copy to the host came after the histogram's: it is there
        return out

    def _input(self, events: np.ndarray, sensor: SensorSize) -> tuple[torch.Tensor, torch.Tensor]:
        """The model input ``(1, C, H, W)`` on the device, and the window's histogram on the host ``(C, h, w)``."""
        spec = self.spec
        counts = torch.from_numpy(input_histogram(events, sensor, spec.channels, spec.temporal_bins))
        return histograms_to_input(counts[None].to(self.device), spec, train=False), counts

    def _model(self, x: torch.Tensor) -> torch.Tensor:
        """The model's logits on the input ``x``: in bf16 weights, under bf16 autocast on a GPU, or in fp32."""
        if self.bf16_weights:
            return self.model(x.to(torch.bfloat16))
        # no cast cache: one forward per window, and a CUDA graph must record the casts, not reuse stale ones
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda", cache_enabled=False):
            return self.model(x)

    def _token_ids(self, x: torch.Tensor) -> torch.Tensor:
        """The tokenizer's ids ``(1, h, w)`` of the input ``x``, resized to the tokenizer's input where they differ."""
        size = self.tokenizer.config.img_size
        x_tok = x if x.shape[-2:] == (size, size) else F.interpolate(x, size=(size, size), mode="bilinear")
        return self.tokenizer.token_ids(x_tok)

    @torch.inference_mode()
    def _record_graph(self, sensor: SensorSize, events: np.ndarray) -> None:
        """Record the model and the tokenizer on a static input of the model input's shape as one CUDA graph (after a
        few runs on a side stream, which set up cuBLAS and cuDNN outside the recording). A failure is logged and the
        windows keep running as they are: a served model never stops for its speed-up."""
        static_x = self._input(events, sensor)[0].clone()
        tokens = self.tokenizer is not None

        def forward() -> tuple[torch.Tensor, torch.Tensor | None]:
            return self._model(static_x), self._token_ids(static_x) if tokens else None

        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(3):
                    forward()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread-local: a model being swapped in is recorded while the one it replaces serves in another thread
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = forward()
        except RuntimeError as e:
            log.warning("the CUDA graph of the model could not be recorded (%s); windows run without it", e)
            return
        self._graph = _Graph(graph, static_x, out)


@dataclass
class _Graph:
    """A recorded CUDA graph: its static input, which a window's input is copied into, and its outputs (logits,
    token ids or None), which each replay overwrites."""

    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    out: tuple[torch.Tensor, torch.Tensor | None]


def _fold_polarity(x: torch.Tensor, spec: InputSpec) -> torch.Tensor:
    """(C, H, W) model input -> (2, H, W) float16 OFF / ON picture (temporal bins summed, timestamp dropped), where
    ``x`` is."""
    counts = x[: spec.count_channels]
    if spec.channels == "temporal":
        counts = counts.reshape(-1, 2, *counts.shape[-2:]).sum(0)  # (bins, 2, H, W) -> (2, H, W)
        counts = counts / counts.max().clamp_min(1e-12)
    return counts.to(torch.float16)


def _to_host_behind(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the host. From a GPU: copied into page-locked memory behind the work queued so far, without waiting
    for it; its values are there once a later blocking copy to the host on the same stream has returned (every window
    makes one: its prediction)."""
    if t.device.type != "cuda":
        return t.cpu()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def _ms_since(start: float) -> tuple[float, float]:
    now = time.perf_counter()
    return (now - start) * 1e3, now
