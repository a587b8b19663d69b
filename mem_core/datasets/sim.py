"""The built-in simulated camera as a labelled dataset (classes and masks), generated deterministically per split."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from mem_core.datasets.base import DatasetError, EventSource
from mem_core.simulator import make_sample, task_config

SIM_SPLITS = {"train": (200, 1), "val": (40, 2), "test": (60, 3)}  # samples per class, seed
SIM_DURATION_US = 50_000


class SimSource(EventSource):
    """Labelled samples of the built-in simulated camera, generated on demand (deterministic per split)."""

    def __init__(self, split: str, n_per_class: int | None = None, seed: int | None = None):
        if split not in SIM_SPLITS:
            raise DatasetError(f"sim splits are {', '.join(SIM_SPLITS)}, not {split!r}")
        default_n, default_seed = SIM_SPLITS[split]
        self.config = task_config()
        self.name, self.sensor = "sim", self.config.sensor
        self.classes = list(self.config.classes)
        n = n_per_class or default_n
        self.seed = default_seed if seed is None else seed
        self.labels = np.arange(n * len(self.classes), dtype=np.int64) % len(self.classes)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @cached_property
    def _children(self) -> list[np.random.SeedSequence]:
        return np.random.SeedSequence(self.seed).spawn(len(self.labels))

    @property
    def mask_classes(self) -> list[str]:
        return ["background", *self.classes]

    def _sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if index not in self._cache:
            rng = np.random.default_rng(self._children[index])
            self._cache[index] = make_sample(int(self.labels[index]), rng, self.config, SIM_DURATION_US)
        return self._cache[index]

    def load(self, index: int) -> np.ndarray:
        return self._sample(index)[0]

    def mask(self, index: int) -> np.ndarray:
        return self._sample(index)[1]


def sim(root, split: str) -> EventSource:
    return SimSource(split)
