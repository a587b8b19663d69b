"""Datasets by name: where the samples are, their classes and sensor, and how a training window is drawn.

A *source* (``EventSource``) is a list of event samples with labels: it knows its sensor size, class names and how
to load sample ``i``. A ``WindowDataset`` turns a source into what a DataLoader needs: an ``N_max``-event window
per sample (random at train, centred at evaluation) with the event augmentations applied, plus the label. The
histogram, resize and RandAugment happen batched on the model's device (``representation.batch_preprocess``).

Registry (``open_source(name, root, split)``), never guessed from a path:

=================  =====================================================================================
``ncars``          ``root/{train,val,test}`` or the official ``root/n-cars_{train,test}``, each with ``cars/`` and
                   ``background/`` Prophesee ``.dat`` files; without a ``val`` folder, val is a fixed 10 % of train
``nmnist``         ``root`` with ``<id> <class>`` list files (``train*.txt`` / ``test*.txt``) naming ``<id>.bs2`` or
                   ``<id>.bin``, or the official ``root/{Train,Test}/<digit>/*.bin``; val is a fixed 10 % of train
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

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from mem_core.augment import augment_events
from mem_core.errors import MemError
from mem_core.events import SensorSize, window_start
from mem_core.representation import collate_events

VAL_FRACTION = 0.1
SPLIT_SEED = 20240101  # fixed: the same val/test carve-out on every machine


class DatasetError(MemError, ValueError):
    """A dataset root that does not have the expected layout, or an unknown split or name."""


class EventSource(ABC):
    """A labelled (or unlabeled, label -1) collection of event samples on one sensor."""

    name: str
    sensor: SensorSize
    classes: list[str]
    labels: np.ndarray  # (N,) int64, -1 = no label

    def __len__(self) -> int:
        return len(self.labels)

    @abstractmethod
    def load(self, index: int) -> np.ndarray:
        """All events of sample ``index`` (EVENT_DTYPE, sorted)."""

    def load_window(self, index: int, n: int, rng: np.random.Generator | None) -> np.ndarray:
        """An ``n``-event window of sample ``index``: random with ``rng``, centred without."""
        events = self.load(index)
        start = window_start(len(events), n, rng)
        return events[start : start + n]

    def mask(self, index: int) -> np.ndarray | None:
        """The per-pixel label image of sample ``index`` (segmentation sources), else None."""
        return None

    @property
    def mask_classes(self) -> list[str]:
        """Names of the label-image values (segmentation); the class names unless a source says otherwise."""
        return self.classes


class FileSource(EventSource):
    """Samples stored one per file, read with ``mem_core.io.read_events``."""

    def __init__(self, name: str, files: list[Path], labels: list[int], classes: list[str], sensor: SensorSize):
        if not files:
            raise DatasetError(f"{name}: no sample files found")
        self.name, self.files, self.classes, self.sensor = name, files, classes, sensor
        self.labels = np.asarray(labels, dtype=np.int64)

    def load(self, index: int) -> np.ndarray:
        from mem_core.io import read_events

        events, _ = read_events(self.files[index])
        inside = (events["x"] < self.sensor.width) & (events["y"] < self.sensor.height)
        return events if inside.all() else events[inside]


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


def label_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of a seeded, stratified ``fraction`` of the labelled samples (label-efficiency runs)."""
    if not 0 < fraction <= 1:
        raise DatasetError(f"label fraction must be in (0, 1], got {fraction}")
    if fraction == 1:
        return np.arange(len(labels))
    return stratified_split(labels, fraction, seed)[1]


def _sorted_files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in suffixes and p.is_file())


def _carve(files: list[Path], labels: list[int], split: str) -> tuple[list[Path], list[int]]:
    """Split a training list into train/val (fixed seed, stratified)."""
    kept, taken = stratified_split(np.asarray(labels), VAL_FRACTION, SPLIT_SEED)
    idx = kept if split == "train" else taken
    return [files[i] for i in idx], [labels[i] for i in idx]


def _require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise DatasetError(f"{path}: {what} not found")
    return path


# ---------------------------------------------------------------------------------------------- N-Cars

NCARS_CLASSES = ["background", "cars"]
NCARS_SENSOR = SensorSize(100, 120)


def ncars(root: Path, split: str) -> EventSource:
    root = _require_dir(Path(root), "N-Cars root")
    official = {"train": "n-cars_train", "test": "n-cars_test"}
    carve = False
    if (root / split).is_dir():
        folder = root / split
    elif split in official and (root / official[split]).is_dir():
        folder = root / official[split]
    elif split == "val" and ((root / "train").is_dir() or (root / "n-cars_train").is_dir()):
        folder, carve = (root / "train" if (root / "train").is_dir() else root / "n-cars_train"), True
    else:
        raise DatasetError(f"{root}: no N-Cars split {split!r} (expected {split}/ or n-cars_{split}/ folders)")
    files, labels = [], []
    for label, cls in enumerate(NCARS_CLASSES):
        sub = _require_dir(folder / cls, f"N-Cars class folder {cls!r}")
        found = _sorted_files(sub, (".dat",))
        files += found
        labels += [label] * len(found)
    if carve or (split == "train" and not (root / "val").is_dir()):
        files, labels = _carve(files, labels, "val" if carve else "train")
    return FileSource("ncars", files, labels, NCARS_CLASSES, NCARS_SENSOR)


# ---------------------------------------------------------------------------------------------- N-MNIST

NMNIST_SENSOR = SensorSize(34, 34)


