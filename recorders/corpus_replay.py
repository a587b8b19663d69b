"""A corpus replayed as a live source: one recording (``CORPUS:RECORDING``) or all of them in order (``CORPUS``).

Events are read block by block (``Corpus.window``), never a whole recording at once. Recordings follow each other on
one timeline (``recorders.replay.Replay``): each begins 1 us after the previous one ends (the segments of a session
keep their own times), a seek addresses the whole sequence, and a loop starts over at the first. The source's
``sensor`` and ``metadata`` follow the recording being replayed (``serial`` is ``corpus/recording``), so a server's
source state names it; recordings on different sensors are each replayed on their own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from mem_core.corpus import Corpus
from mem_core.corpus.format import MANIFEST, CorpusError, RecordingInfo
from mem_core.events import SensorSize
from mem_core.limits import fit_path
from recorders.base import RecorderError
from recorders.replay import Replay, Segment

BLOCK_EVENTS = 1 << 16  # events read at a time (~1 MB); a batch never reaches past the block it starts in
LISTED = 12  # recording names an error lists


def corpus_spec(spec: str) -> tuple[Path, str | None] | None:
    """``(corpus directory, RECORDING or None)`` when ``spec`` is ``CORPUS`` or ``CORPUS:RECORDING`` (the leftmost
    ``:`` after which a corpus directory ends); None when it names no corpus."""
    if os.path.isfile(os.path.join(spec, MANIFEST)):  # never raises (a path too long is no corpus)
        return Path(spec), None
    for i, char in enumerate(spec):
        if char == ":" and i and os.path.isfile(os.path.join(spec[:i], MANIFEST)):
            return Path(spec[:i]), spec[i + 1 :] or None
    return None


class CorpusReplaySource(Replay):
    """The recordings of the corpus at ``root`` replayed at ``speed`` times real time (0 = as fast as possible),
    optionally looping.

    ``recording`` names a recording, a session (all its segments, in order) or an index; None replays every
    recording in the corpus's order. Recordings without events are left out.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        recording: str | None = None,
        *,
        speed: float = 1.0,
        loop: bool = False,
        batch_us: int = 10_000,
    ) -> None:
        self.root = Path(root)
        try:
            self.corpus = Corpus(self.root)
        except CorpusError as e:
            raise RecorderError(str(e)) from e
        self.name = self.root.resolve().name
        self._indices = self._select(recording)
        self.chosen = [self.corpus.recordings[i] for i in self._indices]
        self._cache: tuple[int, int, np.ndarray, np.ndarray] | None = None  # (segment, first index, events, times)
        self._iterating = self._closed = False
        self.metadata = {"kind": "corpus", "model": "replay", "path": str(self.root.resolve())}
        segments = [
            Segment(r.sensor, r.n_events, r.t_min, r.t_max, continues=k > 0 and _continues(self.chosen[k - 1], r))
            for k, r in enumerate(self.chosen)
        ]
        super().__init__(segments, str(self.root), speed=speed, loop=loop, batch_us=batch_us)

    @property
    def sensors(self) -> set[SensorSize]:
        """The sensor sizes of the replayed recordings."""
        return {r.sensor for r in self.chosen}

    def __iter__(self) -> Iterator[np.ndarray]:
        self._iterating = True
        try:
            for batch in super().__iter__():
                if self._closed:
                    return
                yield batch
        finally:  # the HDF5 handles are closed by the thread that read through them
            self._iterating = False
            self.corpus.close()

    def close(self) -> None:
        """End the replay: an iterating thread stops at its next batch and closes the corpus itself."""
        self._closed = True
        if not self._iterating:
            self.corpus.close()

    def _select(self, recording: str | None) -> list[int]:
        """Indices of the recordings ``recording`` names (see the class), those without events left out."""
        recordings = self.corpus.recordings
        if recording is None:
            chosen = range(len(recordings))
        else:
            chosen = [i for i, r in enumerate(recordings) if r.session == recording]
            chosen = sorted(chosen, key=lambda i: recordings[i].segment) or [
                i for i, r in enumerate(recordings) if r.name == recording
            ]
            index = recording.isascii() and recording.isdigit() and len(recording) <= 18  # int() stops at 4300 digits
            if not chosen and index and int(recording) < len(recordings):
                chosen = [int(recording)]
            if not chosen:
                raise RecorderError(
                    f"{self.root}: no recording {recording!r} (a name or an index 0..{len(recordings) - 1}); "
                    f"it has {_listed(recordings)}"
                )
        chosen = [i for i in chosen if recordings[i].n_events > 0]
        if not chosen:
            what = "its recordings hold" if recording is None else f"recording {recording!r} holds"
            raise RecorderError(f"{self.root}: {what} no events, nothing to replay")
        return chosen

    def _entered(self, k: int) -> None:
        info = self.chosen[k]
        self.metadata = {  # a new dict: other threads read it whole
            **self.metadata,
            "serial": fit_path(f"{self.name}/{info.name}"),  # a text field of the live state
            "recording": info.name,
            "height": info.sensor.height,
            "width": info.sensor.width,
        }

    def _read(self, k: int, lo: int, hi: int) -> np.ndarray:
        try:
            return self.corpus.window(self._indices[k], lo, hi - lo)
        except CorpusError as e:  # a damaged shard ends the replay with one line naming it
            raise RecorderError(str(e)) from e

    def _block(self, k: int, lo: int) -> tuple[int, np.ndarray, np.ndarray]:
        cache = self._cache
        if cache is None or cache[0] != k or not cache[1] <= lo < cache[1] + cache[2].size:
            events = self._read(k, lo, lo + BLOCK_EVENTS)
            cache = self._cache = (k, lo, events, np.ascontiguousarray(events["t"]))
        return cache[1:]

    def _index(self, k: int, t: int) -> int:
        try:
            return self.corpus.first_at(self._indices[k], t)
        except CorpusError as e:
            raise RecorderError(str(e)) from e


def _continues(previous: RecordingInfo, info: RecordingInfo) -> bool:
    """``info`` is the segment of a recorded session that came right after ``previous``."""
    return bool(info.session) and info.session == previous.session and info.segment > previous.segment


def _listed(recordings: list[RecordingInfo]) -> str:
    """``recordings a, b, c`` (sessions once; the first ``LISTED``, then how many in all)."""
    names = list(dict.fromkeys(r.session or r.name for r in recordings))
    more = f", ... ({len(names)} in all)" if len(names) > LISTED else ""
    return f"recordings {', '.join(names[:LISTED])}{more}" if names else "no recordings"
