"""DSEC-Semantic (Sun et al., ECCV 2022): driving sequences with 11-class label images, 50 ms of events each."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
from PIL import Image

from mem_core.datasets.base import DatasetError, EventSource, require_dir
from mem_core.events import SensorSize, make_events
from mem_core.files import check_regular, os_problem
from mem_core.io.base import EventFileError
from mem_core.io.hdf5 import LayoutError, dsec_columns, hdf5_filters

DSEC_CLASSES = [
    "background",
    "building",
    "fence",
    "person",
    "pole",
    "road",
    "sidewalk",
    "vegetation",
    "car",
    "wall",
    "traffic-sign",
]
DSEC_SENSOR = SensorSize(440, 640)  # the label images cover the top 440 rows of the 480 x 640 sensor
DSEC_WINDOW_US = 50_000


class DsecSemanticSource(EventSource):
    """DSEC-Semantic: the 50 ms of events before each label image, labels 0..10 (255 = ignore)."""

    def __init__(self, root: Path, split: str):
        self.name, self.sensor, self.classes = "dsec-semantic", DSEC_SENSOR, DSEC_CLASSES
        split_dir = require_dir(Path(root) / split, f"DSEC-Semantic split {split!r}")
        self.items: list[tuple[Path, Path, int]] = []  # (events.h5, label png, timestamp us)
        for seq in sorted(d for d in split_dir.iterdir() if d.is_dir()):
            events = seq / "events" / "left" / "events.h5"
            label_dir = seq / "semantic" / "left" / "11classes"
            stamps = next(
                (p for p in (label_dir / "timestamps.txt", seq / "semantic" / "timestamps.txt") if p.is_file()), None
            )
            if not events.is_file() or stamps is None:
                raise DatasetError(f"{seq}: expected events/left/events.h5 and semantic/.../timestamps.txt")
            times = [int(float(v)) for v in stamps.read_text().split()]
            pngs = sorted((label_dir / "data").glob("*.png"))
            if len(pngs) != len(times):
                raise DatasetError(f"{seq}: {len(pngs)} label images but {len(times)} timestamps")
            self.items += [(events, png, t) for png, t in zip(pngs, times, strict=True)]
        if not self.items:
            raise DatasetError(f"{split_dir}: no DSEC-Semantic sequences")
        self.labels = np.full(len(self.items), -1, dtype=np.int64)
        self._files: dict[Path, tuple[dict[str, h5py.Dataset], int]] = {}
        self._pid = os.getpid()

    def _h5(self, path: Path):
        if self._pid != os.getpid():  # a handle opened before a fork must not be used after it
            self._files, self._pid = {}, os.getpid()
        if path not in self._files:
            self._files[path] = _open_events(path)
        return self._files[path]

    def __getstate__(self):
        return {**self.__dict__, "_files": {}}

    def load(self, index: int) -> np.ndarray:
        path, _, t_label = self.items[index]
        ev, t_offset = self._h5(path)
        ms_to_idx = ev["ms_to_idx"]  # ms_to_idx[k]: index of the first event with t >= k ms
        t1 = t_label - t_offset
        t0 = t1 - DSEC_WINDOW_US
        lo_ms = min(max(t0 // 1000, 0), len(ms_to_idx) - 1)
        hi_ms = min(max(t1 // 1000 + 1, 0), len(ms_to_idx) - 1)
        lo, hi = int(ms_to_idx[lo_ms]), int(ms_to_idx[hi_ms]) if t1 // 1000 + 1 < len(ms_to_idx) else None
        t = ev["t"][lo:hi].astype(np.int64)
        keep = (t >= t0) & (t < t1)
        columns = {name: ev[name][lo:hi][keep] for name in ("x", "y", "p")}
        inside = columns["y"] < self.sensor.height
        return make_events(t[keep][inside] + t_offset, columns["x"][inside], columns["y"][inside], columns["p"][inside])

    def mask(self, index: int) -> np.ndarray:
        label = np.asarray(Image.open(self.items[index][1]))
        return label[: self.sensor.height, : self.sensor.width].astype(np.uint8)


def _open_events(path: Path) -> tuple[dict[str, h5py.Dataset], int]:
    """The ``events/{x,y,t,p}`` and ``ms_to_idx`` datasets and ``t_offset`` of a sequence's ``events.h5``, checked
    as ``read_dsec`` checks a file (``mem_core.io.hdf5.dsec_columns``), kept open to read windows from."""
    try:
        check_regular(path)  # h5py opens the file by name: a FIFO would block it
        hdf5_filters()
        return dsec_columns(h5py.File(path, "r"), path, also=("ms_to_idx",))
    except EventFileError as e:
        raise DatasetError(str(e)) from None
    except LayoutError as e:
        raise DatasetError(f"{path}: refused: {e}") from None
    except OSError as e:  # NotRegularFile included
        raise DatasetError(f"{path}: {os_problem(e)}") from None
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise DatasetError(f"{path}: corrupt HDF5 file ({type(e).__name__}: {e})") from None


def dsec_semantic(root, split: str) -> EventSource:
    if root is None:
        raise DatasetError("dsec-semantic needs --data DSEC_SEMANTIC_ROOT")
    return DsecSemanticSource(require_dir(Path(root), "DSEC-Semantic root"), split)
