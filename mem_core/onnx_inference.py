"""Inference on one event window without torch: an ONNX model (``mem export --format onnx``) in onnxruntime, the
model input made in numpy (``representation.numpy_input``, the numbers of the torch pipeline).

``OnnxPredictor`` is what ``mem serve --model model.onnx`` serves in place of ``inference.Predictor``: the same
``Output`` per window, the same names the server reads (``task``, ``classes``, ``training_window``, ``token_grid``,
``num_tokens``, ``warm_up``), so every live feature (overlays, ``--watch``, Train) works with either.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from mem_core.errors import RunError
from mem_core.events import SensorSize, make_events
from mem_core.limits import MAX_WINDOW_FLOPS
from mem_core.prediction import Output
from mem_core.representation.numpy_input import count_histogram, fold_polarity, input_region, resize, window_input
from mem_core.runs.onnx_model import (
    INPUT,
    LOGITS,
    ONNX_TOKENIZER_FILE,
    SERVED_KEYS,
    TOKENS,
    onnx_model_file,
    open_model,
    open_tokenizer,
)


class OnnxPredictor:
    """Events of one window -> histogram, token ids and a prediction, in numpy and onnxruntime.

    Args:
        model: an ONNX model file, or a folder holding ``model.onnx`` (``runs.onnx_model.onnx_model_file``).
        tokenizer: the tokenizer encoder's ONNX file; default: ``tokenizer.onnx`` beside the model, if there.
        threads: onnxruntime's intra-op threads (None: its own choice, every core).
    """

    graphed = False  # (no CUDA graph: the names the server and the benchmarks read of either predictor)

    def __init__(self, model: Path | str, tokenizer: Path | str | None = None, threads: int | None = None) -> None:
        file = onnx_model_file(model)
        if file is None:
            raise RunError(f"{model}: no ONNX model (model.onnx) there")
        self.model, self.spec = open_model(file, threads)
        served = {key: self.model.meta[key] for key in SERVED_KEYS if key in self.model.meta}
        self.meta: dict[str, Any] = {**served, "window_flops": _window_flops(self.model.meta, file)}
        self.task: str = self.meta["task"]
        self.classes: list[str] = list(self.meta["classes"])
        if tokenizer is None and (file.parent / ONNX_TOKENIZER_FILE).exists():
            tokenizer = file.parent / ONNX_TOKENIZER_FILE
        if tokenizer is not None and Path(tokenizer).is_dir():
            raise RunError(f"{tokenizer}: an ONNX model takes an ONNX tokenizer encoder ({ONNX_TOKENIZER_FILE})")
        self.tokenizer = open_tokenizer(tokenizer, self.spec, threads) if tokenizer is not None else None

    @property
    def training_window(self) -> tuple[int, float | None]:
        """(events, ms) of the windows the model was trained on; ms is None where the samples' span is unknown."""
        window = self.meta["training_window"]
        return int(window["events"]), None if window["ms"] is None else float(window["ms"])

    @property
    def token_grid(self) -> tuple[int, int] | None:
        """(h, w) of the token ids, or None without a tokenizer."""
        if self.tokenizer is None:
            return None
        shape = next(o.shape for o in self.tokenizer.session.get_outputs() if o.name == TOKENS)
        return int(shape[1]), int(shape[2])

    @property
    def num_tokens(self) -> int | None:
        """The tokenizer's codebook size, or None without one."""
        return None if self.tokenizer is None else int(self.tokenizer.meta["num_tokens"])

    def warm_up(self) -> None:
        """Run once on a small synthetic window: onnxruntime allocates its buffers before the first real window."""
        sensor = SensorSize(32, 32)
        n = 1000
        rng = np.random.default_rng(0)
        self(make_events(np.arange(n), rng.integers(0, 32, n), rng.integers(0, 32, n), rng.integers(0, 2, n)), sensor)

    def __call__(self, events: np.ndarray, sensor: SensorSize) -> Output:
        """Run the whole window ``events`` (time-sorted ``EVENT_DTYPE``) on ``sensor``."""
        start = time.perf_counter()
        spec = self.spec
        x, box = window_input(count_histogram(events, sensor, spec.channels, spec.temporal_bins), spec)
        out = Output(hist=fold_polarity(x, spec), region=input_region(spec, sensor, box))
        stages = out.stages_ms
        stages["preprocess"], start = _ms_since(start)
        logits = self.model.session.run([LOGITS], {INPUT: x[None]})[0][0]
        if self.task == "classification":
            e = np.exp(logits - logits.max())
            out.probs = (e / e.sum()).astype(np.float32)  # (K,)
        else:
            out.mask = logits.argmax(0).astype(np.uint8 if len(self.classes) <= 256 else np.uint16)  # (H, W)
        stages["model"], start = _ms_since(start)
        if self.tokenizer is not None:
            size = int(self.tokenizer.meta["img_size"])
            # the tokenizer's own input size, as inference.Predictor resizes it (F.interpolate's bilinear default)
            x_tok = x if x.shape[-2:] == (size, size) else resize(x, (size, size), antialias=False)
            ids = self.tokenizer.session.run([TOKENS], {INPUT: x_tok[None]})[0][0]
            out.tokens = ids.astype(np.int32)  # (h, w)
            stages["tokenizer"], start = _ms_since(start)
        return out


def _window_flops(meta: dict[str, Any], where: Path) -> int:
    """The work of one window the export recorded (``window_flops``: what a warm-up may take), at most
    ``MAX_WINDOW_FLOPS`` (also when it recorded none)."""
    flops = meta.get("window_flops", MAX_WINDOW_FLOPS)
    if not isinstance(flops, int) or isinstance(flops, bool) or not 0 <= flops <= MAX_WINDOW_FLOPS:
        raise RunError(f"{where}: metadata window_flops: expected an integer in [0, {MAX_WINDOW_FLOPS}], got {flops!r}")
    return flops


def _ms_since(start: float) -> tuple[float, float]:
    now = time.perf_counter()
    return (now - start) * 1e3, now
