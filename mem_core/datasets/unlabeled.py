"""Unlabeled recordings for the stages that learn without labels (tokenizer, pretraining): corpora written by
``mem record`` / ``mem ingest``, or folders of event files, joined to a dataset's training split.

A camera records far more than anyone labels. ``data.unlabeled`` names such recordings; the tokenizer and the
pretraining read them together with the labelled data's training split, every label dropped, and validate on its
validation split as before. Each one is described by ``describe`` (what it is, a digest, its recordings and events),
and the run's config keeps that description, so a result names what it was pretrained on.

All of them must come from the labelled data's sensor: the model input's geometry (histogram, resize, crop) is the
one a finetuned model is later served with, so a recording of another sensor would teach it another picture. A
recording of another size is refused in one line naming it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from mem_core.corpus import MANIFEST, Corpus, CorpusError
from mem_core.datasets.base import DatasetError, EventSource, FileSource, sorted_files
from mem_core.events import SensorSize
from mem_core.io import EventFileError, read_events
from mem_core.io.registry import extensions

CORPUS, FOLDER = "corpus", "folder"


def kind_of(path: Path) -> str:
    """``corpus`` for a corpus directory (it holds a manifest), ``folder`` for any other directory."""
    if not path.is_dir():
        raise DatasetError(f"{path}: unlabeled recordings must be a corpus or a folder of event files, not a file")
    return CORPUS if (path / MANIFEST).is_file() else FOLDER


def event_files(folder: Path) -> list[Path]:
    """Every event file under ``folder`` (searched recursively, in a stable order)."""
    suffixes = tuple(sorted(extensions()))
    folders = sorted({folder, *(p for p in folder.rglob("*") if p.is_dir())})
    return [f for sub in folders for f in sorted_files(sub, suffixes)]


def describe(path: Path | str, sensor: SensorSize) -> dict[str, Any]:
    """What ``path`` holds: ``{"path", "kind", "digest", "recordings", "events", "sensor"}``; ``DatasetError`` in one
    line when it holds nothing to learn from or a recording of another sensor than ``sensor``.

    A corpus's digest is its manifest's SHA-256 (the recordings and where their events are); a folder's, the
    SHA-256 of its files' relative paths, sizes and event counts (every file is read once, to count and check)."""
    path = Path(path).resolve()
    if kind_of(path) == CORPUS:
        try:
            corpus = Corpus(path)
        except CorpusError as e:
            raise DatasetError(str(e)) from None
        if not corpus.recordings:
            raise DatasetError(f"{path}: the corpus holds no recordings")
        for r in corpus.recordings:
            if r.sensor != sensor:
                raise _other_sensor(f"{path}: recording {r.name!r}", r.sensor, sensor)
        digest = hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()
        return _description(path, CORPUS, digest, len(corpus.recordings), corpus.total_events, sensor)
    files = event_files(path)
    if not files:
        raise DatasetError(f"{path}: no event files ({', '.join(sorted(extensions()))}) in the folder")
    h = hashlib.sha256()
    events = 0
    for f in files:
        try:
            decoded, found = read_events(f)
        except EventFileError as e:
            raise DatasetError(
                f"{e} (leave it out, or `mem ingest` the folder: it lists bad files and goes on)"
            ) from None
        if tuple(found) != tuple(sensor):
            raise _other_sensor(str(f), SensorSize(*found), sensor)
        events += len(decoded)
        h.update(f"{f.relative_to(path).as_posix()}\t{f.stat().st_size}\t{len(decoded)}\n".encode())
    return _description(path, FOLDER, h.hexdigest(), len(files), events, sensor)


def _description(path: Path, kind: str, digest: str, recordings: int, events: int, sensor: SensorSize) -> dict:
    return {
        "path": str(path),
        "kind": kind,
        "digest": digest,
        "recordings": recordings,
        "events": int(events),
        "sensor": [sensor.height, sensor.width],
    }


def _other_sensor(what: str, found: SensorSize, wanted: SensorSize) -> DatasetError:
    return DatasetError(
        f"{what} is {found.width} x {found.height}, the labelled data's sensor is {wanted.width} x {wanted.height}: "
        "pretrain on recordings of the camera the model will serve"
    )


def open_unlabeled(path: Path | str, sensor: SensorSize, window: int) -> EventSource:
    """The recordings of ``path`` as unlabeled samples on ``sensor``: a corpus's recordings in model windows of
    ``window`` events (``datasets.corpus``, every slot: the validation comes from the labelled data), a folder's
    files one sample each."""
    from mem_core.datasets.corpus import CorpusSource

    path = Path(path)
    if kind_of(path) == CORPUS:
        source = CorpusSource(path, "all", window=window)
        source.labels = np.full(len(source), -1, dtype=np.int64)
        return source
    files = event_files(path)
    return FileSource(FOLDER, files, [-1] * len(files), [], sensor)


class JoinedSource(EventSource):
    """Several sources on one sensor as one, every label -1: what the stages that learn without labels read."""

    def __init__(self, sources: list[EventSource]) -> None:
        sensors = {tuple(s.sensor) for s in sources}
        if len(sensors) != 1:
            raise DatasetError(f"joined sources must share a sensor, got {sorted(sensors)}")
        self.sources = sources
        self.name = "+".join(s.name for s in sources)
        self.sensor = sources[0].sensor
        self.classes: list[str] = []
        self._starts = np.cumsum([0, *(len(s) for s in sources)])
        self.labels = np.full(int(self._starts[-1]), -1, dtype=np.int64)

    def parts(self) -> list[tuple[EventSource, int]]:
        """Each joined source with the index its first sample has here."""
        return [(source, int(start)) for source, start in zip(self.sources, self._starts, strict=False)]

    def _locate(self, index: int) -> tuple[EventSource, int]:
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.sources[k], index - int(self._starts[k])

    def load(self, index: int) -> np.ndarray:
        source, i = self._locate(index)
        return source.load(i)

    def load_window(self, index: int, n: int, rng: np.random.Generator | None) -> np.ndarray:
        source, i = self._locate(index)
        return source.load_window(i, n, rng)
