"""Opening a corpus shard for reading: a bounded wait on damaged metadata, every HDF5 error a ``CorpusError``.

HDF5 opened with SWMR retries a metadata block whose checksum fails, sleeping twice as long before each attempt,
100 times by default: a few flipped bits in a shard kept every reader waiting for hours. So a shard its writer
sealed (closed) is opened without SWMR, where a bad checksum fails at once; a shard left open (a recording in
progress, or a writer that died) needs SWMR (its superblock is still marked "open for write") and is opened with
``SWMR_READ_ATTEMPTS`` attempts, about 20 ms of waiting on a damaged block. h5py does not expose the setting, so
it is set through the HDF5 library h5py itself loaded; where that library cannot be found the HDF5 default stays.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import h5py
import numpy as np
from h5py import h5f, h5p

from mem_core.corpus.format import COLUMNS, CorpusError
from mem_core.events import EVENT_DTYPE
from mem_core.files import check_regular, os_problem
from mem_core.io.hdf5 import LayoutError, check_datasets, hdf5_filters, member

SWMR_READ_ATTEMPTS = 24
# What h5py raises for a damaged file, object header or chunk.
H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)
DATASETS = (*COLUMNS, "t_index")


def open_shard(path: Path, *, sealed: bool) -> tuple[h5py.File, dict[str, h5py.Dataset]]:
    """The open shard and its datasets (``t, x, y, p, t_index``), their types and declared sizes checked.

    ``sealed``: the manifest says the writer closed the shard (then it is opened without SWMR).
    """
    try:
        check_regular(path)  # h5py opens the file by name
    except FileNotFoundError:
        raise CorpusError(f"{path}: shard listed in the manifest is missing") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot open shard ({os_problem(e)})") from None
    hdf5_filters()  # the Blosc filter the shards use
    try:
        f = h5py.File(path, "r") if sealed else _open_swmr(path)
    except H5_ERRORS as e:
        raise CorpusError(f"{path}: cannot open shard ({e})") from e
    try:
        return f, _datasets(path, f)
    except LayoutError as e:
        f.close()
        raise CorpusError(f"{path}: refused shard ({e})") from None
    except H5_ERRORS as e:
        f.close()
        raise CorpusError(f"{path}: damaged shard ({type(e).__name__}: {e})") from e
    except CorpusError:
        f.close()
        raise


def _datasets(path: Path, f: h5py.File) -> dict[str, h5py.Dataset]:
    found = {name: member(f, name) for name in DATASETS}  # a link out of the shard is refused, never followed
    missing = [name for name, ds in found.items() if ds is None]
    if missing or "index_stride" not in f.attrs:
        raise CorpusError(f"{path}: not a corpus shard (missing {', '.join(missing) or 'index_stride'})")
    for name, ds in found.items():
        if not isinstance(ds, h5py.Dataset):
            raise CorpusError(f"{path}: not a corpus shard ({name} is not a dataset)")
        expected = EVENT_DTYPE[name] if name in COLUMNS else np.dtype("<i8")
        if ds.ndim != 1 or ds.dtype != expected:
            raise CorpusError(f"{path}: damaged shard ({name} is {ds.dtype} {ds.shape}, expected 1-D {expected})")
    stride = f.attrs["index_stride"]
    if not isinstance(stride, np.integer | int) or stride < 1:
        raise CorpusError(f"{path}: damaged shard (index_stride {stride!r} is not a positive integer)")
    check_datasets(found, path.stat().st_size)
    return found


def _open_swmr(path: Path) -> h5py.File:
    fapl = h5p.create(h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5f.LIBVER_EARLIEST, h5f.LIBVER_LATEST)
    set_attempts = _set_metadata_read_attempts()
    if set_attempts is not None:
        set_attempts(fapl.id, SWMR_READ_ATTEMPTS)
    return h5py.File(h5f.open(os.fsencode(path), h5f.ACC_RDONLY | h5f.ACC_SWMR_READ, fapl=fapl))


@functools.cache
def _set_metadata_read_attempts():
    """``H5Pset_metadata_read_attempts`` of the HDF5 library loaded in this process (by h5py), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "libhdf5" in line}
    except OSError:
        return None
    for lib in sorted(paths):
        if "libhdf5_hl" in lib or not os.path.isfile(lib):
            continue
        try:
            function = ctypes.CDLL(lib).H5Pset_metadata_read_attempts  # the loaded copy: dlopen returns its handle
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
        return function
    return None
