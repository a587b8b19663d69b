"""Model input: event histograms and the events -> tensor pipeline (DESIGN.md §3 "Representation").

``histogram`` counts events (numba on CPU, ``torch.bincount`` on GPU), ``spec`` holds ``InputSpec`` (stored with
every model), ``pipeline`` turns windows into normalized, resized, augmented model inputs.
"""

from mem_core.representation.histogram import (
    EventBatch,
    batch_histogram,
    collate_events,
    event_histogram,
    input_histogram,
    temporal_histogram,
    timestamp_histogram,
)
from mem_core.representation.pipeline import (
    batch_preprocess,
    crop_histogram,
    histograms_to_input,
    log_scale,
    normalize_histogram,
    prepare_events,
    preprocess,
    remove_hot_pixels,
    resize_histogram,
)
from mem_core.representation.spec import CHANNELS, LOG_GAIN, SCALES, InputSpec, n_channels

__all__ = [
    "CHANNELS",
    "LOG_GAIN",
    "SCALES",
    "EventBatch",
    "InputSpec",
    "batch_histogram",
    "batch_preprocess",
    "collate_events",
    "crop_histogram",
    "event_histogram",
    "histograms_to_input",
    "input_histogram",
    "log_scale",
    "n_channels",
    "normalize_histogram",
    "prepare_events",
    "preprocess",
    "remove_hot_pixels",
    "resize_histogram",
    "temporal_histogram",
    "timestamp_histogram",
]
