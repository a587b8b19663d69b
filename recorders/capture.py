"""Labelled captures: single event windows, each with a class, stored as a labelled corpus (the label-a-few loop).

Each capture is one recording of the corpus (the exact events of the window, on the source's sensor, with its class
as the recording's label), committed to disk before ``capture`` returns, so a crash loses nothing already captured.
``undo`` takes the last capture back out. The result is what ``mem finetune --dataset corpus --data DIR`` trains on.
"""

from __future__ import annotations

import collections
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from mem_core.corpus import Corpus, CorpusWriter
from mem_core.events import SensorSize
from mem_core.limits import MAX_CLASSES
from mem_core.schema import class_names_problem
from recorders.base import Closing, RecorderError


class LabelledCaptures(Closing):
    """A labelled corpus at ``root`` (created, or continued), written one capture at a time."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        existing = Corpus(self.root) if (self.root / "manifest.json").exists() else None
        self._counts = collections.Counter(existing.label_counts() if existing is not None else {})
        if self._counts and (problem := class_names_problem(list(self._counts))) is not None:
            raise RecorderError(f"{self.root}: the labelled corpus's {problem}")
        self._taken: list[tuple[str, str]] = []  # (name, label) captured in this session, for undo
        self._next = len(existing) if existing is not None else 0
        self._writer = CorpusWriter(self.root, provenance={"tool": "mem label"}, flush_interval_s=0)

    def capture(
        self, events: np.ndarray, sensor: SensorSize, label: str, metadata: dict[str, Any] | None = None
    ) -> str:
        """Store one window as a recording labelled ``label``; returns its name. Durable when this returns."""
        if not isinstance(label, str) or not label.strip():
            raise RecorderError(f"a capture needs a class name, got {label!r}")
        if (problem := class_names_problem([label])) is not None:
            raise RecorderError(f"label {label[:60]!r}: {problem.removeprefix('classes.0: ')}")
        if self._counts[label] == 0 and sum(n > 0 for n in self._counts.values()) >= MAX_CLASSES:
            raise RecorderError(f"label {label!r}: the corpus already holds the {MAX_CLASSES} classes a model may have")
        if events.size == 0:
            raise RecorderError("the window holds no events: nothing to capture")
        name = f"capture-{self._next:06d}"
        when = datetime.now(UTC).isoformat(timespec="milliseconds")
        self._writer.add_recording(
            name, events, sensor, label=label, metadata={"captured_utc": when, **(metadata or {})}
        )
        self._writer.flush()
        self._next += 1
        self._taken.append((name, label))
        self._counts[label] += 1
        return name

    def undo(self) -> str | None:
        """Take the last capture of this session back out; returns its label, or None when there is none."""
        if not self._taken:
            return None
        name, label = self._taken.pop()
        self._writer.remove_recording(name)
        self._counts[label] -= 1
        return label

    def counts(self) -> dict[str, int]:
        """Captures per class in the corpus (earlier sessions included)."""
        return {label: n for label, n in sorted(self._counts.items()) if n > 0}

    def close(self) -> None:
        self._writer.close()
