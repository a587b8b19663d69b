"""DSEC ``events.h5``: datasets ``events/{x,y,t,p}``, ``ms_to_idx`` and ``t_offset`` (Blosc/ZSTD compressed).

``events/t`` holds microseconds relative to ``t_offset``; ``read_dsec`` returns absolute times
``t + t_offset`` (the clock DSEC's image and label timestamps use). ``ms_to_idx[m]`` is the index of the first
event with relative ``t >= 1000 * m``. Geometry: ``width``/``height`` attributes of the ``events`` group when
present (our writer adds them), else DSEC's 640 x 480 when the events fit, else inferred from the events.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
from h5py import h5d, h5l

from mem_core.errors import MissingPackage
from mem_core.events import EVENT_DTYPE, MAX_ABS_TIME_US, SensorSize, infer_sensor
from mem_core.files import NotRegularFile, check_regular
from mem_core.io.base import EventFile, EventFileError, check_column, check_on_sensor, sort_by_time

DSEC_SENSOR = SensorSize(480, 640)
FIELDS = ("x", "y", "t", "p")
# Declared sizes a file must back with stored bytes: at most this many times what its chunks hold on disk (Blosc
# and gzip reach ~10x on event columns; a constant column far more, hence the margin), beyond a size always allowed.
MAX_EXPANSION = 1000
ALWAYS_ALLOWED_BYTES = 64 << 20
# HDF5 decompresses a whole chunk to read any element of it: 16 x h5py's largest automatic chunk (1 MiB), 128 x a
# corpus shard's. A 2 MB file declaring 16 events in chunks of 2^29 elements took 1.2 GB to read one window.
MAX_CHUNK_BYTES = 16 << 20
_DECODE_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)
_LINK_KINDS = {h5l.TYPE_SOFT: "a soft link", h5l.TYPE_EXTERNAL: "an external link to another file"}


class LayoutError(Exception):
    """An HDF5 object that must not be read as stored (it points outside the file, or its sizes are implausible);
    the caller names the file."""


@functools.cache
def hdf5_filters() -> ModuleType:
    """``hdf5plugin``, imported once: the import registers the Blosc and ZSTD filters of DSEC files and corpus shards
    with HDF5, which h5py needs to read them (else an obscure plugin error). Call it before h5py opens such a file.

    Imported here rather than with this module: its wheel is 46 MB, and training on other files does without it.
    ``MissingPackage`` when it is not installed.
    """
    try:
        import hdf5plugin
    except ImportError as e:
        raise MissingPackage(
            f"HDF5 event files and corpus shards (Blosc/ZSTD) need the Python package 'hdf5plugin', which is not "
            f"installed ({e})"
        ) from e
    return hdf5plugin


def member(group: h5py.Group, name: str, *, follow_links: bool = False) -> h5py.Group | h5py.Dataset | None:
    """``group[name]``, or None when there is no such link, without following a link out of the file.

    Only the link itself is looked at first (h5py's ``in`` and ``get`` open what a link points to: an external link
    to a FIFO hangs there). A soft or external link is a ``LayoutError`` unless ``follow_links``.
    """
    key = name.encode()
    if not group.id.links.exists(key):
        return None
    kind = group.id.links.get_info(key).type
    if kind != h5l.TYPE_HARD and not follow_links:
        where = f"{group.name.rstrip('/')}/{name}"
        raise LayoutError(f"{where} is {_LINK_KINDS.get(kind, f'a link of type {kind}')}, not data stored in the file")
    return group[name]


def check_datasets(datasets: dict[str, h5py.Dataset], file_size: int, *, follow_links: bool = False) -> None:
    """Raise ``LayoutError`` unless every dataset can be read from this file within bounded memory.

    Refused before any data is read: raw data stored in other files (external storage: ``/etc/passwd`` read as
    events, ``/dev/zero`` as gigabytes) or mapped from other datasets (virtual datasets, whose sources may be
    anything) unless ``follow_links``; chunks of more than ``MAX_CHUNK_BYTES`` (a chunk is decompressed whole to
    read one element of it); declared sizes the file cannot hold.
    """
    for name, ds in datasets.items():
        plist = ds.id.get_create_plist()
        if not follow_links and plist.get_layout() == h5d.VIRTUAL:
            raise LayoutError(f"dataset {name} is a virtual dataset (its data lies in other datasets or files)")
        if not follow_links and plist.get_external_count():
            raise LayoutError(f"dataset {name} keeps its data in external files, not in this one")
        chunk_bytes = math.prod(ds.chunks) * ds.dtype.itemsize if ds.chunks else 0
        if chunk_bytes > MAX_CHUNK_BYTES:
            raise LayoutError(
                f"dataset {name} comes in chunks of {ds.chunks} elements ({chunk_bytes} bytes), more than the "
                f"{MAX_CHUNK_BYTES} a reader decompresses at once"
            )
    if (problem := _storage_problem(datasets, file_size)) is not None:
        raise LayoutError(problem)


def _storage_problem(datasets: dict[str, h5py.Dataset], file_size: int) -> str | None:
    """Why the declared sizes of ``datasets`` cannot be what the file stores, or None.

    Reading a dataset allocates its declared shape first, and chunks never written read as fill values: a damaged
    header declaring 2^40 elements would ask for terabytes and take hours to fill, from a file of a few kilobytes.
    """
    declared = sum(ds.size * ds.dtype.itemsize for ds in datasets.values())
    stored = sum(ds.id.get_storage_size() for ds in datasets.values())
    if declared > max(stored * MAX_EXPANSION, ALWAYS_ALLOWED_BYTES):
        shapes = {name: ds.shape for name, ds in datasets.items()}
        return f"the datasets declare {declared} bytes {shapes} but the file stores {stored} bytes of them"
    for name, ds in datasets.items():
        offset = ds.id.get_offset()  # contiguous data: where it starts (None for chunked or unwritten data)
        if offset is not None and offset + ds.id.get_storage_size() > file_size:
            return f"dataset {name} ends beyond the end of the {file_size}-byte file"
    return None


def read_dsec(path: Path, *, follow_links: bool = False) -> EventFile:
    """Decode a DSEC-layout ``events.h5`` file.

    ``follow_links`` reads data the file points to elsewhere (external storage, soft and external links, virtual
    datasets); without it such a file is refused, since it can name any file on the machine.
    """
    try:
        check_regular(path)  # h5py opens the file by name
        hdf5_filters()
        with h5py.File(path, "r") as f:
            datasets, t_offset = dsec_columns(f, path, follow_links=follow_links)
            columns = {k: ds[()] for k, ds in datasets.items()}
            group = f["events"]
            attrs = {k: int(group.attrs[k]) for k in ("width", "height") if k in group.attrs}
    except LayoutError as e:
        raise EventFileError(path, f"refused: {e} (--follow-links reads it)") from None
    except (NotRegularFile, MissingPackage) as e:
        raise EventFileError(path, str(e)) from None
    except _DECODE_ERRORS as e:
        raise EventFileError(path, f"corrupt HDF5 file ({type(e).__name__}: {e})") from e
    for k in ("x", "y"):
        check_column(path, f"events/{k}", columns[k], 0, np.iinfo(EVENT_DTYPE[k]).max)
    check_column(path, "events/t + t_offset", columns["t"], -MAX_ABS_TIME_US, MAX_ABS_TIME_US, shift=t_offset)
    events = np.empty(columns["t"].size, dtype=EVENT_DTYPE)
    # t + t_offset in 64-bit modular arithmetic: exact, as every sum was checked to lie inside int64, whatever the
    # column's type and however large t_offset is on its own
    events["t"] = (columns["t"].astype(np.uint64) + np.uint64(t_offset % (1 << 64))).view(np.int64)
    events["x"] = columns["x"]
    events["y"] = columns["y"]
    events["p"] = columns["p"] > 0
    events = sort_by_time(events)
    if len(attrs) == 2:
        sensor = SensorSize(attrs["height"], attrs["width"])
        check_on_sensor(path, events, sensor, "the events group attributes")
        return EventFile(events, sensor)
    inferred = infer_sensor(events)
    fits = inferred.height <= DSEC_SENSOR.height and inferred.width <= DSEC_SENSOR.width
    return EventFile(events, DSEC_SENSOR if fits else inferred)


def dsec_columns(
    f: h5py.File, path: Path, *, follow_links: bool = False, also: tuple[str, ...] = ()
) -> tuple[dict[str, h5py.Dataset], int]:
    """The ``events/{x,y,t,p}`` datasets of an open DSEC file (keyed ``x``, ``y``, ``t``, ``p``, then each of
    ``also``, top-level datasets it must hold, such as ``ms_to_idx``) and its ``t_offset`` (0 without one), checked
    before any event is read: links, storage, chunks, declared sizes, shapes and types. ``EventFileError`` for a
    file of another layout, ``LayoutError`` for one that must not be read as stored."""
    group = member(f, "events", follow_links=follow_links)
    is_group = isinstance(group, h5py.Group)
    found = {k: member(group, k, follow_links=follow_links) for k in FIELDS} if is_group else {}
    found |= {k: member(f, k, follow_links=follow_links) for k in also}
    if not all(isinstance(found.get(k), h5py.Dataset) for k in (*FIELDS, *also)):
        top = sorted(f.keys())[:8]
        wanted = "events/{x,y,t,p}" + "".join(f" and {k}" for k in also)
        raise EventFileError(path, f"not a DSEC events file: no {wanted} datasets (top level: {top})")
    offset = member(f, "t_offset", follow_links=follow_links)
    _check_columns(path, {f"events/{k}": found[k] for k in FIELDS}, offset, follow_links, {k: found[k] for k in also})
    t_offset = 0 if offset is None else int(np.asarray(offset[()]).reshape(-1)[0])
    return found, t_offset


def _check_columns(
    path: Path,
    datasets: dict[str, h5py.Dataset],
    offset: h5py.Dataset | None,
    follow_links: bool,
    others: dict[str, h5py.Dataset] | None = None,
) -> None:
    """Shapes, types, layout and declared sizes of ``events/{x,y,t,p}`` and ``t_offset`` (layout and declared sizes
    of ``others`` too), before anything is read."""
    sizes = {k: ds.shape for k, ds in datasets.items()}
    if any(ds.ndim != 1 for ds in datasets.values()) or len({ds.size for ds in datasets.values()}) != 1:
        raise EventFileError(path, f"corrupt: events/x, y, t, p must be 1-D of equal length, got shapes {sizes}")
    if not all(np.issubdtype(ds.dtype, np.integer) for ds in datasets.values()):
        kinds = {k: str(ds.dtype) for k, ds in datasets.items()}
        raise EventFileError(path, f"events/x, y, t, p must be integers, got {kinds}")
    if offset is not None:
        if not isinstance(offset, h5py.Dataset) or offset.size != 1 or not np.issubdtype(offset.dtype, np.integer):
            raise EventFileError(path, f"corrupt: t_offset must be one integer, got {offset!r}")
        datasets = {**datasets, "t_offset": offset}
    check_datasets(datasets | (others or {}), path.stat().st_size, follow_links=follow_links)


def write_dsec(path: Path, events: np.ndarray, sensor: SensorSize) -> None:
    """Write ``events`` in the DSEC layout (Blosc/ZSTD), ``t_offset`` = the first timestamp.

    ``ValueError`` when the recording spans 2^32 us or more (``events/t`` is uint32, as in DSEC).
    """
    t = events["t"].astype(np.int64)
    t_offset = int(t[0]) if t.size else 0
    rel = t - t_offset
    if rel.size and rel[-1] >= 1 << 32:
        raise ValueError(f"DSEC .h5 holds relative times < 2^32 us, the events span {int(rel[-1])} us")
    n_ms = int(rel[-1]) // 1000 + 2 if rel.size else 1
    ms_to_idx = np.searchsorted(rel, np.arange(n_ms, dtype=np.int64) * 1000, side="left").astype(np.uint64)
    hdf5plugin = hdf5_filters()
    blosc = hdf5plugin.Blosc(cname="zstd", clevel=1, shuffle=hdf5plugin.Blosc.SHUFFLE)
    with h5py.File(path, "w") as f:
        group = f.create_group("events")
        chunks = (min(max(t.size, 1), 1 << 16),)
        for name, column in (("x", events["x"]), ("y", events["y"]), ("t", rel.astype(np.uint32)), ("p", events["p"])):
            # resizable (maxshape None) so an empty recording still gets a chunked, compressed dataset
            group.create_dataset(name, data=column, chunks=chunks, maxshape=(None,), **blosc)
        group.attrs["width"] = sensor.width
        group.attrs["height"] = sensor.height
        f.create_dataset("ms_to_idx", data=ms_to_idx)
        f.create_dataset("t_offset", data=np.int64(t_offset))
