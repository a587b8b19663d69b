"""``Corpus``: reads recordings and N-event windows of a corpus, and finds the first event at a time, without reading
whole recordings."""

from __future__ import annotations

import collections
import functools
import os
import threading
from pathlib import Path
from typing import Any

import h5py
import numba
import numpy as np
from h5py import h5s, h5t

from mem_core.corpus.format import (
    CHUNK_EVENTS,
    COLUMNS,
    MANIFEST,
    CorpusError,
    RecordingInfo,
    ShardInfo,
    load_manifest,
    parse_manifest,
)
from mem_core.corpus.shard import H5_ERRORS, open_shard
from mem_core.events import EVENT_DTYPE, SensorSize

READ_BUFFER_EVENTS = 1 << 20  # reads up to this size go through per-process column buffers (~15 MB at most)
_VERIFY_BLOCK_EVENTS = READ_BUFFER_EVENTS


@numba.njit(cache=True, nogil=True)
def _pack_kernel(t, x, y, p, out):
    """Columns -> ``EVENT_DTYPE`` records in one pass (numpy's four strided field assignments take ~2x longer)."""
    for i in range(out.shape[0]):
        e = out[i]
        e.t, e.x, e.y, e.p = t[i], x[i], y[i], p[i]


@numba.njit(cache=True, nogil=True)
def _first_bad_event(events, t_prev, width, height):
    """Index of the first event before ``t_prev`` or its predecessor, off the sensor or of polarity > 1; -1 if none."""
    for i in range(events.shape[0]):
        e = events[i]
        if e.t < t_prev or e.x >= width or e.y >= height or e.p > 1:
            return i
        t_prev = e.t
    return -1


@functools.cache
def _memory_type(column: str) -> h5t.TypeID:
    """The HDF5 in-memory type of an event column (the same as in the shards: reads convert nothing)."""
    return h5t.py_create(EVENT_DTYPE[column])


