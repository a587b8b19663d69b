"""``Corpus``: reads recordings, N-event windows and time slices of a corpus without reading whole recordings."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (registers the Blosc filter the shards use)
import numba
import numpy as np
from h5py import h5s, h5t

from mem_core.corpus.format import (
    CHUNK_EVENTS,
    COLUMNS,
    MANIFEST,
    CorpusError,
    RecordingInfo,
    load_manifest,
    recording_info,
)
from mem_core.events import EVENT_DTYPE, SensorSize

_READ_BUFFER_EVENTS = 1 << 20  # reads up to this size go through per-process column buffers (~15 MB at most)


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


class Corpus:
    """Read a corpus: ``recordings`` (``RecordingInfo``), whole recordings, N-event windows and time slices.

    HDF5 files are opened lazily and per process, so the object can be passed to DataLoader workers. Reads go
    through HDF5's low-level API into per-process column buffers and are packed into records by a compiled
    loop: a 30 000-event window costs its chunk decompression, one fresh output array and little else.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        manifest = load_manifest(self.root)
        where = str(self.root / MANIFEST)
        self.recordings: list[RecordingInfo] = [recording_info(e, where) for e in manifest["recordings"]]
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
