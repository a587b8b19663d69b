"""A MEM corpus (recordings from ``mem record`` / ``mem ingest``) as samples: slots of long recordings, or whole
short labelled recordings.

The validation split holds out whole blocks, never samples drawn here and there: neighbouring windows of one
recording are nearly the same data, so a validation slot whose neighbours are in training reads far better than
unseen recordings do (N-Cars: 7-13 points, docs/RESULTS.md). The blocks are those of ``datasets.splits``: several,
spread over the data, each with a guard on both sides that neither split uses. The unit is the session: one recording
stream (the segments of a ``mem record`` / live recording share a ``session``; each file of ``mem ingest`` is a
session of its own). In corpus order:

- labelled sessions (e.g. captures with a class each, an ingested labelled dataset): per class, ``VAL_CLASS_FRACTION``
  of its sessions (at least one) in blocks; a class with fewer than 2 sessions is a ``DatasetError``;
- unlabelled sessions: with at least ``MIN_SESSIONS`` of them, ``VAL_FRACTION`` of the sessions (at least one) in
  blocks; with fewer, ``VAL_FRACTION`` of each session's slots (at least one slot of a session with two or more) in
  blocks inside it, and if every session is a single slot, the last session;
- labelled and unlabelled sessions of one corpus are split apart, each group by its rule;
- a corpus of one slot cannot be split: train and val share it, with a logged warning.

Windows stay inside their split: a sample's window never reaches into a slot of the other split.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np

from mem_core.corpus import MANIFEST, Corpus, CorpusError, RecordingInfo
from mem_core.datasets.base import DatasetError, EventSource, require_dir
from mem_core.datasets.splits import TRAIN, VAL, held_out_blocks
from mem_core.events import SensorSize, window_start
from mem_core.fields import DEFAULT_WINDOW_EVENTS
from mem_core.schema import class_names_problem

log = logging.getLogger(__name__)

CORPUS_SLOT = DEFAULT_WINDOW_EVENTS  # events per sample slot of a long recording
VAL_CLASS_FRACTION = 0.1  # of each class's sessions (labelled corpora)
VAL_FRACTION = 0.05  # of the sessions, or of each session's slots (unlabelled corpora)
MIN_SESSIONS = 20  # unlabelled corpora with this many sessions hold out whole sessions


class CorpusSource(EventSource):
    """A MEM corpus as samples. Each recording is cut into slots of ``slot`` events (a short recording is one slot);
    ``split`` ``train`` / ``val`` takes the slots of that side of the split (module docstring), ``all`` everything.

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
        if split not in ("train", "val", "all"):
            raise DatasetError(f"corpus splits are train, val and all, not {split!r}")
        self.name = "corpus"
        self.corpus = Corpus(root)
        recordings = self.corpus.recordings
        if not recordings:
            raise DatasetError(f"{root}: the corpus holds no recordings")
        self.skipped = _damaged_shards(self.corpus, verify, skip_bad)
        sensors = {r.sensor for r in recordings}
        self.sensor = SensorSize(max(s.height for s in sensors), max(s.width for s in sensors))
        names = sorted({str(r.label) for r in recordings if r.label is not None})
        if names and (problem := class_names_problem(names)) is not None:
            raise DatasetError(f"{root}: the recordings' labels cannot be a model's {problem}")
        self.classes = names
        table = _slots(recordings, slot)  # (recording, first event, events in slot), in corpus order
        usable = np.asarray([recordings[i].shard not in self.skipped for i in table[:, 0]], dtype=bool)
        if not usable.any():
            raise DatasetError(f"{root}: every shard of the corpus is damaged ({len(self.skipped)} skipped)")
        if split == "all":
            roles = np.full(len(table), TRAIN, dtype=np.int8)
        elif usable.sum() == 1:
            log.warning("%s: the corpus is one %d-event slot: train and val share it", root, int(table[usable][0, 2]))
            roles = np.full(len(table), VAL if split == "val" else TRAIN, dtype=np.int8)
        else:  # decided on the whole manifest: leaving damaged shards out moves nothing between train and val
            roles = _roles(root, recordings, table)
        table, roles = table[usable], roles[usable]
        if split != "all":
            table = table[roles == (VAL if split == "val" else TRAIN)]
        # This split's windows read only the events of the run of its own slots around them, never a slot of the
        # other split or a guard slot.
        bounds = _runs(table)
        parts = np.maximum(1, table[:, 2] // window) if window else np.ones(len(table), dtype=np.int64)
        # one row per sample: (recording, first event, events in slot, part, parts)
        part = np.arange(parts.sum()) - np.repeat(np.cumsum(parts) - parts, parts)
        self.samples = np.column_stack([np.repeat(table, parts, axis=0), part, np.repeat(parts, parts)])
        self._bounds = np.repeat(bounds, parts, axis=0)
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
        if count >= n:
            return self.corpus.window(rec, lo + window_start(count, n, rng), n)
        # a window longer than its slot (or part) reaches into the neighbours, centred on it, within its split
        first, end = (int(v) for v in self._bounds[index])
        start = max(first, min(lo + count // 2 - n // 2, end - n))
        return self.corpus.window(rec, start, min(n, end - start))


def _slots(recordings: list[RecordingInfo], slot: int) -> np.ndarray:
    """(recording, first event, events) of every slot: ``n_events // slot`` per recording (the last one takes the
    remainder), one for a recording shorter than a slot."""
    slots = []
    for i, r in enumerate(recordings):
        n_slots = max(1, r.n_events // slot)
        for k in range(n_slots):
            lo = k * slot
            hi = r.n_events if k == n_slots - 1 else lo + slot
            slots.append((i, lo, hi - lo))
    return np.asarray(slots, dtype=np.int64).reshape(-1, 3)


def _roles(root: Path, recordings: list[RecordingInfo], table: np.ndarray) -> np.ndarray:
    """``TRAIN`` / ``VAL`` / ``GUARD`` of every slot of ``table`` (the rules of the module docstring)."""
    sessions: dict[str, list[int]] = {}  # session -> its slots (rows of table), in corpus order
    for row, rec in enumerate(table[:, 0]):
        r = recordings[rec]
        sessions.setdefault(r.session or r.name, []).append(row)
    by_label: dict[str | None, list[list[int]]] = {}
    for rows in sessions.values():
        label = recordings[table[rows[0], 0]].label
        by_label.setdefault(None if label is None else str(label), []).append(rows)
    roles = np.full(len(table), TRAIN, dtype=np.int8)
    for label, group in by_label.items():
        if label is None:
            _unlabelled_roles(group, roles)
        elif len(group) < 2:
            raise DatasetError(
                f"{root}: a labelled corpus needs at least 2 labelled samples per class, one to train and one to "
                f"validate; class {label!r} has {len(group)}"
            )
        else:
            _session_roles(group, VAL_CLASS_FRACTION, roles)
    return roles


def _session_roles(sessions: list[list[int]], fraction: float, roles: np.ndarray) -> None:
    """Give whole ``sessions`` (each a list of slots) the roles of ``held_out_blocks`` over them."""
    for rows, role in zip(sessions, held_out_blocks(len(sessions), fraction), strict=True):
        roles[rows] = role


def _unlabelled_roles(sessions: list[list[int]], roles: np.ndarray) -> None:
    """Roles of the slots of unlabelled ``sessions`` (each a list of slots in order)."""
    if len(sessions) >= MIN_SESSIONS:
        _session_roles(sessions, VAL_FRACTION, roles)
    elif all(len(s) == 1 for s in sessions):  # single-slot sessions only: hold out the last session
        if len(sessions) >= 2:
            roles[sessions[-1]] = VAL
    else:
        for rows in sessions:
            roles[rows] = held_out_blocks(len(rows), VAL_FRACTION)


def _runs(table: np.ndarray) -> np.ndarray:
    """(first, end) event of the run of adjacent slots of one recording that each slot of ``table`` belongs to."""
    bounds = np.empty((len(table), 2), dtype=np.int64)
    start = 0
    for row in range(1, len(table) + 1):
        rec, lo, count = table[row - 1]
        if row == len(table) or table[row, 0] != rec or table[row, 1] != lo + count:
            bounds[start:row] = (table[start, 1], lo + count)
            start = row
    return bounds


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
