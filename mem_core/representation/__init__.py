"""Model input: event histograms and the events -> tensor pipeline (docs/ARCHITECTURE.md, "The model input").

``histogram`` counts events (numba on CPU, ``torch.bincount`` on GPU), ``spec`` holds ``InputSpec`` (stored with
every model), ``pipeline`` turns windows into normalized, resized, augmented model inputs, ``numpy_input`` is the same
evaluation pipeline in numpy for the torch-free live path (an ONNX model). The names below are the ones the rest of MEM
uses; the single steps (hot pixels, normalization, resize, log scale) live in ``pipeline``.

Only ``InputSpec`` is imported with the package: the torch names load when first asked for, so that the torch-free live
path (``spec``, ``numpy_input``) runs where torch is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mem_core.representation.spec import InputSpec

if TYPE_CHECKING:
    from mem_core.representation.histogram import EventBatch, collate_events, event_histogram, input_histogram
    from mem_core.representation.pipeline import batch_preprocess, histograms_to_input, prepare_events, preprocess

_TORCH_NAMES = {  # name -> the module (torch and numba) that defines it
    "EventBatch": "histogram",
    "collate_events": "histogram",
    "event_histogram": "histogram",
    "input_histogram": "histogram",
    "batch_preprocess": "pipeline",
    "histograms_to_input": "pipeline",
    "prepare_events": "pipeline",
    "preprocess": "pipeline",
}

__all__ = [
    "EventBatch",
    "InputSpec",
    "batch_preprocess",
    "collate_events",
    "event_histogram",
    "histograms_to_input",
    "input_histogram",
    "prepare_events",
    "preprocess",
]


def __getattr__(name: str) -> Any:
    if name not in _TORCH_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_TORCH_NAMES[name]}"), name)
