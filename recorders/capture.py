"""Labelled captures: single event windows, each with a class, stored as a labelled corpus (the label-a-few loop).

Each capture is one recording of the corpus (the exact events of the window, on the source's sensor, with its class
as the recording's label), committed to disk before ``capture`` returns, so a crash loses nothing already captured.
``undo`` takes the last capture back out. The result is what ``mem finetune --dataset corpus --data DIR`` trains on.

A capture the disk does not take (the folder moved or deleted under the server, an I/O error, a full disk) is not
stored, and says so; what was committed before stays. The corpus is opened again at the next capture, from what is on
disk, so capturing goes on once the folder is back and writable. ``snapshot`` hands a Train run the captures as they
are at that moment, in a corpus of its own.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from mem_core.corpus import MANIFEST, Corpus, CorpusError, CorpusWriter, snapshot_corpus
from mem_core.events import SensorSize
from mem_core.limits import MAX_CLASSES, MIN_FREE_BYTES
from mem_core.schema import SchemaError, class_name, class_names_problem, short
from recorders.base import Closing, RecorderError

_CAPTURE_NAME = re.compile(r"capture-(\d+)")


def _identity(folder: Path) -> tuple[int, int] | None:
    """Which folder is at ``folder`` now (device, inode), or None where there is none."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class LabelledCaptures(Closing):
    """A labelled corpus at ``root`` (created, or continued), written one capture at a time."""

    def __init__(self, root: str | Path, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self.root = Path(root)
        self.min_free_bytes = min_free_bytes  # a capture is refused before the disk has less than this free
        self._taken: list[tuple[str, str]] = []  # (name, label) captured in this session, for undo
        self._writer: CorpusWriter | None = None  # None: opened again at the next capture or undo
        self._open()

    def _open(self) -> CorpusWriter:
        """Open the corpus for writing: counts, names and what this session may undo, from what is on disk."""
        existing = Corpus(self.root) if (self.root / MANIFEST).exists() else None
        recordings = existing.recordings if existing is not None else []
        counts = collections.Counter(existing.label_counts() if existing is not None else {})
        if counts and (problem := class_names_problem(list(counts))) is not None:
            raise RecorderError(f"{self.root}: the labelled corpus's {problem}")
        # numbered after the highest number in use, not the count: an undo leaves a gap the count would fall into
        numbers = [int(m.group(1)) for r in recordings if (m := _CAPTURE_NAME.fullmatch(r.session))]
        self._writer = CorpusWriter(
            self.root, provenance={"tool": "mem label"}, flush_interval_s=0, min_free_bytes=self.min_free_bytes
        )
        self._identity = _identity(self.root)
        self._counts = counts
        self._next = max(numbers, default=-1) + 1
        kept = {r.session for r in recordings}
        self._taken = [(name, label) for name, label in self._taken if name in kept]
        return self._writer

    def _writable(self, what: str) -> CorpusWriter:
        """The writer, opened again after a failure: only where the folder is back (or made anew, empty), never by
        creating a missing folder, which would start a second corpus where the user may put the first one back."""
        if self._writer is not None and _identity(self.root) == self._identity:
            return self._writer
        if self._writer is not None:  # deleted or moved away, perhaps another folder made in its place: let it go
            writer, self._writer = self._writer, None
            with contextlib.suppress(CorpusError, OSError):  # its files went with the folder
                writer.close()
        if not (self.root / MANIFEST).is_file() and not (self.root.is_dir() and not any(self.root.iterdir())):
            raise self._gone(what)
        try:
            return self._open()
        except (CorpusError, OSError) as exc:
            raise RecorderError(f"{what}: {exc}; it goes on once {self.root} is writable again") from None

    def _gone(self, what: str) -> RecorderError:
        return RecorderError(
            f"{what}: the labels folder {self.root} is gone (moved or deleted?); put it back to go on "
            "capturing (the captures in it are kept), or make an empty folder there to start a new labelled corpus"
        )

    def _stopped(self, exc: CorpusError, what: str) -> RecorderError:
        """Let go of a writer that stopped on a failed write (its lock too), and say what was lost and what to do."""
        writer, self._writer = self._writer, None
        with contextlib.suppress(CorpusError, OSError):  # a stopped writer's close only lets go of its files
            writer.close()
        if not self.root.is_dir():
            return self._gone(what)
        return RecorderError(f"{what}: {exc}; it goes on once {self.root} is writable again")

    def capture(
        self, events: np.ndarray, sensor: SensorSize, label: str, metadata: dict[str, Any] | None = None
    ) -> str:
        """Store one window as a recording labelled ``label``; returns its name. Durable when this returns."""
        if not isinstance(label, str) or not label.strip():
            raise RecorderError(f"a capture needs a class name, got {short(label)}")
        try:
            label = class_name(label)  # one spelling per name: "é" as one character or as "e" + accent is one class
        except SchemaError as exc:
            raise RecorderError(f"label {label[:60]!r}: {exc.reason}") from None
        if self._counts[label] == 0 and sum(n > 0 for n in self._counts.values()) >= MAX_CLASSES:
            raise RecorderError(f"label {label!r}: the corpus already holds the {MAX_CLASSES} classes a model may have")
        if events.size == 0:
            raise RecorderError("the window holds no events: nothing to capture")
        writer = self._writable(f"{label!r} not stored")
        name = f"capture-{self._next:06d}"
        when = datetime.now(UTC).isoformat(timespec="milliseconds")
        try:
            writer.add_recording(name, events, sensor, label=label, metadata={"captured_utc": when, **(metadata or {})})
            writer.flush()
        except CorpusError as exc:  # the writer stopped: its uncommitted capture is gone, the committed ones stay
            raise self._stopped(exc, f"{label!r} not stored") from None
        self._next += 1
        self._taken.append((name, label))
        self._counts[label] += 1
        return name

    def undo(self) -> str | None:
        """Take the last capture of this session back out; returns its label, or None when there is none."""
        if not self._taken:
            return None
        writer = self._writable("not taken back")
        if not self._taken:  # (opened again: the captures of this session that were lost are not there to undo)
            return None
        name, label = self._taken[-1]
        try:
            writer.remove_recording(name)
        except CorpusError as exc:
            raise self._stopped(exc, "not taken back") from None
        self._taken.pop()
        self._counts[label] -= 1
        return label

    def counts(self) -> dict[str, int]:
        """Captures per class in the corpus (earlier sessions included)."""
        return {label: n for label, n in sorted(self._counts.items()) if n > 0}

    def snapshot(self, dest: str | Path) -> Corpus:
        """The captures as they are now, as a corpus at ``dest`` of its own (sharing the shard files), which later
        captures and undos leave alone: what a Train run learns from. The writer is closed for it (every shard
        sealed) and opened again at the next capture."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                writer.close()
            except (CorpusError, OSError) as exc:
                raise RecorderError(f"{self.root}: cannot take the captures as they are now ({exc})") from None
        try:
            return snapshot_corpus(self.root, dest, provenance={"tool": "mem serve train"})
        except (CorpusError, OSError) as exc:
            raise RecorderError(f"{self.root}: cannot take the captures as they are now ({exc})") from None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
