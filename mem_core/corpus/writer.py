"""``CorpusWriter``: appends recordings to a corpus, crash-safe (see ``mem_core.corpus.format`` for what survives)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import resource
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h5py
import numba
import numpy as np

from mem_core.corpus.format import (
    CHUNK_EVENTS,
    COLUMNS,
    FORMAT_VERSION,
    JOURNAL,
    JOURNAL_NAME,
    MANIFEST,
    CorpusError,
    CorpusFullError,
    fsync_path,
    load_manifest,
    parse_manifest,
    write_manifest,
)
from mem_core.events import EVENT_DTYPE, SensorSize, time_problem, validate_events
from mem_core.io.hdf5 import hdf5_filters

_BUFFER_EVENTS = 1 << 20  # events held in memory before a shard write (64 chunks)
# Ballast deleted on a failed write so HDF5 can still close the shard: 16 MiB, or 1/32 of the free space on a small
# disk (at least 1 MiB), where 16 MiB took most of the room and a recording kept no events.
_RESERVE_BYTES = 16 << 20
_MIN_RESERVE_BYTES = 1 << 20
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_SHARD_RE = re.compile(r"shard-(\d+)\.h5$")
_MIN_FOLD_BYTES = 1 << 16  # a journal is folded into the manifest once larger than it, and than this


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


def _check_events(events: np.ndarray, sensor: SensorSize, t_last: int | None) -> None:
    """``validate_events`` plus "not before ``t_last``", with a compiled fast path for valid input."""
    valid = isinstance(events, np.ndarray) and events.dtype == EVENT_DTYPE and events.ndim == 1
    t_floor = np.iinfo(np.int64).min if t_last is None else t_last
    plausible = valid and (events.size == 0 or time_problem(int(events["t"][0]), int(events["t"][-1])) is None)
    if plausible and _events_ok(events, t_floor, sensor.width, sensor.height):
        return
    validate_events(events, sensor)  # raises with the first problem named
    raise ValueError(f"events go back in time: first t={int(events['t'][0])} is before the last appended t={t_last}")


def prepare_corpus_dir(root: Path) -> None:
    """Create the corpus directory ``root`` (with its parents) if needed; ``CorpusError`` in one line when it cannot
    be one (an existing file, a path too long, no permission)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CorpusError(f"{root}: exists and is not a directory, so it cannot hold a corpus") from None
    except OSError as e:
        raise CorpusError(f"{root}: cannot hold a corpus ({e.strerror or e})") from None


