"""Samples as a DataLoader sees them: an ``N_max``-event window per sample, augmented at train time, plus the label.

The histogram, resize and RandAugment happen batched on the model's device (``representation.batch_preprocess``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from mem_core.augment import augment_events
from mem_core.datasets.base import EventSource
from mem_core.events import SensorSize
from mem_core.representation import collate_events


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The augmentation generator of one sample in one epoch (independent of workers and ranks)."""
    return np.random.default_rng([seed, epoch, index])


class WindowDataset(Dataset):
    """A source seen as model-input windows: ``dataset[(index, epoch)]`` -> ``(events, label, mask or None)``.

    At train time the window is random and augmented with a generator derived from ``(seed, epoch, index)``;
    at evaluation it is the centred window, unaugmented, so evaluation is deterministic.
    """

    def __init__(self, source: EventSource, spec, *, train: bool, seed: int = 0, indices: np.ndarray | None = None):
        self.source, self.spec, self.train, self.seed = source, spec, train, seed
        self.indices = np.arange(len(source)) if indices is None else np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def labels(self) -> np.ndarray:
        return self.source.labels[self.indices]

    def __getitem__(self, key: int | tuple[int, int]):
        position, epoch = key if isinstance(key, tuple) else (key, 0)
        index = int(self.indices[position])
        rng = sample_rng(self.seed, epoch, index) if self.train else None
        events = self.source.load_window(index, self.spec.n_max, rng)
        mask = self.source.mask(index)
        if self.train:
            events = augment_events(events, self.source.sensor, self.spec, rng)
        return events, int(self.source.labels[index]), mask


def collate_windows(items, sensor: SensorSize):
    """DataLoader collate: the windows in an EventBatch, labels (B,), masks (B, H, W) or None."""
    events, labels, masks = zip(*items, strict=True)
    batch = collate_events(list(events), sensor)
    label_t = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    mask_t = None if masks[0] is None else torch.as_tensor(np.stack(masks).astype(np.int64))
    return batch, label_t, mask_t
