"""Datasets: where the samples are, their classes and sensor, and how a training window is drawn.

A *source* (``EventSource``, in ``base``) is a list of event samples with labels: it knows its sensor size, class
names and how to load sample ``i``. One module per dataset family (``ncars``, ``nmnist``, ``ncaltech101``,
``nimagenet``, ``dsec_semantic``, ``corpus``, ``sim``), found by name through ``registry.open_source``.
``windows.WindowDataset`` turns a source into what a DataLoader needs.
"""

from mem_core.datasets.base import DatasetError, EventSource, FileSource
from mem_core.datasets.registry import (
    REGISTRY,
    dataset_names,
    open_shipped,
    open_source,
    register,
    sample_span_us,
)
from mem_core.datasets.splits import label_subset, stratified_split
from mem_core.datasets.windows import WindowDataset, collate_windows, sample_rng

__all__ = [
    "REGISTRY",
    "DatasetError",
    "EventSource",
    "FileSource",
    "WindowDataset",
    "collate_windows",
    "dataset_names",
    "label_subset",
    "open_shipped",
    "open_source",
    "register",
    "sample_rng",
    "sample_span_us",
    "stratified_split",
]
