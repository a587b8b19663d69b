"""A MEM corpus (recordings from ``mem record`` / ``mem ingest``) as samples: slots of long recordings, or whole
short labelled recordings."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np

from mem_core.corpus import MANIFEST, Corpus, CorpusError
from mem_core.datasets.base import DatasetError, EventSource, require_dir
from mem_core.events import SensorSize, window_start

log = logging.getLogger(__name__)

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

    Every shard is opened first (``verify``: every event read and checked too), so a damaged shard stops a run
    at once with a ``CorpusError`` naming it, instead of failing a worker mid-epoch; with ``skip_bad`` its
    recordings are left out with a logged warning, and ``skipped`` says which shards and why.
    """

    def __init__(
        self,
        root: Path,
        split: str,
        slot: int = CORPUS_SLOT,
        window: int | None = None,
        *,
        verify: bool = False,
        skip_bad: bool = False,
    ):
        if slot < 1 or (window is not None and window < 1):
            raise DatasetError(f"corpus slot and window must be >= 1 events, got slot={slot}, window={window}")
        self.name = "corpus"
        self.corpus = Corpus(root)
        recordings = self.corpus.recordings
        if not recordings:
            raise DatasetError(f"{root}: the corpus holds no recordings")
        self.skipped = _damaged_shards(self.corpus, verify, skip_bad)
        usable = [i for i, r in enumerate(recordings) if r.shard not in self.skipped]
        if not usable:
            raise DatasetError(f"{root}: every shard of the corpus is damaged ({len(self.skipped)} skipped)")
        sensors = {r.sensor for r in recordings}
        self.sensor = SensorSize(max(s.height for s in sensors), max(s.width for s in sensors))
        names = sorted({str(r.label) for r in recordings if r.label is not None})
        self.classes = names
        slots = []  # (recording, first event, events in slot)
        for i in usable:
            r = recordings[i]
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


def _damaged_shards(corpus: Corpus, verify: bool, skip_bad: bool) -> dict[str, str]:
    """Damaged shards -> why; raises ``CorpusError`` naming the first unless ``skip_bad`` (then logs a warning)."""
    root = corpus.root
    stamp = tuple(_stamp(root / name) for name in (MANIFEST, *corpus.shards))
    damaged = dict(_check(str(root.resolve()), verify, stamp))
    if damaged and not skip_bad:
        problem = next(iter(damaged.values()))
        more = f" ({len(damaged) - 1} more damaged shards)" if len(damaged) > 1 else ""
        raise CorpusError(
            f"{problem}{more}; leave the damaged shards out with --skip-bad, or list them with "
            f"'mem inspect --verify {root}'"
        )
    if damaged:
        log.warning(
            "%s: left out the recordings of %d damaged shard(s): %s", root, len(damaged), "; ".join(damaged.values())
        )
    return damaged


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _check(root: str, full: bool, stamp: tuple[tuple[int, int], ...]) -> dict[str, str]:
    """``Corpus.check``, once per state of the files: the train and validation splits open the same corpus."""
    with Corpus(root) as corpus:
        return corpus.check(full=full)


def corpus(root, split: str, window: int | None = None, verify: bool = False, skip_bad: bool = False) -> EventSource:
    if root is None:
        raise DatasetError("the corpus dataset needs --data CORPUS_DIR")
    path = require_dir(Path(root), "corpus directory")
    return CorpusSource(path, split, window=window, verify=verify, skip_bad=skip_bad)
