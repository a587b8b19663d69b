"""Sources beyond plain one-file-per-sample datasets: MEM corpora, DSEC-Semantic and the simulated camera.

They register themselves in ``mem_core.datasets.REGISTRY`` on import (``open_source`` imports this module).
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np

from mem_core.corpus import Corpus
from mem_core.datasets import DatasetError, EventSource, _require_dir, register
from mem_core.events import SensorSize, window_start

# ---------------------------------------------------------------------------------------------- corpus

CORPUS_SLOT = 30_000  # events per sample slot of a long recording
CORPUS_VAL_EVERY = 20  # every 20th slot is validation


class CorpusSource(EventSource):
    """A MEM corpus as samples. Each recording is cut into slots of ``slot`` events (a short recording is one slot);
    ``split`` ``train`` / ``val`` takes every slot but / only each ``CORPUS_VAL_EVERY``-th one, ``all`` everything.

    With ``window`` (the model's events per input), a slot holds ``slot // window`` samples, so one epoch reads the
    corpus about once; without it a slot is one sample. At train time a sample's window is drawn at random inside
    its slot, so a long recording yields fresh windows every epoch and never reaches into another split's slot; at
    evaluation sample ``k`` of a slot is its ``k``-th window. Recording labels (class names) become class ids;
    unlabeled recordings get -1.
    """

    def __init__(self, root: Path, split: str, slot: int = CORPUS_SLOT, window: int | None = None):
        if slot < 1 or (window is not None and window < 1):
            raise DatasetError(f"corpus slot and window must be >= 1 events, got slot={slot}, window={window}")
        self.name = "corpus"
        self.corpus = Corpus(root)
        recordings = self.corpus.recordings
        if not recordings:
            raise DatasetError(f"{root}: the corpus holds no recordings")
        sensors = {r.sensor for r in recordings}
        self.sensor = SensorSize(max(s.height for s in sensors), max(s.width for s in sensors))
        names = sorted({str(r.label) for r in recordings if r.label is not None})
        self.classes = names
        slots = []  # (recording, first event, events in slot)
        for i, r in enumerate(recordings):
            n_slots = max(1, r.n_events // slot)
            for k in range(n_slots):
                lo = k * slot
                hi = r.n_events if k == n_slots - 1 else lo + slot
                slots.append((i, lo, hi - lo))
        table = np.asarray(slots, dtype=np.int64).reshape(-1, 3)
        if split == "train":
            # a one-slot corpus cannot be split: train and val then share that slot
            keep = np.arange(len(table)) % CORPUS_VAL_EVERY != 0 if len(table) > 1 else slice(None)
        elif split == "val":
            keep = np.arange(len(table)) % CORPUS_VAL_EVERY == 0
        elif split == "all":
            keep = slice(None)
        else:
            raise DatasetError(f"corpus splits are train, val and all, not {split!r}")
        table = table[keep]
        parts = np.maximum(1, table[:, 2] // window) if window else np.ones(len(table), dtype=np.int64)
        # one row per sample: (recording, first event, events in slot, part, parts)
        part = np.arange(parts.sum()) - np.repeat(np.cumsum(parts) - parts, parts)
        self.samples = np.column_stack([np.repeat(table, parts, axis=0), part, np.repeat(parts, parts)])
        index = {c: k for k, c in enumerate(names)}
        self.labels = np.asarray(
            [index[str(recordings[i].label)] if recordings[i].label is not None else -1 for i in self.samples[:, 0]],
            dtype=np.int64,
        )

    def _part(self, index: int) -> tuple[int, int, int]:
        """(recording, first event, events) of sample ``index``'s share of its slot."""
        rec, lo, count, part, parts = (int(v) for v in self.samples[index])
        size = count // parts
        return rec, lo + part * size, count - part * size if part == parts - 1 else size

    def load(self, index: int) -> np.ndarray:
        rec, lo, count = self._part(index)
        return self.corpus.window(rec, lo, count)

    def load_window(self, index: int, n: int, rng: np.random.Generator | None) -> np.ndarray:
        rec, lo, count = (int(v) for v in self.samples[index, :3]) if rng is not None else self._part(index)
        total = self.corpus.recordings[rec].n_events
        # a window longer than its slot (or part) reaches into the neighbours, centred on it
        start = lo + window_start(count, n, rng) if count >= n else max(0, min(lo + count // 2 - n // 2, total - n))
        return self.corpus.window(rec, start, n)


def corpus(root, split: str, window: int | None = None) -> EventSource:
    if root is None:
        raise DatasetError("the corpus dataset needs --data CORPUS_DIR")
    return CorpusSource(_require_dir(Path(root), "corpus directory"), split, window=window)


# ---------------------------------------------------------------------------------------------- DSEC-Semantic

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
        split_dir = _require_dir(Path(root) / split, f"DSEC-Semantic split {split!r}")
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
        self._files: dict[Path, object] = {}
        self._pid = os.getpid()

    def _h5(self, path: Path):
        import h5py
        import hdf5plugin  # noqa: F401  (registers the Blosc/ZSTD filters DSEC files use)

        if self._pid != os.getpid():  # a handle opened before a fork must not be used after it
            self._files, self._pid = {}, os.getpid()
        if path not in self._files:
            self._files[path] = h5py.File(path, "r")
        return self._files[path]

    def __getstate__(self):
        return {**self.__dict__, "_files": {}}

    def load(self, index: int) -> np.ndarray:
        from mem_core.events import make_events

        path, _, t_label = self.items[index]
        f = self._h5(path)
        t_offset = int(f["t_offset"][()]) if "t_offset" in f else 0
        t1 = t_label - t_offset
        t0 = t1 - DSEC_WINDOW_US
        ms_to_idx = f["ms_to_idx"]  # ms_to_idx[k]: index of the first event with t >= k ms
        lo_ms = min(max(t0 // 1000, 0), len(ms_to_idx) - 1)
        hi_ms = min(max(t1 // 1000 + 1, 0), len(ms_to_idx) - 1)
        lo, hi = int(ms_to_idx[lo_ms]), int(ms_to_idx[hi_ms]) if t1 // 1000 + 1 < len(ms_to_idx) else None
        ev = f["events"]
        t = ev["t"][lo:hi].astype(np.int64)
        keep = (t >= t0) & (t < t1)
        columns = {name: ev[name][lo:hi][keep] for name in ("x", "y", "p")}
        inside = columns["y"] < self.sensor.height
        return make_events(t[keep][inside] + t_offset, columns["x"][inside], columns["y"][inside], columns["p"][inside])

    def mask(self, index: int) -> np.ndarray:
        from PIL import Image

        label = np.asarray(Image.open(self.items[index][1]))
        return label[: self.sensor.height, : self.sensor.width].astype(np.uint8)


def dsec_semantic(root, split: str) -> EventSource:
    if root is None:
        raise DatasetError("dsec-semantic needs --data DSEC_SEMANTIC_ROOT")
    return DsecSemanticSource(_require_dir(Path(root), "DSEC-Semantic root"), split)


# ---------------------------------------------------------------------------------------------- simulator

SIM_SPLITS = {"train": (200, 1), "val": (40, 2), "test": (60, 3)}  # samples per class, seed
SIM_DURATION_US = 50_000


class SimSource(EventSource):
    """Labelled samples of the built-in simulated camera, generated on demand (deterministic per split)."""

    def __init__(self, split: str, n_per_class: int | None = None, seed: int | None = None):
        if split not in SIM_SPLITS:
            raise DatasetError(f"sim splits are {', '.join(SIM_SPLITS)}, not {split!r}")
        from mem_core.simulator import task_config

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
        from mem_core.simulator import make_sample

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


register("corpus", corpus)
register("dsec-semantic", dsec_semantic)
register("sim", sim)