def take_writer_lock(root: Path) -> int:
    """The corpus ``root``'s writer lock (an ``flock`` on ``.writer.lock``, released by the kernel if its holder
    dies), as a descriptor to ``os.close`` when done; ``CorpusError`` while another writer holds it."""
    fd = os.open(root / ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CorpusError(f"{root}: another CorpusWriter has this corpus open") from None
    return fd


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
        prepare_corpus_dir(self.root)
        self._lock_fd = take_writer_lock(self.root)
        self._reserve = self.root / ".reserve"
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
        # What changed since the last commit, appended to the journal as one line at the next: shard entries by file,
        # recording entries by name (the same dicts the manifest holds), names taken out.
        self._changed_shards: dict[str, dict[str, Any]] = {}
        self._changed: dict[str, dict[str, Any]] = {}
        self._removed: list[str] = []
        self._journal_fd: int | None = None  # opened at the first commit after a fold
        self._journal_bytes = 0
        self._manifest_bytes = 0
        try:
            self._open_manifest(provenance)
            reserve = min(_RESERVE_BYTES, max(shutil.disk_usage(self.root).free // 32, _MIN_RESERVE_BYTES))
            self._check_space(reserve)
            with open(self._reserve, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, reserve)
            self._free_seen = shutil.disk_usage(self.root).free
            self._fold()  # the journal a killed writer left becomes part of the manifest
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
            self._manifest = load_manifest(self.root)
            parse_manifest(self._manifest, str(self.root / MANIFEST))  # refuse to extend a damaged manifest
        elif shards_on_disk:
            raise CorpusError(
                f"{self.root}: holds shard files but no {MANIFEST}; refusing to start a new corpus over them"
            )
        else:
            self._manifest = {"format_version": FORMAT_VERSION, "provenance": [], "shards": [], "recordings": []}
        self._manifest["format_version"] = FORMAT_VERSION  # (a version 1 corpus gets a journal from now on)
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
        self._changed[rec["name"]] = rec
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
                self._changed.pop(entry["name"], None)
                self._removed.append(entry["name"])
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
                self._fold()  # a closed corpus is its manifest alone
        finally:
            self._closed = True
            self._close_journal()
            try:
                self._reserve.unlink(missing_ok=True)
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
        self._changed[name] = self._recording

    def _next_segment(self) -> None:
        rec = self._recording
        rec["complete"] = True
        self._changed[rec["name"]] = rec
        self._commit(seal=True)
        keys = ("session", "sensor", "label", "metadata")
        self._start_segment({**{k: rec[k] for k in keys}, "segment": rec["segment"] + 1})

    def _open_shard(self) -> None:
        name = f"shard-{self._next_shard:05d}.h5"
        self._next_shard += 1
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
        self._changed_shards[name] = self._shard_entry

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
            self._changed_shards[self._shard_entry["file"]] = self._shard_entry
        if self._recording is not None:  # (its events and times grew)
            self._changed[self._recording["name"]] = self._recording
        self._append_journal()
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
        code = _full_errno(exc)
        if code is None:
            return self._stop(CorpusError(f"{path}: write failed ({exc}); events committed before are kept"))
        with contextlib.suppress(OSError):  # (the folder itself may be gone)
            self._reserve.unlink(missing_ok=True)  # room for HDF5 to close the shard cleanly
        try:
            free = f"{shutil.disk_usage(self.root).free} bytes free"
        except OSError as e:
            free = f"free space unknown ({e.strerror or e})"
        return self._stop(
            CorpusFullError(
                code,
                f"{path}: disk full ({os.strerror(code)}), {free} in {self.root}; events committed before are kept",
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

    def _fits(self, n: int) -> bool:
        """Whether ``n`` events (uncompressed, plus 1 MiB of HDF5 metadata) fit above ``min_free_bytes``, by the free
        space seen at the last check less what was written since (no disk query on the append path)."""
        return self._free_seen - n * EVENT_DTYPE.itemsize - (1 << 20) >= self.min_free_bytes

    def _check_space(self, pending_bytes: int) -> None:
        """Stop with CorpusFullError before a write that the disk (or ``ulimit -f``) cannot take, and with CorpusError
        when the folder cannot be looked at (moved or deleted under the writer)."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError as e:
            raise self._fail(e, self.root) from e
        self._free_seen = free - pending_bytes  # at most what the write takes (it compresses)
        file_limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if self._file is not None and file_limit != resource.RLIM_INFINITY:
            path = self.root / self._shard_entry["file"]
            try:
                size = path.stat().st_size
            except OSError as e:
                raise self._fail(e, path) from e
            if size + pending_bytes + (1 << 20) > file_limit:  # 1 MiB for HDF5 metadata
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

    def _append_journal(self) -> None:
        """Commit what changed since the last commit: one line appended to the journal and fsynced, its cost that of
        the change, not of the corpus. Folded into the manifest once the journal outgrows it (and on close), so a
        reader's fold stays as cheap as reading the manifest."""
        change = {
            "shards": list(self._changed_shards.values()),
            "removed": self._removed,
            "recordings": list(self._changed.values()),
        }
        change = {key: entries for key, entries in change.items() if entries}
        if not change:
            return
        line = (json.dumps(change) + "\n").encode()
        path = self.root / JOURNAL.format(self._manifest["journal"])
        try:
            if self._journal_fd is None:
                self._journal_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                fsync_path(self.root)  # its name as durable as its lines
            rest = memoryview(line)
            while rest:
                rest = rest[os.write(self._journal_fd, rest) :]
            os.fsync(self._journal_fd)
        except OSError as e:  # a line cut short here is one a reader leaves out: no newline
            raise self._fail(e, path) from e
        self._journal_bytes += len(line)
        self._changed_shards, self._changed, self._removed = {}, {}, []
        if self._journal_bytes > max(self._manifest_bytes, _MIN_FOLD_BYTES):
            self._fold()

    def _fold(self) -> None:
        """Write the whole manifest (atomically), naming a new, empty journal, then remove the journals it holds."""
        self._close_journal()
        self._manifest["journal"] = self._manifest.get("journal", 0) + 1
        try:
            self._manifest_bytes = write_manifest(self.root, self._manifest)
            for path in self.root.iterdir():  # the one folded in and any a crash left: the new one starts empty
                if JOURNAL_NAME.fullmatch(path.name):
                    path.unlink(missing_ok=True)
        except OSError as e:
            raise self._fail(e, self.root / MANIFEST) from e
        self._journal_bytes = 0
        self._changed_shards, self._changed, self._removed = {}, {}, []

    def _close_journal(self) -> None:
        if self._journal_fd is not None:
            fd, self._journal_fd = self._journal_fd, None
            os.close(fd)
