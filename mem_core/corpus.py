"""The corpus: a directory of HDF5 event shards plus a JSON manifest, written while recording and read for training.

Layout of a corpus directory::

    manifest.json        format_version, provenance, shards, recordings (written atomically: tmp + os.replace)
    shard-00000.h5       columnar datasets t (<i8), x (<u2), y (<u2), p (u1), chunked, Blosc LZ4 + bitshuffle,
    shard-00001.h5 ...   plus t_index: the t of every ``index_stride``-th event of the shard (a coarse time index)

A recording is a slice ``(shard, offset, n_events)`` of one shard, so thousands of short labelled samples
(N-Cars: 100 ms, a few thousand events each) share a shard, and one long live recording is cut into segments,
one shard each: every segment is its own recording entry carrying the same ``session`` and a ``segment`` number
(``rotate()`` cuts by hand; a full shard (``shard_max_events``) cuts automatically). Segment 0 is named after the
session, segment k > 0 is named ``"<session>/<k>"``.

Crash safety (measured on HDF5 2.0 / h5py 3.16, not assumed):

- Shards are written in SWMR mode (``libver="latest"``, ``swmr_mode=True``): HDF5 then orders its writes so the
  file on disk is consistent at every moment. After SIGKILL (27 kills at random moments) every shard opened with
  ``swmr=True`` and held every event flushed before the kill. Without SWMR, HDF5 promises nothing about the
  file on disk between flushes (metadata and rewritten chunks are written back in cache order).
- A killed SWMR writer leaves the superblock marked "open for write": the file opens for reading with
  ``swmr=True`` only, and never again for writing. So a shard is written by one writer session only; re-opening
  a corpus starts a new shard, and readers always open shards with ``swmr=True``.
- The manifest is the commit record. Events are buffered in memory, written to the shard when the buffer fills,
  and committed at least every ``flush_interval_s`` (checked inside ``append``) and on close: shard flush + fsync,
  then the manifest (tmp + fsync + ``os.replace``). Readers trust only the counts in the manifest, so whatever
  reached a shard after the last commit is ignored; a recording in progress at the crash appears with
  ``complete=False`` and its committed events.
- Full disk: free space is checked against ``min_free_bytes`` (and the shard size against ``ulimit -f``) before
  every shard write, raising ``CorpusFullError``. A write that fails anyway (ENOSPC, EDQUOT, EFBIG) raises
  ``CorpusFullError`` too. HDF5 must never be left with a write that keeps failing: a dataset whose close failed
  stays half-closed and HDF5 segfaults at exit (seen with a file-size limit). So the writer keeps a ballast file
  (``.reserve``, 16 MiB) and deletes it on such a failure, giving the shard room to close cleanly.
- One writer at a time: an ``flock`` on ``.writer.lock`` (released by the kernel if the writer dies).

Readers open HDF5 files lazily, per process (a handle opened before a fork is never used after it), so a
``Corpus`` can be handed to torch DataLoader workers.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import re
import resource
import shutil
import threading
import time
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numba
import numpy as np
from h5py import h5s, h5t

from mem_core.errors import MemError
from mem_core.events import EVENT_DTYPE, SensorSize, validate_events

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
COLUMNS = ("t", "x", "y", "p")
CHUNK_EVENTS = 1 << 14  # events per HDF5 chunk; also the stride of the coarse time index
_BUFFER_EVENTS = 1 << 20  # events held in memory before a shard write (64 chunks)
_RESERVE_BYTES = 16 << 20  # ballast deleted on a failed write so HDF5 can still close the shard
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_COMPRESSION = hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE)
_SHARD_RE = re.compile(r"shard-(\d+)\.h5$")
_READ_BUFFER_EVENTS = 1 << 20  # reads up to this size go through per-process column buffers (~15 MB at most)


class CorpusError(MemError):
    """A corpus that cannot be read or written: the message names the file and what is wrong."""


class CorpusFullError(CorpusError, OSError):
    """The disk holding the corpus is (nearly) full; everything committed before stays readable."""


@dataclass(frozen=True)
class RecordingInfo:
    """One recording (or one segment of a long session) and where its events live."""

    name: str
    sensor: SensorSize
    n_events: int
    t_min: int | None
    t_max: int | None
    label: int | str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    session: str = ""
    segment: int = 0
    complete: bool = True
    shard: str = ""
    offset: int = 0


def _load_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CorpusError(f"{path}: no corpus manifest (not a corpus directory?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorpusError(f"{path}: corrupt corpus manifest ({e})") from e
    if not isinstance(manifest, dict) or not {"format_version", "recordings", "shards"} <= manifest.keys():
        raise CorpusError(f"{path}: not a corpus manifest (missing format_version/recordings/shards)")
    if manifest["format_version"] != FORMAT_VERSION:
        raise CorpusError(f"{path}: format_version {manifest['format_version']!r}, this code reads {FORMAT_VERSION}")
    return manifest


def _recording_info(entry: dict[str, Any], where: str) -> RecordingInfo:
    try:
        values = {f.name: entry[f.name] for f in fields(RecordingInfo)}
        return RecordingInfo(**{**values, "sensor": SensorSize(*(int(v) for v in entry["sensor"]))})
    except (KeyError, TypeError, ValueError) as e:
        raise CorpusError(f"{where}: malformed recording entry {entry!r} ({e!r})") from e


def _full_errno(exc: BaseException) -> int | None:
    """The disk-full errno behind an OSError or an h5py error message (HDF5 reports "errno = 28"), else None."""
    codes = [getattr(exc, "errno", None), *(int(c) for c in re.findall(r"errno = (\d+)", str(exc)))]
    return next((c for c in codes if c in _FULL_ERRNOS), None)


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


@numba.njit(cache=True, nogil=True)
def _pack_kernel(t, x, y, p, out):
    """Columns -> ``EVENT_DTYPE`` records in one pass (numpy's four strided field assignments take ~2x longer)."""
    for i in range(out.shape[0]):
        e = out[i]
        e.t, e.x, e.y, e.p = t[i], x[i], y[i], p[i]


@functools.cache
def _memory_type(column: str) -> h5t.TypeID:
    """The HDF5 in-memory type of an event column (the same as in the shards: reads convert nothing)."""
    return h5t.py_create(EVENT_DTYPE[column])


def _check_events(events: np.ndarray, sensor: SensorSize, t_last: int | None) -> None:
    """``validate_events`` plus "not before ``t_last``", with a compiled fast path for valid input."""
    valid = isinstance(events, np.ndarray) and events.dtype == EVENT_DTYPE and events.ndim == 1
    t_floor = np.iinfo(np.int64).min if t_last is None else t_last
    if valid and _events_ok(events, t_floor, sensor.width, sensor.height):
        return
    validate_events(events, sensor)  # raises with the first problem named
    raise ValueError(f"events go back in time: first t={int(events['t'][0])} is before the last appended t={t_last}")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        min_free_bytes: int = 256 << 20,
    ) -> None:
        if shard_max_events < 1 or flush_interval_s < 0 or min_free_bytes < 0:
            raise ValueError(
                f"need shard_max_events >= 1, flush_interval_s >= 0, min_free_bytes >= 0; got "
                f"{shard_max_events}, {flush_interval_s}, {min_free_bytes}"
            )
        self.root = Path(root)
        self.flush_interval_s = flush_interval_s
        self.shard_max_events = shard_max_events
        self.min_free_bytes = min_free_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._reserve = self.root / ".reserve"
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise CorpusError(f"{self.root}: another CorpusWriter has this corpus open") from None
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
            self._open_manifest(provenance)
            self._check_space(_RESERVE_BYTES)
            with open(self._reserve, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, _RESERVE_BYTES)
            self._write_manifest()
        except BaseException:
            self._reserve.unlink(missing_ok=True)
            os.close(self._lock_fd)
            raise
        recordings = self._manifest["recordings"]
        self._names = {e["name"] for e in recordings} | {e["session"] for e in recordings}
        self._last_commit = time.monotonic()

    def _open_manifest(self, provenance: dict[str, Any] | None) -> None:
        shards_on_disk = [int(m.group(1)) for p in self.root.iterdir() if (m := _SHARD_RE.fullmatch(p.name))]
        if (self.root / MANIFEST).exists():
            self._manifest = _load_manifest(self.root)
            for entry in self._manifest["recordings"]:
                _recording_info(entry, str(self.root / MANIFEST))
        elif shards_on_disk:
            raise CorpusError(
                f"{self.root}: holds shard files but no {MANIFEST}; refusing to start a new corpus over them"
            )
        else:
            self._manifest = {"format_version": FORMAT_VERSION, "provenance": [], "shards": [], "recordings": []}
        self._next_shard = max(shards_on_disk, default=-1) + 1
        entry = {"opened_utc": datetime.now(UTC).isoformat(timespec="seconds"), **(provenance or {})}
        try:
            json.dumps(entry)
        except (TypeError, ValueError) as e:
            raise ValueError(f"provenance must be JSON-serialisable: {e}") from e
        self._manifest["provenance"].append(entry)

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
        self._require_recording()["complete"] = True
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
        finally:
            self._closed = True
            self._reserve.unlink(missing_ok=True)
            os.close(self._lock_fd)

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

    def _next_segment(self) -> None:
        rec = self._recording
        rec["complete"] = True
        self._commit(seal=True)
        keys = ("session", "sensor", "label", "metadata")
        self._start_segment({**{k: rec[k] for k in keys}, "segment": rec["segment"] + 1})

    def _open_shard(self) -> None:
        name = f"shard-{self._next_shard:05d}.h5"
        self._next_shard += 1
        path = self.root / name
        self._check_space(0)
        try:
            f = h5py.File(path, "x", libver="latest")
            for c in COLUMNS:
                f.create_dataset(
                    c, shape=(0,), maxshape=(None,), dtype=EVENT_DTYPE[c], chunks=(CHUNK_EVENTS,), **_COMPRESSION
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
            _fsync_path(self.root / self._shard_entry["file"])
            self._shard_entry["events"] = self._written
        self._write_manifest()
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

    def _guard_h5(self, op) -> None:
        """Run an HDF5 write; turn its failure into CorpusFullError/CorpusError and stop the writer."""
        try:
            op()
        except (OSError, RuntimeError) as e:  # h5py raises either for a failed HDF5 write
            raise self._fail(e, self.root / self._shard_entry["file"]) from e

    def _fail(self, exc: BaseException, path: Path) -> CorpusError:
        """Classify a failed write (disk full or not) and stop the writer."""
        code = _full_errno(exc)
        if code is None:
            return self._stop(CorpusError(f"{path}: write failed ({exc}); events committed before are kept"))
        self._reserve.unlink(missing_ok=True)  # room for HDF5 to close the shard cleanly
        free = shutil.disk_usage(self.root).free
        return self._stop(
            CorpusFullError(
                code,
                f"{path}: disk full ({os.strerror(code)}), {free} bytes free in {self.root}; "
                "events committed before are kept",
            )
        )

    def _stop(self, error: CorpusError) -> CorpusError:
        """Remember ``error`` (the writer refuses further work) and let go of the shard."""
        self._failed = str(error)
        # Drop the shard without File.close(): after a failed write an explicit close that fails too leaves HDF5
        # segfaulting on the next call, while h5py's destructor closes the file (or reports and moves on) safely.
        # The manifest points only at committed data either way.
        self._file, self._datasets = None, {}
        return error

    def _check_space(self, pending_bytes: int) -> None:
        """Stop with CorpusFullError before a write that the disk (or ``ulimit -f``) cannot take."""
        free = shutil.disk_usage(self.root).free
        file_limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if self._file is not None and file_limit != resource.RLIM_INFINITY:
            path = self.root / self._shard_entry["file"]
            if path.stat().st_size + pending_bytes + (1 << 20) > file_limit:  # 1 MiB for HDF5 metadata
                raise self._stop(
                    CorpusFullError(
                        errno.EFBIG,
                        f"{path}: {pending_bytes} more bytes would pass the file-size limit of {file_limit} bytes "
                        f"(ulimit -f); {free} bytes free in {self.root}; events committed before are kept",
                    )
                )
        if free - pending_bytes < self.min_free_bytes:
            raise self._stop(
                CorpusFullError(
                    errno.ENOSPC,
                    f"{self.root}: only {free} bytes free on its disk ({pending_bytes} to write), below "
                    f"min_free_bytes={self.min_free_bytes}; events committed before are kept",
                )
            )

    def _write_manifest(self) -> None:
        path = self.root / MANIFEST
        tmp = path.with_suffix(".json.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(self._manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_path(self.root)  # make the rename itself durable
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise self._fail(e, path) from e


class Corpus:
    """Read a corpus: ``recordings`` (``RecordingInfo``), whole recordings, N-event windows and time slices.

    HDF5 files are opened lazily and per process, so the object can be passed to DataLoader workers. Reads go
    through HDF5's low-level API into per-process column buffers and are packed into records by a compiled
    loop: a 30 000-event window costs its chunk decompression, one fresh output array and little else.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        manifest = _load_manifest(self.root)
        where = str(self.root / MANIFEST)
        self.recordings: list[RecordingInfo] = [_recording_info(e, where) for e in manifest["recordings"]]
        self.provenance: list[dict[str, Any]] = manifest.get("provenance", [])
        self._files: dict[str, h5py.File] = {}
        self._datasets: dict[str, dict[str, h5py.Dataset]] = {}  # shard -> its open datasets
        self._pid = os.getpid()
        self._time_index: dict[int, np.ndarray] = {}
        self._buffers: dict[str, np.ndarray] = {}  # column -> read buffer, reused while its data is packed
        self._lock = threading.Lock()  # guards the buffers (a Corpus may be read from several threads)

    def __len__(self) -> int:
        return len(self.recordings)

    @property
    def total_events(self) -> int:
        return sum(r.n_events for r in self.recordings)

    def index(self, name: str) -> int:
        """Position of the recording called ``name``."""
        for i, r in enumerate(self.recordings):
            if r.name == name:
                return i
        raise KeyError(f"{self.root}: no recording named {name!r}")

    def events(self, i: int) -> np.ndarray:
        """All events of recording ``i``."""
        return self.window(i, 0, self._info(i).n_events)

    def window(self, i: int, start: int, count: int) -> np.ndarray:
        """Events ``[start, start + count)`` of recording ``i`` (clipped to it), reading only the chunks needed."""
        info = self._info(i)
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be >= 0, got start={start}, count={count}")
        lo = info.offset + min(start, info.n_events)
        hi = info.offset + min(start + count, info.n_events)
        out = np.empty(hi - lo, EVENT_DTYPE)
        self._this_process()
        with self._lock:
            _pack_kernel(*self._read(info, lo, hi, COLUMNS), out)
        return out

    def time_slice(self, i: int, t0: int, t1: int) -> np.ndarray:
        """Events of recording ``i`` with ``t0 <= t < t1`` (coarse index + one chunk read per bound)."""
        lo = self._search(i, t0)
        return self.window(i, lo, max(self._search(i, t1) - lo, 0))

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable summary: recordings, events, t_min, t_max, sensors, labels."""
        t_mins = [r.t_min for r in self.recordings if r.t_min is not None]
        t_maxs = [r.t_max for r in self.recordings if r.t_max is not None]
        sensors: dict[SensorSize, int] = {}
        labels: dict[str, int] = {}
        for r in self.recordings:
            sensors[r.sensor] = sensors.get(r.sensor, 0) + 1
            if r.label is not None:
                labels[str(r.label)] = labels.get(str(r.label), 0) + 1
        return {
            "root": str(self.root),
            "recordings": len(self.recordings),
            "events": self.total_events,
            "t_min": min(t_mins, default=None),
            "t_max": max(t_maxs, default=None),
            "sensors": [{"height": s.height, "width": s.width, "recordings": n} for s, n in sorted(sensors.items())],
            "labels": labels,
        }

    def close(self) -> None:
        """Close the HDF5 handles this process opened."""
        if self._pid == os.getpid():
            for f in self._files.values():
                f.close()
        self._files, self._datasets = {}, {}

    def __enter__(self) -> Corpus:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # h5py handles cannot be pickled (spawned DataLoader workers); each process opens its own.
        return {**self.__dict__, "_files": {}, "_datasets": {}, "_buffers": {}, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ---- internals -----------------------------------------------------------------------------------------

    def _info(self, i: int) -> RecordingInfo:
        if not -len(self.recordings) <= i < len(self.recordings):
            raise IndexError(f"{self.root}: recording index {i} out of range (corpus has {len(self.recordings)})")
        return self.recordings[i]

    def _this_process(self) -> None:
        """Drop what a fork inherited: the parent's HDF5 handles must not be used (or closed) here, and its lock
        may have been held by a thread that does not exist in this process."""
        if self._pid != os.getpid():
            self._files, self._datasets, self._buffers, self._pid = {}, {}, {}, os.getpid()
            self._lock = threading.Lock()

    def _shard(self, name: str) -> dict[str, h5py.Dataset]:
        """The datasets of shard ``name``, opened on first use in this process."""
        self._this_process()
        if name not in self._datasets:
            path = self.root / name
            if not path.is_file():
                raise CorpusError(f"{path}: shard listed in the manifest is missing")
            try:
                f = h5py.File(path, "r", swmr=True)
            except OSError as e:
                raise CorpusError(f"{path}: cannot open shard ({e})") from e
            missing = [c for c in (*COLUMNS, "t_index") if c not in f]
            if missing or "index_stride" not in f.attrs:
                f.close()
                raise CorpusError(f"{path}: not a corpus shard (missing {', '.join(missing) or 'index_stride'})")
            self._files[name] = f
            self._datasets[name] = {c: f[c] for c in (*COLUMNS, "t_index")}
        return self._datasets[name]

    def _read(self, info: RecordingInfo, lo: int, hi: int, columns: tuple[str, ...]) -> list[np.ndarray]:
        """Shard positions ``[lo, hi)`` of the given columns of ``info``'s shard (hold ``self._lock``).

        Up to ``_READ_BUFFER_EVENTS`` events the arrays are views of this process's column buffers, valid until
        the next read: fresh arrays for every read would cost a page fault per 4 KB on first touch.
        """
        datasets = self._shard(info.shard)
        path = self.root / info.shard
        held = datasets["t"].shape[0]
        if held < info.offset + info.n_events:
            raise CorpusError(
                f"{path}: holds {held} events, the manifest needs {info.offset + info.n_events} "
                f"for recording {info.name!r} (truncated shard?)"
            )
        n = hi - lo
        arrays = []
        try:
            memory = h5s.create_simple((max(n, 1),))
            for c in columns:
                buffer = self._buffers.get(c)
                if n > _READ_BUFFER_EVENTS:
                    buffer = np.empty(n, EVENT_DTYPE[c])
                elif buffer is None or buffer.size < n:
                    buffer = self._buffers[c] = np.empty(max(n, CHUNK_EVENTS), EVENT_DTYPE[c])
                array = buffer[:n]
                if n:
                    selection = datasets[c].id.get_space()
                    selection.select_hyperslab((lo,), (n,))
                    # An explicit memory type: h5py derives it from the array's dtype on every call otherwise (~10 us).
                    datasets[c].id.read(memory, selection, array, _memory_type(c))
                arrays.append(array)
        except (OSError, RuntimeError) as e:
            raise CorpusError(f"{path}: cannot read events {lo}..{hi} ({e})") from e
        return arrays

    def _search(self, i: int, t: int) -> int:
        """Position in recording ``i`` of its first event with time >= ``t``."""
        info = self._info(i)
        if info.n_events == 0:
            return 0
        t_index = self._shard(info.shard)["t_index"]
        stride = int(self._files[info.shard].attrs["index_stride"])
        k0 = -(-info.offset // stride)  # first index entry inside the recording
        if i not in self._time_index:
            k1 = (info.offset + info.n_events - 1) // stride + 1
            index = t_index[k0:k1] if k1 > k0 else np.empty(0, dtype="<i8")
            if index.size != max(k1 - k0, 0):
                raise CorpusError(f"{self.root / info.shard}: time index too short for recording {info.name!r}")
            self._time_index[i] = index
        index = self._time_index[i]
        j = int(np.searchsorted(index, t, side="left"))  # entries before j have time < t
        lo = info.offset if j == 0 else (k0 + j - 1) * stride
        hi = info.offset + info.n_events if j == index.size else (k0 + j) * stride
        with self._lock:
            (block,) = self._read(info, lo, hi, ("t",))
            return lo - info.offset + int(np.searchsorted(block, t, side="left"))
