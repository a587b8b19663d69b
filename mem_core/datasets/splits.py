"""Splits a dataset makes itself: the fixed validation carve-out and label fractions for label-efficiency runs.

A validation split must behave like recordings the model never saw. Event datasets number their samples in recording
order (N-Cars ids run through its recordings; N-MNIST and N-Caltech101 files follow the capture order), so samples
drawn at random from the training range have neighbours from the same recording in training, and validation on them
reads 7-13 points higher than truly unseen recordings (docs/RESULTS.md). The carve-out is therefore a contiguous block
per class: the last ``VAL_FRACTION`` of each class in file (= sample id) order. Only choices that are not held-out
data (the labelled fraction of a label-efficiency run, N-Caltech101's historical 80/20 test split) are random.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mem_core.datasets.base import DatasetError

VAL_FRACTION = 0.1
SPLIT_SEED = 20240101  # fixed: the same val/test carve-out on every machine


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (kept, taken) with ``fraction`` of every class taken (at least one per class when possible)."""
    rng = np.random.default_rng(seed)
    taken = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = min(len(idx), max(1, round(fraction * len(idx)))) if fraction > 0 else 0
        taken.append(rng.permutation(idx)[:k])
    taken_idx = np.sort(np.concatenate(taken)) if taken else np.empty(0, dtype=np.int64)
    kept = np.setdiff1d(np.arange(len(labels)), taken_idx)
    return kept, taken_idx


def block_split(labels: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices (kept, taken): of every class, the last ``fraction`` of its samples in the given order (at least one
    when possible) are taken, as one contiguous block of that class."""
    taken = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = min(len(idx), max(1, round(fraction * len(idx)))) if fraction > 0 else 0
        taken.append(idx[len(idx) - k :])
    taken_idx = np.sort(np.concatenate(taken)) if taken else np.empty(0, dtype=np.int64)
    return np.setdiff1d(np.arange(len(labels)), taken_idx), taken_idx


def label_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of a seeded, stratified ``fraction`` of the labelled samples (label-efficiency runs)."""
    if not 0 < fraction <= 1:
        raise DatasetError(f"label fraction must be in (0, 1], got {fraction}")
    if fraction == 1:
        return np.arange(len(labels))
    return stratified_split(labels, fraction, seed)[1]


def carve(files: list[Path], labels: list[int], split: str) -> tuple[list[Path], list[int]]:
    """Split a training list (in file order) into train/val: val is the last ``VAL_FRACTION`` block of each class."""
    kept, taken = block_split(np.asarray(labels), VAL_FRACTION)
    idx = kept if split == "train" else taken
    return [files[i] for i in idx], [labels[i] for i in idx]
