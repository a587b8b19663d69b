"""Splits a dataset makes itself: the fixed validation carve-out and label fractions for label-efficiency runs.

A validation split must behave like recordings the model never saw. Event datasets number their samples in recording
order (N-Cars ids run through its recordings; N-MNIST and N-Caltech101 files follow the capture order), so samples
drawn at random from the training range have neighbours from the same recording in training, and validation on them
reads 7-13 points higher than truly unseen recordings. One contiguous block at the end shares no recording with
training but holds only a handful of recordings, and misjudged the gap between two models by a factor of two to three
on N-Cars (docs/RESULTS.md, section 2). The carve-out is therefore ``VAL_BLOCKS`` contiguous blocks per class, one
centred in each equal stretch of the class's samples in file (= sample id) order, each with a guard of half a block
(rounded down) on both sides that neither split uses, so a recording straddling a block's edge is not on both sides;
small datasets, whose blocks are single samples, keep all their other samples for training. Only choices that are
not held-out data (the labelled fraction of a label-efficiency run, N-Caltech101's historical 80/20 test split) are
random.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mem_core.datasets.base import DatasetError

VAL_FRACTION = 0.1
VAL_BLOCKS = 10  # blocks per class: many recordings, spread like an unseen test split's
GUARD_RATIO = 0.5  # guard on each side of a block, in block lengths (rounded down): left unused
SPLIT_SEED = 20240101  # fixed: the same test carve-out on every machine
TRAIN, VAL, GUARD = 0, 1, 2  # roles of the samples of an ordered sequence


def held_out_blocks(n: int, fraction: float, blocks: int = VAL_BLOCKS) -> np.ndarray:
    """The role (``TRAIN``, ``VAL`` or ``GUARD``) of each of ``n`` samples in recording order.

    ``fraction`` of them (at least one when ``n >= 2``) are validation, in up to ``blocks`` contiguous blocks, one
    centred in each of ``blocks`` equal stretches of the sequence. Each block has ``GUARD_RATIO`` of its length
    (rounded down) on both sides as guard, shrunk where needed so that training keeps at least as many samples as
    validation.
    """
    roles = np.full(n, TRAIN, dtype=np.int8)
    k = min(n - 1, max(1, round(fraction * n))) if fraction > 0 and n >= 2 else 0
    if k == 0:
        return roles
    b = min(blocks, k)
    guard = min(math.floor(GUARD_RATIO * k / b), max(0, (n - 2 * k) // (2 * b)))
    stretches = np.array_split(np.arange(n), b)
    for stretch, size in zip(stretches, (len(part) for part in np.array_split(np.arange(k), b)), strict=True):
        size = min(size, len(stretch))
        start = stretch[0] + (len(stretch) - size) // 2
        roles[max(0, start - guard) : start + size + guard] = GUARD
        roles[start : start + size] = VAL
    return roles


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
    """Indices (kept, taken) of samples in recording order: of every class, ``held_out_blocks`` of its samples are
    taken; its guard samples are in neither."""
    roles = np.empty(len(labels), dtype=np.int8)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        roles[idx] = held_out_blocks(len(idx), fraction)
    return np.flatnonzero(roles == TRAIN), np.flatnonzero(roles == VAL)


def label_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of a seeded, stratified ``fraction`` of the labelled samples (label-efficiency runs)."""
    if not 0 < fraction <= 1:
        raise DatasetError(f"label fraction must be in (0, 1], got {fraction}")
    if fraction == 1:
        return np.arange(len(labels))
    return stratified_split(labels, fraction, seed)[1]


def carve(files: list[Path], labels: list[int], split: str) -> tuple[list[Path], list[int]]:
    """Split a training list (in file order) into train/val: ``VAL_FRACTION`` of each class in spread blocks."""
    kept, taken = block_split(np.asarray(labels), VAL_FRACTION)
    idx = kept if split == "train" else taken
    return [files[i] for i in idx], [labels[i] for i in idx]