def nmnist(root: Path, split: str) -> EventSource:
    root = _require_dir(Path(root), "N-MNIST root")
    classes = [str(d) for d in range(10)]
    base = "test" if split == "test" else "train"
    official = root / base.capitalize()
    files: list[Path] = []
    labels: list[int] = []
    if official.is_dir():
        for label, cls in enumerate(classes):
            found = _sorted_files(official / cls, (".bin", ".bs2")) if (official / cls).is_dir() else []
            files += found
            labels += [label] * len(found)
    else:
        lists = sorted(p for p in root.glob("*.txt") if p.name.lower().startswith(base))
        if not lists:
            raise DatasetError(f"{root}: no N-MNIST {base} list file ({base}*.txt with '<id> <class>' lines)")
        for line in lists[0].read_text().splitlines():
            parts = line.split()
            if len(parts) < 2 or line.lstrip().startswith("#"):
                continue
            sample, label = parts[0], int(parts[1])
            path = next(
                (root / f"{sample}{ext}" for ext in (".bs2", ".bin") if (root / f"{sample}{ext}").exists()), None
            )
            if path is None:
                raise DatasetError(f"{lists[0]}: sample {sample} has no {sample}.bs2 or {sample}.bin in {root}")
            files.append(path)
            labels.append(label)
    if split in ("train", "val"):
        files, labels = _carve(files, labels, split)
    elif split != "test":
        raise DatasetError(f"N-MNIST has splits train, val, test, not {split!r}")
    return FileSource("nmnist", files, labels, classes, NMNIST_SENSOR)


# ---------------------------------------------------------------------------------------------- N-Caltech101

NCALTECH_SENSOR = SensorSize(180, 240)
NCALTECH_TEST_FRACTION = 0.2


def ncaltech101_split(root: Path, split_file: Path | None = None) -> dict[str, list[list]]:
    """The fixed split ``{"train"|"val"|"test": [[relative path, class name], ...]}``: read, or made once and written.

    Classes are the exact folder names (no substring matching); 20 % of every class is test, 10 % of the rest val.
    """
    root = Path(root)
    split_file = Path(split_file) if split_file else root / "mem-split.json"
    if split_file.is_file():
        return json.loads(split_file.read_text())
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise DatasetError(f"{root}: no N-Caltech101 class folders")
    files, labels = [], []
    for label, cls in enumerate(classes):
        found = _sorted_files(root / cls, (".bin",))
        files += found
        labels += [label] * len(found)
    labels_arr = np.asarray(labels)
    trainval, test = stratified_split(labels_arr, NCALTECH_TEST_FRACTION, SPLIT_SEED)
    train_rel, val_rel = stratified_split(labels_arr[trainval], VAL_FRACTION, SPLIT_SEED + 1)
    split = {
        name: [[str(files[i].relative_to(root)), classes[labels[i]]] for i in idx]
        for name, idx in (("train", trainval[train_rel]), ("val", trainval[val_rel]), ("test", test))
    }
    if not os.access(split_file.parent, os.W_OK):
        raise DatasetError(f"cannot write the split file {split_file}: pass data.split_file=<writable path>")
    split_file.write_text(json.dumps(split, indent=1))
    return split


def ncaltech101(root: Path, split: str, split_file: Path | None = None) -> EventSource:
    root = _require_dir(Path(root), "N-Caltech101 root")
    table = ncaltech101_split(root, split_file)
    if split not in table:
        raise DatasetError(f"N-Caltech101 has splits train, val, test, not {split!r}")
    classes = sorted({cls for entries in table.values() for _, cls in entries})
    index = {c: i for i, c in enumerate(classes)}
    files = [root / rel for rel, _ in table[split]]
    labels = [index[cls] for _, cls in table[split]]
    return FileSource("ncaltech101", files, labels, classes, NCALTECH_SENSOR)


# ---------------------------------------------------------------------------------------------- N-ImageNet

NIMAGENET_SENSOR = SensorSize(480, 640)


def nimagenet(root: Path, split: str) -> EventSource:
    root = _require_dir(Path(root), "N-ImageNet root")
    folder = next((root / n for n in (split, f"extracted_{split}") if (root / n).is_dir()), None)
    if folder is None:
        raise DatasetError(f"{root}: no N-ImageNet split {split!r} ({split}/ or extracted_{split}/)")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    files, labels = [], []
    for label, cls in enumerate(classes):
        found = _sorted_files(folder / cls, (".npz",))
        files += found
        labels += [label] * len(found)
    return FileSource("nimagenet", files, labels, classes, NIMAGENET_SENSOR)


# ---------------------------------------------------------------------------------------------- registry

SourceFactory = Callable[..., EventSource]
REGISTRY: dict[str, SourceFactory] = {
    "ncars": ncars,
    "nmnist": nmnist,
    "ncaltech101": ncaltech101,
    "nimagenet": nimagenet,
}


def register(name: str, factory: SourceFactory) -> None:
    REGISTRY[name] = factory


def dataset_names() -> list[str]:
    _load_optional_sources()
    return sorted(REGISTRY)


def _load_optional_sources() -> None:
    """Sources whose modules import heavier dependencies register themselves on first use."""
    from mem_core import dataset_sources  # noqa: F401  (registers corpus, dsec-semantic, sim)


def open_source(name: str, root: Path | str | None, split: str, **options) -> EventSource:
    """The samples of dataset ``name`` under ``root`` for ``split`` (train / val / test)."""
    _load_optional_sources()
    if name not in REGISTRY:
        raise DatasetError(f"unknown dataset {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](root, split, **options)


# ---------------------------------------------------------------------------------------------- windows


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
    """DataLoader collate: padded event batch, labels (B,), masks (B, H, W) or None."""
    events, labels, masks = zip(*items, strict=True)
    batch = collate_events(list(events), sensor)
    label_t = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    mask_t = None if masks[0] is None else torch.as_tensor(np.stack(masks).astype(np.int64))
    return batch, label_t, mask_t
