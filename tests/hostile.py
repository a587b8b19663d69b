"""Builders of damaged and hostile event files, shared by the tests that name one refusal each (test_io,
test_io_hostile) and the harness that reads hundreds of them in a child (test_fuzz_files).

HDF5 columns are made by a ``Column``: ``make(group, name, dtype)`` creates dataset ``name`` in ``group``, plainly
(``plain``) or pointing outside the file, far larger than it stores, or holding values the event fields cannot.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from mem_core.events import SensorSize

DSEC_COLUMNS = {"x": "<u2", "y": "<u2", "t": "<u4", "p": "u1"}
N = 16  # events of a small hand-built file

Column = Callable[[h5py.Group, str, str], None]


def plain(group: h5py.Group, name: str, dtype: str) -> None:
    group.create_dataset(name, data=np.arange(N).astype(dtype))


def external(target: str | Path, count: int = N) -> Column:
    """``count`` values kept in the file ``target`` (HDF5 external storage)."""

    def make(group, name, dtype):
        group.create_dataset(name, (count,), dtype, external=[(str(target), 0, count * np.dtype(dtype).itemsize)])

    return make


def linked(link: h5py.SoftLink | h5py.ExternalLink) -> Column:
    """A soft or external link in the column's place."""
    return lambda group, name, dtype: group.__setitem__(name, link)


def virtual(source: str | Path, shape: tuple[int, ...] = (N,)) -> Column:
    """A virtual dataset mapped from the dataset of the same name in the file ``source`` (a FIFO, say)."""

    def make(group, name, dtype):
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[:] = h5py.VirtualSource(str(source), name, shape=shape)
        group.create_virtual_dataset(name, layout)

    return make


def soft_link(group: h5py.Group, name: str, dtype: str) -> None:
    """A soft link to ``/elsewhere``, which holds plain data (read only when links are followed)."""
    group.file.create_dataset("elsewhere", data=np.arange(N).astype(dtype))
    group[name] = h5py.SoftLink("/elsewhere")


def huge_chunks(group: h5py.Group, name: str, dtype: str) -> None:
    """16 values in one gzip chunk of 2^25 elements: a small file that decompresses 32 MiB to read any value."""
    group.create_dataset(name, data=np.arange(N).astype(dtype), chunks=(1 << 25,), maxshape=(None,), compression="gzip")


def holding(values: np.ndarray | list) -> Column:
    """Exactly ``values``, in their own dtype (whatever the column's usual one)."""
    return lambda group, name, dtype: group.create_dataset(name, data=np.asarray(values))


def filled(value: int, dtype: str) -> Column:
    """``N`` copies of ``value`` as ``dtype``."""
    return holding(np.full(N, value, dtype))


def write_dsec(path: Path, special: dict[str, Column] | None = None, t_offset: np.generic | None = None) -> Path:
    """A small DSEC layout (``events/x, y, t, p``); ``special[name]`` makes that column instead of ``plain``."""
    special = special or {}
    with h5py.File(path, "w") as f:
        group = f.create_group("events")
        for name, dtype in DSEC_COLUMNS.items():
            special.get(name, plain)(group, name, dtype)
        if t_offset is not None:
            f.create_dataset("t_offset", data=t_offset)
    return path


def dsec_declaring(path: Path, events: int) -> Path:
    """A DSEC layout whose columns declare ``events`` events and store none."""
    with h5py.File(path, "w") as f:
        for name, dtype in DSEC_COLUMNS.items():
            f.create_dataset(f"events/{name}", shape=(events,), maxshape=(None,), chunks=(1 << 14,), dtype=dtype)
    return path


def dsec_with_geometry(path: Path, width: int, height: int) -> Path:
    """The DSEC file ``path`` with its events group declaring a ``width`` x ``height`` sensor."""
    with h5py.File(path, "r+") as f:
        f["events"].attrs["width"] = width
        f["events"].attrs["height"] = height
    return path


def npz_declaring(npz: bytes, events: int) -> bytes:
    """An .npz of ``event_data`` whose array header declares ``events`` events (a valid archive: the CRC matches
    the new bytes)."""
    with zipfile.ZipFile(io.BytesIO(npz)) as archive:
        npy = archive.read("event_data.npy")
    shape = re.search(rb"'shape': \(\d+,\), } *", npy).group()
    new = f"'shape': ({events},), }}".encode()
    assert len(new) <= len(shape), "the header keeps its size and alignment"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("event_data.npy", npy.replace(shape, new.ljust(len(shape))))
    return out.getvalue()


def dat_with_geometry(dat: bytes, width: int, height: int) -> bytes:
    """A Prophesee .dat whose header declares a ``width`` x ``height`` sensor (added after its version line)."""
    without = re.sub(rb"% (Width|Height) \d+\n", b"", dat)
    assert b"% Version 2\n" in without
    return without.replace(b"% Version 2\n", f"% Version 2\n% Width {width}\n% Height {height}\n".encode(), 1)


def write_with_dv(path: Path, events: np.ndarray, sensor: SensorSize, compression: str = "LZ4", packets: int = 3):
    """``events`` written by dv-processing's ``MonoCameraWriter``, one packet per part."""
    import dv_processing as dv

    config = dv.io.MonoCameraWriter.EventOnlyConfig(
        "test", (sensor.width, sensor.height), getattr(dv.CompressionType, compression)
    )
    writer = dv.io.MonoCameraWriter(str(path), config)
    for part in np.array_split(events, packets):
        store = dv.EventStore()
        for t, x, y, p in part.tolist():
            store.push_back(t, x, y, bool(p))
        writer.writeEvents(store)
    del writer  # closing writes the data table
    return path
