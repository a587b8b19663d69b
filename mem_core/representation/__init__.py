"""Model input: event histograms and the events -> tensor pipeline (docs/ARCHITECTURE.md, "The model input").

``histogram`` counts events (numba on CPU, ``torch.bincount`` on GPU), ``spec`` holds ``InputSpec`` (stored with
every model), ``pipeline`` turns windows into normalized, resized, augmented model inputs. The names below are the
ones the rest of MEM uses; the single steps (hot pixels, normalization, resize, log scale) live in ``pipeline``.
"""

from mem_core.representation.histogram import EventBatch, collate_events, event_histogram, input_histogram
from mem_core.representation.pipeline import batch_preprocess, histograms_to_input, prepare_events, preprocess
from mem_core.representation.spec import InputSpec

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
