"""``Output``: what one live window gives, whichever runtime ran the model (``inference.Predictor``, torch;
``onnx_inference.OnnxPredictor``, onnxruntime). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Output:
    """What one window gives: the arrays the server publishes and the time each stage took."""

    hist: np.ndarray  # (2, H, W) float16 in [0, 1]: the model input folded to OFF / ON
    region: tuple[float, float, float, float]  # (top, left, height, width) in sensor px: what the input shows
    tokens: np.ndarray | None = None  # (h, w) int32 token ids, with a tokenizer
    probs: np.ndarray | None = None  # (K,) float32 class probabilities (classification)
    mask: np.ndarray | None = None  # (H, W) uint8 / uint16 class ids (segmentation)
    # ms per stage: "preprocess", "model", "tokenizer" (with a CUDA graph, "model" is the model and the tokenizer). On a
    # GPU a stage lasts until its result is on the host, so the model's includes the preprocessing's queued kernels.
    stages_ms: dict[str, float] = field(default_factory=dict)
