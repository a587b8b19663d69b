"""Choosing a reader for a file (content first, extension second), reading, describing and writing."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mem_core.events import SensorSize, sensor_problem, time_problem, validate_events
from mem_core.files import open_regular, os_problem
from mem_core.io import aedat4, evz, hdf5, nbin, npz, prophesee
from mem_core.io.base import EventFile, EventFileError

SNIFF_BYTES = 8192

Sniff = Callable[[Path, bytes], bool]
Read = Callable[[Path], EventFile]


class Reader(NamedTuple):
    """A registered format: ``sniff(path, first_bytes)`` claims a file by content, ``extensions`` by name;
    ``read_linked`` (formats that can point outside the file) reads what the file points to elsewhere as well."""

    name: str
    sniff: Sniff | None
    read: Read
    extensions: tuple[str, ...]
    read_linked: Read | None = None


_READERS: list[Reader] = []


def register_reader(
    name: str, sniff: Sniff | None, read: Read, extensions: tuple[str, ...] = (), read_linked: Read | None = None
) -> None:
    """Add a format to ``read_events``; later registrations are consulted first (a plug-in can claim files).

    ``sniff(path, head)`` gets the first bytes of a file (``b""`` for a directory, so a directory-based store
    can claim its folder) and must not raise. ``read(path)`` returns an ``EventFile`` and raises
    ``EventFileError`` for anything it cannot decode. ``extensions`` (lower case, with the dot) are a fallback
    for files no sniffer claims. ``read_linked``, for a format whose files can point to data elsewhere, reads
    that data too: ``read_events(..., follow_links=True)`` uses it. Registering an existing name replaces it.
    """
    _READERS[:] = [r for r in _READERS if r.name != name]
    _READERS.insert(0, Reader(name, sniff, read, tuple(e.lower() for e in extensions), read_linked))


def formats() -> list[str]:
    """Names of the registered formats, in the order they are consulted."""
    return [r.name for r in _READERS]


def extensions() -> set[str]:
    """The file extensions (lower case, with the dot) of the registered formats."""
    return {e for r in _READERS for e in r.extensions}


def _head(path: Path) -> bytes:
    """The first bytes of a regular file, ``b""`` for a directory (a store a plug-in may claim)."""
    if os.path.isdir(path):  # never raises (an over-long name is refused when the file is opened)
        return b""
    try:
        with open_regular(path) as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise EventFileError(path, os_problem(e)) from None
    if not head:
        raise EventFileError(path, "empty file (0 bytes)")
    return head


def _reader(path: Path) -> Reader:
    head = _head(path)
    for reader in _READERS:
        if reader.sniff is not None and reader.sniff(path, head):
            return reader
    suffix = path.suffix.lower()
    for reader in _READERS:
        if suffix in reader.extensions:
            return reader
    if path.is_dir():
        raise EventFileError(path, "a directory, not an event file")
    raise EventFileError(path, f"unknown event file format (extension {suffix or 'none'!r}, starts with {head[:12]!r})")


def detect_format(path: str | os.PathLike) -> str:
    """The name of the format ``read_events`` would use for ``path`` (``EventFileError`` if none)."""
    return _reader(Path(path)).name


def read_events(path: str | os.PathLike, *, follow_links: bool = False) -> EventFile:
    """Read a whole event file: ``(events, sensor)`` with ``EVENT_DTYPE`` events sorted by ``t``.

    Formats: N-MNIST / N-Caltech101 ``.bin``/``.bs2``, Prophesee ``.dat``, EVT 2.0 / 3.0 ``.raw``, AEDAT4,
    N-ImageNet ``.npz``, DSEC ``.h5``, MEM's packed ``.evz`` and any registered with ``register_reader``. Every failure (missing,
    empty, truncated, corrupt, unknown) raises ``EventFileError`` naming the path and the reason. A file that
    points to data outside itself (HDF5 external storage, soft or external links, virtual datasets) is refused
    unless ``follow_links``: it could name any file on the machine, a device or a FIFO.
    """
    path = Path(path)
    return _read_checked(_reader(path), path, follow_links)


def _read_checked(reader: Reader, path: Path, follow_links: bool) -> EventFile:
    """``reader.read(path)`` with the checks every format shares: a plausible sensor and time range, memory that ran
    out."""
    read = reader.read_linked if follow_links and reader.read_linked is not None else reader.read
    try:
        decoded = read(path)
    except MemoryError as e:  # a reader sizes its arrays from the file: a damaged one can ask for too much
        raise EventFileError(
            path, f"decoding needs more memory than this process may use ({e or 'MemoryError'})"
        ) from e
    events = decoded.events
    unknown = events.size == 0 and decoded.sensor == (0, 0)  # an empty file of a format without geometry
    if not unknown and (problem := sensor_problem(decoded.sensor)) is not None:
        raise EventFileError(path, f"corrupt: {problem}")
    if events.size and (problem := time_problem(int(events["t"].min()), int(events["t"].max()))) is not None:
        raise EventFileError(path, f"corrupt: {problem}")
    return decoded


def describe(path: str | os.PathLike, *, follow_links: bool = False) -> dict[str, Any]:
    """Summary for ``mem inspect``: format, events, height, width, t_min, t_max, on, off (JSON-ready).

    ``t_min``/``t_max`` (us) are ``None`` for a file without events; ``follow_links`` as for ``read_events``.
    """
    path = Path(path)
    reader = _reader(path)
    events, sensor = _read_checked(reader, path, follow_links)
    on = int(np.count_nonzero(events["p"]))
    empty = events.size == 0
    return {
        "format": reader.name,
        "events": int(events.size),
        "height": int(sensor.height),
        "width": int(sensor.width),
        "t_min": None if empty else int(events["t"][0]),
        "t_max": None if empty else int(events["t"][-1]),
        "on": on,
        "off": int(events.size) - on,
    }


_WRITERS: dict[str, Callable[[Path, np.ndarray, SensorSize], None]] = {
    ".bin": nbin.write_bin,
    ".bs2": nbin.write_bin,
    ".dat": prophesee.write_dat,
    ".npz": npz.write_npz,
    ".h5": hdf5.write_dsec,
    ".hdf5": hdf5.write_dsec,
    evz.EXTENSION: evz.write_evz,
}


def write_events(path: str | os.PathLike, events: np.ndarray, sensor: SensorSize) -> Path:
    """Write ``events`` recorded on ``sensor``; the format follows the extension (.bin/.bs2, .dat, .npz, .h5, .evz).

    The file appears atomically (written beside it, then renamed). ``ValueError`` for an unknown extension,
    events that are not valid ``EVENT_DTYPE`` events on ``sensor``, or values the format cannot hold.
    """
    path = Path(path)
    writer = _WRITERS.get(path.suffix.lower())
    if writer is None:
        raise ValueError(f"{path}: cannot write {path.suffix or 'extension-less'!r} files (use {sorted(_WRITERS)})")
    validate_events(events, sensor)
    partial = path.with_name(f".{path.name}.partial")
    try:
        writer(partial, events, sensor)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _has_magic(magic: bytes) -> Sniff:
    return lambda path, head: head.startswith(magic)


@functools.lru_cache(maxsize=4)
def _prophesee_encoding(head: bytes) -> str | None:
    """``None`` without a ``%`` header, else the ``.raw`` encoding it names (``""`` for none: a ``.dat``)."""
    if not head.startswith(b"%"):
        return None
    header, end = prophesee.parse_header(head)
    return (prophesee.raw_encoding(header) or "") if end else None


def _prophesee(kind: str) -> Sniff:
    def sniff(path: Path, head: bytes) -> bool:
        encoding = _prophesee_encoding(head)
        if kind == "dat":
            return encoding == "" and path.suffix.lower() != ".raw"
        return encoding == kind

    return sniff


# Built-ins, registered so that the most specific content checks come first.
for _name, _sniff, _read, _ext, _linked in (
    ("bin", None, nbin.read_bin, nbin.EXTENSIONS, None),
    ("dat", _prophesee("dat"), prophesee.read_dat, (".dat",), None),
    ("evt2", _prophesee("evt2"), prophesee.read_raw, (), None),
    # .raw files whose header names no supported encoding reach read_raw by extension, which says why it fails
    ("evt3", _prophesee("evt3"), prophesee.read_raw, (".raw",), None),
    ("npz", _has_magic(b"PK"), npz.read_npz, (".npz",), None),
    (
        "dsec-h5",
        _has_magic(b"\x89HDF\r\n\x1a\n"),
        hdf5.read_dsec,
        (".h5", ".hdf5"),
        functools.partial(hdf5.read_dsec, follow_links=True),
    ),
    ("aedat4", _has_magic(b"#!AER-DAT4"), aedat4.read_aedat4, (".aedat4",), None),
    ("evz", _has_magic(evz.MAGIC), evz.read_evz, (evz.EXTENSION,), None),
):
    register_reader(_name, _sniff, _read, _ext, _linked)
