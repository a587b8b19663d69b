"""The built-in simulated camera as a labelled dataset (classes and masks), generated deterministically per split."""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

import numpy as np

from mem_core.datasets.base import DatasetError, EventSource
from mem_core.simulator import make_sample, task_config

SIM_SPLITS = {"train": (200, 1), "val": (40, 2), "test": (60, 3)}  # samples per class, seed
# The test split's scenes (its samples and seed) seen under other conditions than the labelled and unlabeled windows:
# what a model learned about the shapes, not about this camera, carries over. Split -> changed camera settings.
SIM_SHIFTED_SPLITS = {
    # another sensor: higher and more uneven contrast thresholds (fewer, patchier events) and 20 times the
    # background activity (a dim scene)
    "test-sensor": {"contrast_threshold": 0.3, "threshold_sigma": 0.06, "noise_rate_hz": 2.0},
    # other objects: smaller (radius 12-20 % of the sensor instead of 18-30 %) and faster (240-480 px/s, not 60-240)
    "test-motion": {"size_range": (0.12, 0.2), "speed_range": (240.0, 480.0)},
}
SIM_DURATION_US = 50_000
# Samples made in this process, shared by every source of a split: a sample depends only on the split's camera, its
# seed and its index, and a process that trains, validates and scores several runs on the sim dataset (the demo, the
# tests) simulates each sample once. (split, seed, index) -> (events, mask); about 40 KB a sample.
_MADE: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = {}
_MADE_MAX = 4096


class SimSource(EventSource):
    """Labelled samples of the built-in simulated camera, generated on demand (deterministic per split)."""

    def __init__(self, split: str, n_per_class: int | None = None, seed: int | None = None):
        if split not in SIM_SPLITS and split not in SIM_SHIFTED_SPLITS:
            raise DatasetError(f"sim splits are {', '.join([*SIM_SPLITS, *SIM_SHIFTED_SPLITS])}, not {split!r}")
        default_n, default_seed = SIM_SPLITS[split if split in SIM_SPLITS else "test"]
        self.config = replace(task_config(), **SIM_SHIFTED_SPLITS.get(split, {}))
        self.name, self.sensor = "sim", self.config.sensor
        self.classes = list(self.config.classes)
        n = n_per_class or default_n
        self.seed = default_seed if seed is None else seed
        self.labels = np.arange(n * len(self.classes), dtype=np.int64) % len(self.classes)
        self._camera = split if split in SIM_SHIFTED_SPLITS else ""  # the camera the samples are made with

    @cached_property
    def _children(self) -> list[np.random.SeedSequence]:
        return np.random.SeedSequence(self.seed).spawn(len(self.labels))

    @property
    def mask_classes(self) -> list[str]:
        return ["background", *self.classes]

    def _sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        # child ``index`` of a SeedSequence's spawn does not depend on how many are spawned, nor its label
        # (``index`` modulo the classes) on the split's size: the sample is the same in a split of any size
        key = (self._camera, self.seed, index)
        if key not in _MADE:
            rng = np.random.default_rng(self._children[index])
            if len(_MADE) >= _MADE_MAX:
                _MADE.pop(next(iter(_MADE)))
            _MADE[key] = make_sample(int(self.labels[index]), rng, self.config, SIM_DURATION_US)
        return _MADE[key]

    def load(self, index: int) -> np.ndarray:
        return self._sample(index)[0]

    def mask(self, index: int) -> np.ndarray:
        return self._sample(index)[1]


def sim(root, split: str) -> EventSource:
    return SimSource(split)