class Corpus:
    """Read a corpus: ``recordings`` (``RecordingInfo``), whole recordings, N-event windows, the first event at a time.

    HDF5 files are opened lazily and per process, so the object can be passed to DataLoader workers. Reads go
    through HDF5's low-level API into per-process column buffers and are packed into records by a compiled
    loop: a 30 000-event window costs its chunk decompression, one fresh output array and little else.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        manifest = load_manifest(self.root)
        self.shards: dict[str, ShardInfo]
        self.recordings: list[RecordingInfo]
        self.shards, self.recordings = parse_manifest(manifest, str(self.root / MANIFEST))
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

    def label_counts(self) -> dict[str, int]:
        """Recordings per label (labels as names), sorted by name; unlabelled recordings are not counted."""
        return dict(sorted(collections.Counter(str(r.label) for r in self.recordings if r.label is not None).items()))

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
        self._this_process()
        with self._lock:
            columns = self._read(info, lo, hi, COLUMNS)  # checks the shard holds them before anything is sized
            out = np.empty(hi - lo, EVENT_DTYPE)
            _pack_kernel(*columns, out)
        self._check_window(i, lo - info.offset, out)
        return out

    @property
    def buffered_events(self) -> int:
        """Events the largest of this process's column read buffers holds (0 before the first read)."""
        return max((b.size for b in self._buffers.values()), default=0)

    def first_at(self, i: int, t: int) -> int:
        """Position in recording ``i`` of its first event with time >= ``t`` (coarse index + one chunk read)."""
        info = self._info(i)
        if info.n_events == 0:
            return 0
        t_index = self._shard(info.shard)["t_index"]
        stride = int(self._files[info.shard].attrs["index_stride"])
        k0 = -(-info.offset // stride)  # first index entry inside the recording
        if i not in self._time_index:
            k1 = (info.offset + info.n_events - 1) // stride + 1
            try:
                index = t_index[k0:k1] if k1 > k0 else np.empty(0, dtype="<i8")
            except H5_ERRORS as e:
                raise CorpusError(f"{self.root / info.shard}: cannot read the time index ({e})") from e
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

    def check(self, *, full: bool = False) -> dict[str, str]:
        """Damaged shards -> what is wrong with each (empty when all are fine).

        Every shard the manifest lists is opened and its columns compared with the events the manifest committed
        to it. ``full`` also reads every recording, checking time order, coordinates on its sensor, polarity and
        the manifest's ``t_min``/``t_max``, and the shard's time index.
        """
        problems = {}
        for name in self.shards:
            try:
                self._check_shard(name, full)
            except CorpusError as e:
                problems[name] = str(e)
        return problems

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
            self._files[name], self._datasets[name] = open_shard(self.root / name, sealed=self.shards[name].sealed)
        return self._datasets[name]

    def _check_shard(self, name: str, full: bool) -> None:
        datasets = self._shard(name)
        path, committed = self.root / name, self.shards[name].events
        held = min(datasets[c].shape[0] for c in COLUMNS)
        if held < committed:
            raise CorpusError(f"{path}: holds {held} events, the manifest committed {committed} (truncated shard?)")
        if full:
            for i, info in enumerate(self.recordings):
                if info.shard == name:
                    self._check_recording(i)
            self._check_time_index(name, committed)

    def _check_window(self, i: int, start: int, events: np.ndarray) -> None:
        """Events ``start...`` of recording ``i`` as read, checked in one compiled pass before anyone uses them: in
        time order and not before the manifest's ``t_min``, on the sensor, polarity 0/1, not after ``t_max``.

        A shard whose data was altered consistently (checksums rewritten) passes every structural check: without
        this, training on it ended in a traceback from the augmentation, or trained silently on reversed time.
        """
        info = self.recordings[i]
        if events.size == 0:
            return
        bad = _first_bad_event(events, info.t_min, info.sensor.width, info.sensor.height)
        if bad < 0 and events["t"][-1] <= info.t_max:
            return
        k = bad if bad >= 0 else events.size - 1
        e, sensor = events[k], info.sensor
        t_before, before = (
            (int(events["t"][k - 1]), "the event before it") if k else (info.t_min, "the manifest's t_min")
        )
        if e["t"] < t_before:
            why = f"comes before t={t_before} of {before}"
        elif e["x"] >= sensor.width or e["y"] >= sensor.height:
            why = f"lies off the {sensor.width}x{sensor.height} sensor"
        elif e["p"] > 1:
            why = "has a polarity other than 0 or 1"
        else:
            why = f"comes after the manifest's t_max={info.t_max}"
        raise CorpusError(
            f"{self.root / info.shard}: recording {info.name!r}: event {start + k} "
            f"(t={e['t']}, x={e['x']}, y={e['y']}, p={e['p']}) {why}"
        )

    def _check_recording(self, i: int) -> None:
        """Read recording ``i`` block by block (each block checked by ``window``) and check the blocks' order and
        the first and last times against the manifest."""
        info = self.recordings[i]
        where = f"{self.root / info.shard}: recording {info.name!r}"
        t_prev = np.iinfo(np.int64).min
        for start in range(0, info.n_events, _VERIFY_BLOCK_EVENTS):
            events = self.window(i, start, _VERIFY_BLOCK_EVENTS)
            if events["t"][0] < t_prev:
                raise CorpusError(f"{where}: event {start} (t={events['t'][0]}) is out of time order")
            if start == 0 and events["t"][0] != info.t_min:
                raise CorpusError(f"{where}: first event at t={events['t'][0]}, the manifest says {info.t_min}")
            t_prev = int(events["t"][-1])
        if info.n_events and t_prev != info.t_max:
            raise CorpusError(f"{where}: last event at t={t_prev}, the manifest says {info.t_max}")

    def _check_time_index(self, name: str, committed: int) -> None:
        """Every committed entry of ``t_index`` is the time of the event it points at."""
        datasets, path = self._shard(name), self.root / name
        stride = int(self._files[name].attrs["index_stride"])
        n = -(-committed // stride)
        try:
            index = datasets["t_index"][:n]
            at = datasets["t"][np.arange(n) * stride] if n else np.empty(0, "<i8")
        except H5_ERRORS as e:
            raise CorpusError(f"{path}: cannot read the time index ({e})") from e
        if index.size < n or not np.array_equal(index, at):
            raise CorpusError(f"{path}: the time index does not match the events ({index.size} of {n} entries)")

    def _read(self, info: RecordingInfo, lo: int, hi: int, columns: tuple[str, ...]) -> list[np.ndarray]:
        """Shard positions ``[lo, hi)`` of the given columns of ``info``'s shard (hold ``self._lock``).

        Up to ``READ_BUFFER_EVENTS`` events the arrays are views of this process's column buffers, valid until
        the next read: fresh arrays for every read would cost a page fault per 4 KB on first touch.
        """
        datasets = self._shard(info.shard)
        path = self.root / info.shard
        held = min(datasets[c].shape[0] for c in columns)
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
                if n > READ_BUFFER_EVENTS:
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
        except H5_ERRORS as e:
            raise CorpusError(f"{path}: cannot read events {lo}..{hi} ({e})") from e
        return arrays
