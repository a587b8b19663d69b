"""Recording the live source into a corpus while serving (``record_start`` / ``record_stop`` control commands)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mem_core.events import SensorSize
from mem_core.limits import MAX_TEXT, MIN_FREE_BYTES, fit_path

if TYPE_CHECKING:
    from mem_core.corpus import CorpusWriter


class LiveRecorder:
    """Appends the served batches to the corpus at ``root`` between ``start(name)`` and ``stop()``.

    ``start`` and ``stop`` come from the control thread, ``append`` from the reader thread. The corpus is
    opened with the first batch after ``start`` (that is when the sensor is known) and closed by ``stop``, so
    it can be read (or recorded into by ``mem record``) as soon as the recording ends. A write error (a full
    disk) ends the recording and shows in ``state()["error"]``; serving goes on.
    """

    def __init__(self, root: Path | str, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self.min_free_bytes = min_free_bytes
        self.root = Path(root)
        self._lock = threading.Lock()
        self._pending: str | None = None  # name of a recording waiting for its first batch
        self._writer: CorpusWriter | None = None
        self._name: str | None = None
        self._events = 0
        self._error: str | None = None

    def start(self, name: str) -> None:
        """Begin recording as ``name`` (unique in the corpus); a ``ValueError`` if a recording is running."""
        with self._lock:
            if self._pending is not None or self._writer is not None:
                raise ValueError(f"already recording {self._name or self._pending!r} into {self.root}")
            self._pending, self._name, self._events, self._error = name, name, 0, None

    def append(self, events: np.ndarray, sensor: SensorSize, metadata: dict[str, Any]) -> None:
        """Store a batch if a recording is running."""
        with self._lock:
            if self._pending is None and self._writer is None:
                return
            from mem_core.corpus import CorpusError, CorpusWriter  # (h5py, numba: at the first recording)

            try:
                if self._writer is None:
                    writer = CorpusWriter(
                        self.root, provenance={"tool": "mem serve"}, min_free_bytes=self.min_free_bytes
                    )
                    try:
                        writer.begin_recording(self._pending, sensor, metadata=metadata)
                    except BaseException:
                        writer.close()
                        raise
                    self._writer, self._pending = writer, None
                self._writer.append(events)
                self._events += len(events)
            except (CorpusError, ValueError, OSError) as exc:
                self._error = str(exc)
                self._pending = None
                self._close()

    def stop(self) -> None:
        """End the recording (a no-op when none is running)."""
        with self._lock:
            self._pending = None
            self._close()

    def _close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            from mem_core.corpus import CorpusError

            try:
                writer.close()
            except (CorpusError, OSError) as exc:
                self._error = str(exc)

    def state(self) -> dict[str, Any]:
        """``active``, ``root``, ``name``, ``events`` recorded and the last ``error`` (None if fine)."""
        with self._lock:
            active = self._pending is not None or self._writer is not None
            return {
                "active": active,
                "root": fit_path(self.root),
                "name": self._name,
                "events": self._events,
                "error": None if self._error is None else self._error[:MAX_TEXT],
            }
