"""Datasets by name, never guessed from a path: ``open_source(name, root, split)``.

=================  =====================================================================================
``ncars``          ``root/{train,val,test}`` or the official ``root/n-cars_{train,test}``, each with ``cars/`` and
                   ``background/`` Prophesee ``.dat`` files; without a ``val`` folder, val is 10 % of train in blocks
``nmnist``         ``root`` with ``<id> <class>`` list files (``train*.txt`` / ``test*.txt``) naming ``<id>.bs2`` or
                   ``<id>.bin``, or the official ``root/{Train,Test}/<digit>/*.bin``; val is 10 % of train in blocks
``ncaltech101``    ``root/<class>/*.bin`` (101 classes incl. ``BACKGROUND_Google``); the fixed 80/20 train/test
                   split (val = 10 % of train) is written once to a split file and read from it afterwards
``nimagenet``      ``root/{train,val}/<wnid>/*.npz`` (or ``extracted_train`` / ``extracted_val``)
``dsec-semantic``  ``root/<split>/<sequence>/events/left/events.h5`` + ``semantic/left/11classes/{timestamps.txt,
                   data/*.png}``: 50 ms of events before each label image
``corpus``         a MEM corpus directory (unlabeled unless its recordings carry labels)
``sim``            the built-in simulated camera (labels and masks), generated deterministically per split
=================  =====================================================================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

from mem_core.datasets import corpus, dsec_semantic, ncaltech101, ncars, nimagenet, nmnist, sim
from mem_core.datasets.base import DatasetError, EventSource

SourceFactory = Callable[..., EventSource]
REGISTRY: dict[str, SourceFactory] = {
    "ncars": ncars.ncars,
    "nmnist": nmnist.nmnist,
    "ncaltech101": ncaltech101.ncaltech101,
    "nimagenet": nimagenet.nimagenet,
    "dsec-semantic": dsec_semantic.dsec_semantic,
    "corpus": corpus.corpus,
    "sim": sim.sim,
}
# The time every sample of a dataset spans, where all span the same: the window a model trained on it is served on.
SAMPLE_SPANS_US: dict[str, int] = {
    "ncars": ncars.NCARS_SAMPLE_US,
    "dsec-semantic": dsec_semantic.DSEC_WINDOW_US,
    "sim": sim.SIM_DURATION_US,
}


# Datasets that need no folder: every other one is refused without ``--data`` in one line.
ROOTLESS = {"sim"}


def _check_root(name: str, root: Path | str | None) -> None:
    if name not in REGISTRY:
        raise DatasetError(f"unknown dataset {name!r}; known: {', '.join(sorted(REGISTRY))}")
    if root is None and name not in ROOTLESS:
        raise DatasetError(f"the {name} dataset needs --data PATH (its folder)")


def register(name: str, factory: SourceFactory, sample_us: int | None = None) -> None:
    """Add (or replace) a dataset: ``factory(root, split, **options)`` returns an ``EventSource``; ``sample_us`` is
    the time span of every sample, if they all span the same."""
    REGISTRY[name] = factory
    SAMPLE_SPANS_US.pop(name, None)
    if sample_us is not None:
        SAMPLE_SPANS_US[name] = sample_us


def sample_span_us(name: str | None) -> int | None:
    """The time span in microseconds of every sample of dataset ``name``, or None where samples differ in span."""
    return SAMPLE_SPANS_US.get(name) if name is not None else None


def dataset_names() -> list[str]:
    return sorted(REGISTRY)


def open_shipped(name: str, root: Path | str | None, split: str, **options) -> EventSource:
    """``split`` of dataset ``name`` as the dataset ships it, nothing held out of it: the validation split a dataset
    carves from its training samples and the guards around it (which neither split uses) stay in train. What
    ``mem ingest`` keeps: every file goes into the corpus, and the splits are carved when training reads it.
    A dataset that carves takes ``held_out=False``; the others ship their splits whole."""
    _check_root(name, root)
    factory = REGISTRY[name]
    if "held_out" in inspect.signature(factory).parameters:
        options["held_out"] = False
    return factory(root, split, **options)


def open_source(name: str, root: Path | str | None, split: str, **options) -> EventSource:
    """The samples of dataset ``name`` under ``root`` for ``split`` (train / val / test)."""
    _check_root(name, root)
    return REGISTRY[name](root, split, **options)
