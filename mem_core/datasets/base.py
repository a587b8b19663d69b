"""What every dataset is: a list of event samples on one sensor, with class names and labels."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from mem_core.errors import MemError
from mem_core.events import SensorSize, window_start
from mem_core.files import file_problem, read_bounded
from mem_core.io import read_events
from mem_core.io.evz import EXTENSION as PACKED
from mem_core.limits import MAX_LIST_BYTES


class DatasetError(MemError, ValueError):
    """A dataset root that does not have the expected layout, or an unknown split or name; ``folder``: the folder of
    the layout that is not as the dataset wants it, when there is one (its files are no samples of the dataset)."""

    def __init__(self, message: str, folder: Path | None = None) -> None:
        super().__init__(message)
        self.folder = folder


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
        events, _ = read_events(self.files[index])
        inside = (events["x"] < self.sensor.width) & (events["y"] < self.sensor.height)
        return events if inside.all() else events[inside]


def sorted_files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files of ``folder`` with one of ``suffixes`` or packed as ``.evz`` (``mem_core.io.pack``), in numeric
    order (``2.bin`` before ``10.bin``): sample ids follow recording order, which the validation carve-out relies on
    (``datasets.splits``). A packed file sorts as if named with ``suffixes[0]``, so a packed folder lists its samples
    in the original's order. ``DatasetError`` when a sample is there both packed and not."""
    found = [p for p in folder.iterdir() if p.suffix.lower() in (*suffixes, PACKED) and p.is_file()]
    stems: dict[str, Path] = {}
    for path in found:
        if (twin := stems.setdefault(path.stem, path)) is not path:
            raise DatasetError(f"{folder}: sample {path.stem!r} is there twice ({twin.name} and {path.name})")

    def key(path: Path) -> list[int | str]:
        name = path.stem + suffixes[0] if path.suffix.lower() == PACKED else path.name
        return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", name)]

    return sorted(found, key=key)


def sample_file(path: Path) -> Path:
    """``path``, or the ``.evz`` packed from it when only that exists (split and list files name the original)."""
    packed = path.with_suffix(PACKED)
    return packed if not path.exists() and packed.exists() else path


def read_text(path: Path) -> str:
    """The text of a dataset's list or split file, read as every file a user names is (``mem_core.files``: a regular
    file of bounded size); ``DatasetError`` naming it otherwise."""
    try:
        return read_bounded(path, MAX_LIST_BYTES).decode("utf-8")
    except OSError as e:
        raise DatasetError(f"{path}: {file_problem(e)}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise DatasetError(f"{path}: {what} not found")
    return path
