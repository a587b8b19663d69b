"""``CorpusWriter``: appends recordings to a corpus, crash-safe (see ``mem_core.corpus.format`` for what survives).

The writer holds the recordings and the shard being written; ``folder`` makes the corpus folder and its writer lock,
``journal`` commits the manifest, ``space`` keeps the disk room and the ballast.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numba
import numpy as np

from mem_core.corpus.folder import prepare_corpus_dir, take_writer_lock
from mem_core.corpus.format import CHUNK_EVENTS, COLUMNS, FORMAT_VERSION, CorpusError, fsync_path
from mem_core.corpus.journal import ManifestJournal
from mem_core.corpus.space import DiskSpace
from mem_core.events import EVENT_DTYPE, SensorSize, time_problem, validate_events
from mem_core.io.hdf5 import hdf5_filters
from mem_core.limits import MIN_FREE_BYTES

_BUFFER_EVENTS = 1 << 20  # events held in memory before a shard write (64 chunks)


@numba.njit(cache=True, nogil=True)
def _events_ok(events: np.ndarray, t_last: int, width: int, height: int) -> bool:
    """One pass over the events: sorted from ``t_last`` on, on the sensor, polarity 0/1."""
    prev = t_last
    for i in range(events.shape[0]):
        e = events[i]
        if e.t < prev or e.x >= width or e.y >= height or e.p > 1:
            return False
        prev = e.t
    return True


def _check_events(events: np.ndarray, sensor: SensorSize, t_last: int | None) -> None:
    """``validate_events`` plus "not before ``t_last``", with a compiled fast path for valid input."""
    valid = isinstance(events, np.ndarray) and events.dtype == EVENT_DTYPE and events.ndim == 1
    t_floor = np.iinfo(np.int64).min if t_last is None else t_last
    plausible = valid and (events.size == 0 or time_problem(int(events["t"][0]), int(events["t"][-1])) is None)
    if plausible and _events_ok(events, t_floor, sensor.width, sensor.height):
        return
    validate_events(events, sensor)  # raises with the first problem named
    raise ValueError(f"events go back in time: first t={int(events['t'][0])} is before the last appended t={t_last}")


class CorpusWriter:
    """Append recordings to a corpus directory (created if needed, or re-opened to add more).

    ``begin_recording`` / ``append`` / ``end_recording`` stream a live recording; ``add_recording`` stores a
    whole sample at once. Committed at least every ``flush_interval_s`` (checked inside ``append``), on
    ``flush()`` and on ``close()``; see the module docstring for what survives a crash.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        provenance: dict[str, Any] | None = None,
        flush_interval_s: float = 1.0,
        shard_max_events: int = 1 << 26,
        min_free_bytes: int = MIN_FREE_BYTES,
    ) -> None:
        if shard_max_events < 1 or flush_interval_s < 0 or min_free_bytes < 0:
            raise ValueError(
                f"need shard_max_events >= 1, flush_interval_s >= 0, min_free_bytes >= 0; got "
                f"{shard_max_events}, {flush_interval_s}, {min_free_bytes}"
            )
        self.root = Path(root)
        self.flush_interval_s = flush_interval_s
        self.shard_max_events = shard_max_events
        prepare_corpus_dir(self.root)
        self._lock_fd = take_writer_lock(self.root)
        self._space = DiskSpace(self.root, min_free_bytes)
        self._file: h5py.File | None = None  # the shard being written, opened on first use
        # Its datasets stay open with it: a Dataset object dropped mid-write closes (and flushes) itself inside a
        # destructor, where h5py swallows a write error and leaves HDF5 in a state that segfaults later.
        self._datasets: dict[str, h5py.Dataset] = {}
        self._shard_entry: dict[str, Any] | None = None
        self._written = 0  # events of the current shard already in the HDF5 file
        self._buffer = {c: np.empty(_BUFFER_EVENTS, dtype=EVENT_DTYPE[c]) for c in COLUMNS}
        self._buffered = 0
        self._recording: dict[str, Any] | None = None  # manifest entry of the segment being recorded
        self._failed: str | None = None  # why the writer stopped (a message: the exception's frames hold HDF5 objects)
        self._closed = False
        try:
            self._journal = ManifestJournal(self.root, provenance, self._fail)
            self._space.take_ballast()
            self._journal.fold()  # the journal a killed writer left becomes part of the manifest
        except BaseException:
            self._space.release_ballast()
            os.close(self._lock_fd)
            raise
        recordings = self._manifest["recordings"]
        self._names = {e["name"] for e in recordings} | {e["session"] for e in recordings}
        self._last_commit = time.monotonic()

    @property
    def min_free_bytes(self) -> int:
        return self._space.min_free_bytes

    @property
    def last_time(self) -> int | None:
        """The newest event time of the open recording (None when none is open or it has no events yet)."""
        return None if self._recording is None else self._recording["t_max"]

    @property
    def _manifest(self) -> dict[str, Any]:
        return self._journal.manifest

    # ---- recordings ----------------------------------------------------------------------------------------

    def begin_recording(
        self,
        name: str,
        sensor: SensorSize,
        *,
        label: int | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Start a recording; ``append`` its events, then ``end_recording``. Names are unique in the corpus."""
        self._check_usable()
        if self._recording is not None:
            raise CorpusError(f"{self.root}: recording {self._recording['session']!r} is still open; end it first")
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"recording name must be a non-empty string without '/', got {name!r}")
        if name in self._names:
            raise ValueError(f"{self.root}: a recording named {name!r} already exists")
        sensor = SensorSize(int(sensor[0]), int(sensor[1]))
        if sensor.height <= 0 or sensor.width <= 0:
            raise ValueError(f"sensor size must be positive, got {sensor}")
        if label is not None and (isinstance(label, bool) or not isinstance(label, int | str)):
            raise ValueError(f"label must be an int, a str or None, got {label!r}")
        metadata = dict(metadata or {})
        try:
            json.dumps(metadata)
        except (TypeError, ValueError) as e:
            raise ValueError(f"metadata of recording {name!r} must be JSON-serialisable: {e}") from e
        self._start_segment(
            {"session": name, "segment": 0, "sensor": list(sensor), "label": label, "metadata": metadata}
        )

    def append(self, events: np.ndarray) -> None:
        """Append time-sorted ``EVENT_DTYPE`` events to the open recording (vectorised; commits when due)."""
        rec = self._require_recording()
        _check_events(events, SensorSize(*rec["sensor"]), rec["t_max"])
        self._write_events(events)
        self._commit_if_due()

    def _write_events(self, events: np.ndarray) -> None:
        """Copy checked events into the buffer, writing it out when full and cutting segments at full shards."""
        done = 0
        while done < events.size:
            if self._shard_events() >= self.shard_max_events:
                self._next_segment()
            room = min(self.shard_max_events - self._shard_events(), _BUFFER_EVENTS - self._buffered)
            part = events[done : done + room]
            if self._buffered and not self._fits(self._buffered + part.size):
                self._commit()  # keep what the disk takes before buffering what it may not (a small disk)
            for c in COLUMNS:
                self._buffer[c][self._buffered : self._buffered + part.size] = part[c]
            self._buffered += part.size
            rec = self._recording
            if rec["t_min"] is None:
                rec["t_min"] = int(part["t"][0])
            rec["t_max"] = int(part["t"][-1])
            rec["n_events"] += part.size
            done += part.size
            if self._buffered == _BUFFER_EVENTS:
                self._write_buffer()

    def end_recording(self) -> None:
        """Mark the open recording complete (committed with the next flush)."""
        rec = self._require_recording()
        rec["complete"] = True
        self._journal.recording_changed(rec)
        self._recording = None

    def add_recording(
        self,
        name: str,
        events: np.ndarray,
        sensor: SensorSize,
        *,
        label: int | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Store a whole recording at once (ingest); it shares a shard with others unless it does not fit."""
        _check_events(events, SensorSize(int(sensor[0]), int(sensor[1])), None)
        self._check_usable()
        if self._file is not None and self._shard_events() + events.size > self.shard_max_events >= events.size:
            self._commit(seal=True)
        self.begin_recording(name, sensor, label=label, metadata=metadata)
        self._write_events(events)
        self.end_recording()
        self._commit_if_due()

    def remove_recording(self, name: str) -> None:
        """Take the finished recording ``name`` (all its segments) out of the corpus and commit at once (undo of a
        capture). Its events stay in their shard, unreferenced; the name may be used again."""
        self._check_usable()
        if self._recording is not None and self._recording["session"] == name:
            raise CorpusError(f"{self.root}: recording {name!r} is still being recorded; end it first")
        recordings = self._manifest["recordings"]
        kept = [e for e in recordings if e["session"] != name]
        if len(kept) == len(recordings):
            raise CorpusError(f"{self.root}: no recording named {name!r}")
        self._manifest["recordings"] = kept
        for entry in recordings:
            if entry["session"] == name:
                self._names.discard(entry["name"])
                self._journal.recording_removed(entry["name"])
        self._names.discard(name)
        self._commit()

    def rotate(self) -> None:
        """Close the current shard; an open recording continues as a new segment in a new shard."""
        self._check_usable()
        if self._recording is not None:
            self._next_segment()
        elif self._file is not None:
            self._commit(seal=True)

    def flush(self) -> None:
        """Commit: write buffered events, flush and fsync the shard, then atomically rewrite the manifest."""
        self._check_usable()
        self._commit()

    def close(self) -> None:
        """Commit everything, end an open recording and seal the shard. Safe to call twice."""
        self._close(end_recording=True)

    def __enter__(self) -> CorpusWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On an exception the open recording stays incomplete, as it would after a crash.
        self._close(end_recording=exc_type is None)

    # ---- internals -----------------------------------------------------------------------------------------

    def _close(self, end_recording: bool) -> None:
        if self._closed:
            return
        try:
            if self._failed is None:
                if end_recording and self._recording is not None:
                    self.end_recording()
                self._recording = None
                self._commit(seal=True)
                self._journal.fold()  # a closed corpus is its manifest alone
        finally:
            self._closed = True
            self._journal.close()
            try:
                self._space.release_ballast()
            finally:
                os.close(self._lock_fd)  # always: a lock left held would refuse the next writer of this process

    def _check_usable(self) -> None:
        if self._closed:
            raise CorpusError(f"{self.root}: writer is closed")
        if self._failed is not None:
            raise CorpusError(f"{self.root}: writer stopped after an earlier error: {self._failed}")

    def _require_recording(self) -> dict[str, Any]:
        self._check_usable()
        if self._recording is None:
            raise CorpusError(f"{self.root}: no recording is open; call begin_recording() first")
        return self._recording

    def _shard_events(self) -> int:
        return self._written + self._buffered

    def _start_segment(self, session: dict[str, Any]) -> None:
        if self._file is not None and self._shard_events() >= self.shard_max_events:
            self._commit(seal=True)
        if self._file is None:
            self._open_shard()
        k = session["segment"]
        name = session["session"] if k == 0 else f"{session['session']}/{k}"
        self._recording = {
            "name": name,
            **session,
            "shard": self._shard_entry["file"],
            "offset": self._shard_events(),
            "n_events": 0,
            "t_min": None,
            "t_max": None,
            "complete": False,
        }
        self._names.add(name)
        self._manifest["recordings"].append(self._recording)
        self._journal.recording_changed(self._recording)

    def _next_segment(self) -> None:
        rec = self._recording
        rec["complete"] = True
        self._journal.recording_changed(rec)
        self._commit(seal=True)
        keys = ("session", "sensor", "label", "metadata")
        self._start_segment({**{k: rec[k] for k in keys}, "segment": rec["segment"] + 1})

    def _open_shard(self) -> None:
        name = f"shard-{self._journal.next_shard:05d}.h5"
        self._journal.next_shard += 1
        path = self.root / name
        self._check_space(0)
        blosc = hdf5_filters().Blosc
        try:
            f = h5py.File(path, "x", libver="latest")
            for c in COLUMNS:
                f.create_dataset(
                    c,
                    shape=(0,),
                    maxshape=(None,),
                    dtype=EVENT_DTYPE[c],
                    chunks=(CHUNK_EVENTS,),
                    fletcher32=True,  # a checksum per chunk: a damaged chunk fails to read instead of giving wrong events
                    **blosc(cname="lz4", clevel=5, shuffle=blosc.BITSHUFFLE),
                )
            f.create_dataset("t_index", shape=(0,), maxshape=(None,), dtype="<i8", chunks=(4096,))
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["index_stride"] = CHUNK_EVENTS
            f.swmr_mode = True  # no new objects after this point (an SWMR rule)
        except (OSError, RuntimeError) as e:
            raise self._fail(e, path) from e
        self._file, self._written = f, 0
        self._datasets = {key: f[key] for key in (*COLUMNS, "t_index")}
        self._shard_entry = {"file": name, "events": 0, "sealed": False}
        self._manifest["shards"].append(self._shard_entry)
        self._journal.shard_changed(self._shard_entry)

    def _commit(self, seal: bool = False) -> None:
        """Make everything appended durable and visible to readers; ``seal`` also closes the shard for good."""
        self._write_buffer()
        if self._file is not None:
            # Flush before close: a failed flush leaves the file closable once the ballast is gone,
            # a failed close does not (HDF5 then crashes at exit).
            self._guard_h5(lambda: self._file.flush())
            if seal:
                self._guard_h5(lambda: self._file.close())
                self._file, self._datasets = None, {}
                self._shard_entry["sealed"] = True
            self._guard_h5(lambda: fsync_path(self.root / self._shard_entry["file"]))  # (EIO, a folder gone)
            self._shard_entry["events"] = self._written
            self._journal.shard_changed(self._shard_entry)
        if self._recording is not None:  # (its events and times grew)
            self._journal.recording_changed(self._recording)
        self._journal.commit()
        self._last_commit = time.monotonic()

    def _commit_if_due(self) -> None:
        if time.monotonic() - self._last_commit >= self.flush_interval_s:
            self._commit()

    def _write_buffer(self) -> None:
        n = self._buffered
        if n == 0:
            return
        self._check_space(n * EVENT_DTYPE.itemsize)
        start, end = self._written, self._written + n
        first = -(-start // CHUNK_EVENTS) * CHUNK_EVENTS
        positions = np.arange(first, end, CHUNK_EVENTS)  # shard positions that get a time-index entry

        def write() -> None:
            for c in COLUMNS:
                ds = self._datasets[c]
                ds.resize((end,))
                ds[start:end] = self._buffer[c][:n]
            if positions.size:
                index = self._datasets["t_index"]
                k = first // CHUNK_EVENTS
                index.resize((k + positions.size,))
                index[k:] = self._buffer["t"][positions - start]

        self._guard_h5(write)
        self._written, self._buffered = end, 0

    def _guard_h5(self, op: Callable[[], object]) -> None:
        """Run a write to the shard; turn its failure into CorpusFullError/CorpusError and stop the writer."""
        try:
            op()
        except (OSError, RuntimeError) as e:  # h5py raises either for a failed HDF5 write
            raise self._fail(e, self.root / self._shard_entry["file"]) from e

    def _fail(self, exc: BaseException, path: Path) -> CorpusError:
        """Classify a failed write (disk full or not) and stop the writer."""
        return self._stop(self._space.failure(exc, path))

    def _stop(self, error: CorpusError) -> CorpusError:
        """Remember ``error`` (the writer refuses further work) and let go of the shard."""
        self._failed = str(error)
        # Drop the shard without File.close(): after a failed write an explicit close that fails too leaves HDF5
        # segfaulting on the next call, while h5py's destructor closes the file (or reports and moves on) safely.
        # The manifest points only at committed data either way.
        self._file, self._datasets = None, {}
        return error

    def _fits(self, n: int) -> bool:
        """Whether ``n`` more events fit above ``min_free_bytes`` (``DiskSpace.fits``: no disk query)."""
        return self._space.fits(n * EVENT_DTYPE.itemsize)

    def _check_space(self, pending_bytes: int) -> None:
        """Stop with ``CorpusFullError`` before a write the disk (or ``ulimit -f``) cannot take, with ``CorpusError``
        when the folder cannot be looked at."""
        shard = None if self._file is None else self.root / self._shard_entry["file"]
        try:
            self._space.check(pending_bytes, shard)
        except CorpusError as e:
            raise self._stop(e) from e.__cause__
