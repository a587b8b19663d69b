"""The corpus format: a directory of HDF5 event shards plus a JSON manifest; what writers and readers share.

Layout of a corpus directory::

    manifest.json        format_version, provenance, shards, recordings (written atomically: tmp + os.replace),
                         journal: the generation N of the journal that goes with it
    journal-00000N.jsonl the commits since manifest.json was written, one JSON line each (absent: none yet)
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
  a corpus starts a new shard. Readers open a shard left open (``sealed: false`` in the manifest) with SWMR and
  few metadata retries, a sealed one without SWMR (``shard.py`` says why: damaged metadata made SWMR hang).
- Every chunk carries a Fletcher-32 checksum: a damaged chunk fails to read (a shard written without it reads unchecked).
- The manifest and its journal are the commit record. Events are buffered in memory, written to the shard when the
  buffer fills, and committed at least every ``flush_interval_s`` (checked inside ``append``) and on close: shard
  flush + fsync, then one line appended to the journal and fsynced: ``{"shards": [...], "recordings": [...],
  "removed": [names]}``, the entries that changed since the last commit (a recording entry replaces the one of its
  name, or comes last when new; ``removed`` goes first). A commit costs what changed, not the size of the corpus
  (1,200 labelled captures in a row: the last as quick as the first). Readers apply the journal's lines to
  ``manifest.json`` (``load_manifest``); a last line without its newline (being written, or torn by a crash) is
  not committed and left out, any other bad line is damage. The writer folds the journal into a new
  ``manifest.json`` (tmp + fsync + ``os.replace``) naming the next generation, then deletes the old journal: when
  it opens the corpus, when the journal outgrows the manifest (so reading it costs at most about as much again),
  and on close (a closed corpus is its manifest alone). A reader that finds its journal gone reads the newer
  manifest. Readers trust only the committed counts, so whatever reached a shard after the last commit is
  ignored; a recording in progress at the crash appears with ``complete=False`` and its committed events.
  Format version 1 (no journal) is read as well; a writer extending such a corpus makes it version 2.
- Full disk: free space is checked against ``min_free_bytes`` (and the shard size against ``ulimit -f``) before
  every shard write, raising ``CorpusFullError``. A write that fails anyway (ENOSPC, EDQUOT, EFBIG) raises
  ``CorpusFullError`` too. HDF5 must never be left with a write that keeps failing: a dataset whose close failed
  stays half-closed and HDF5 segfaults at exit (seen with a file-size limit). So the writer keeps a ballast file
  (``.reserve``: 16 MiB, 1/32 of the free space on a disk with less than 512 MiB free, at least 1 MiB) and deletes it
  on such a failure, giving the shard room to close cleanly.
- Any other failed write, fsync or look at the folder (EIO, the folder moved or deleted under the writer) stops the
  writer with a ``CorpusError`` naming the file: what it had not committed is dropped with it, what it had stays. A
  new writer on the folder (once it is back) goes on from the manifest on disk.
- One writer at a time: an ``flock`` on ``.writer.lock`` (released by the kernel if the writer dies).
- Recording names are unique, and so are the segments of a session: a manifest listing one twice is refused.

Readers open HDF5 files lazily, per process (a handle opened before a fork is never used after it), so a
``Corpus`` can be handed to torch DataLoader workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mem_core.errors import MemError
from mem_core.events import SensorSize, sensor_problem
from mem_core.files import open_regular, os_problem
from mem_core.limits import is_int as _is_int

FORMAT_VERSION = 2  # 2: the manifest names its journal; a version 1 corpus (no journal) is read as well
READ_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
JOURNAL = "journal-{:06d}.jsonl"  # the journal of manifest generation N (the manifest's "journal": N)
JOURNAL_NAME = re.compile(r"journal-\d{6,}\.jsonl")
_MANIFEST_READS = 8  # a manifest rewritten (folded) under a reader this often in a row is not settling
COLUMNS = ("t", "x", "y", "p")
CHUNK_EVENTS = 1 << 14  # events per HDF5 chunk; also the stride of the coarse time index
SHARD_NAME = re.compile(r"shard-\d{5,}\.h5")
MAX_SHARD_EVENTS = 1 << 40  # a manifest count beyond this is damage (a full shard holds 2^26 by default)


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


@dataclass(frozen=True)
class ShardInfo:
    """One shard file as the manifest lists it: its committed events and whether its writer closed it."""

    file: str
    events: int
    sealed: bool


def load_manifest(root: Path) -> dict[str, Any]:
    """The committed manifest: ``manifest.json`` with its journal applied, the top level checked (``parse_manifest``
    checks the entries)."""
    path = root / MANIFEST
    for _ in range(_MANIFEST_READS):
        manifest = _read_manifest(path)
        generation = manifest.get("journal")
        if generation is None:
            return manifest
        journal = root / JOURNAL.format(generation)
        try:
            with open_regular(journal) as f:  # a FIFO in its place would block the open
                data = f.read()
        except FileNotFoundError:  # no commit since the manifest was written, or folded into a newer one just now
            if _read_manifest(path).get("journal") != generation:
                continue
            return manifest
        except OSError as e:
            raise CorpusError(f"{journal}: corrupt corpus journal ({os_problem(e)})") from None
        return apply_journal(manifest, data, str(journal))
    raise CorpusError(f"{path}: rewritten {_MANIFEST_READS} times while being read; is a writer stuck in a loop?")


def _read_manifest(path: Path) -> dict[str, Any]:
    """``manifest.json`` as JSON, its top level checked."""
    try:
        with open_regular(path) as f:  # a FIFO in its place would block the open
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise CorpusError(f"{path}: no corpus manifest (not a corpus directory?)") from None
    except OSError as e:
        raise CorpusError(f"{path}: corrupt corpus manifest ({os_problem(e)})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CorpusError(f"{path}: corrupt corpus manifest ({e})") from e
    if not isinstance(manifest, dict) or not {"format_version", "recordings", "shards"} <= manifest.keys():
        raise CorpusError(f"{path}: not a corpus manifest (missing format_version/recordings/shards)")
    if manifest["format_version"] not in READ_VERSIONS or isinstance(manifest["format_version"], bool):
        raise CorpusError(f"{path}: format_version {manifest['format_version']!r}, this code reads {READ_VERSIONS}")
    for key in ("recordings", "shards", "provenance"):
        if not isinstance(manifest.get(key, []), list):
            raise CorpusError(f"{path}: corrupt corpus manifest ({key} must be a list)")
    generation = manifest.get("journal")
    if generation is not None and not (_is_int(generation) and 0 <= generation <= MAX_SHARD_EVENTS):
        raise CorpusError(f"{path}: corrupt corpus manifest (journal {generation!r:.40} is no generation number)")
    return manifest


def apply_journal(manifest: dict[str, Any], data: bytes, where: str) -> dict[str, Any]:
    """``manifest`` with the changes of a journal's lines (``data``) applied in order. A last line without its
    newline is one being written, or torn by a crash: it is not committed and left out; any other line that is not a
    change is damage."""
    lines = data.split(b"\n")[:-1]
    if not lines:
        return manifest
    shards = {_key(e, "file", f"{where}: shard entry {k}"): e for k, e in enumerate(manifest["shards"])}
    recordings: dict[str, Any] = {}
    for k, entry in enumerate(manifest["recordings"]):
        name = _key(entry, "name", f"{where}: recording entry {k}")
        _require(name not in recordings, f"{where}: recording entry {k}", f"name {name!r} is listed twice")
        recordings[name] = entry
    for n, line in enumerate(lines, 1):
        at = f"{where}: line {n}"
        try:
            change = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise CorpusError(f"{at} is malformed: not JSON ({e})") from None
        _require(isinstance(change, dict), at, "not an object")
        for key in ("shards", "recordings", "removed"):
            _require(isinstance(change.get(key, []), list), at, f"{key} must be a list")
        for entry in change.get("shards", []):
            shards[_key(entry, "file", at)] = entry
        for name in change.get("removed", []):
            _require(isinstance(name, str), at, f"removed {name!r:.60} is no recording name")
            recordings.pop(name, None)
        for entry in change.get("recordings", []):  # a new name goes last, a known one stays where it is
            recordings[_key(entry, "name", at)] = entry
    return {**manifest, "shards": list(shards.values()), "recordings": list(recordings.values())}


def _key(entry: Any, key: str, where: str) -> str:
    """The ``key`` (a string) of a manifest entry, which the journal's changes refer to it by."""
    _require(isinstance(entry, dict) and isinstance(entry.get(key), str), where, f"an entry without a {key}")
    return entry[key]


def write_manifest(root: Path, manifest: dict[str, Any]) -> int:
    """Make ``manifest`` ``root``'s manifest, atomically and durably: tmp + fsync + ``os.replace`` + fsync of the
    folder; returns its size in bytes. An ``OSError`` leaves the previous manifest in place."""
    path = root / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    data = json.dumps(manifest, indent=1).encode()
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(root)  # make the rename itself durable
    except OSError:
        with contextlib.suppress(OSError):  # (the folder may be gone)
            tmp.unlink(missing_ok=True)
        raise
    return len(data)


def fsync_path(path: Path) -> None:
    """fsync a file or a folder by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_manifest(manifest: dict[str, Any], where: str) -> tuple[dict[str, ShardInfo], list[RecordingInfo]]:
    """The shards and recordings of a loaded manifest, every value checked (types, ranges, recordings inside the
    events their shard committed) before anything is sized from it."""
    shards: dict[str, ShardInfo] = {}
    for k, entry in enumerate(manifest["shards"]):
        shard = _shard_info(entry, f"{where}: shard entry {k}")
        shards[shard.file] = shard
    recordings = [
        recording_info(e, f"{where}: recording entry {k}", shards) for k, e in enumerate(manifest["recordings"])
    ]
    # one entry per name and per segment of a session: a hand-edited copy would be read and replayed as one
    first: dict[Any, int] = {}
    for k, r in enumerate(recordings):
        keys = [(r.name, f"name {r.name!r}")]
        if r.session:
            keys.append(((r.session, r.segment), f"segment {r.segment} of session {r.session!r}"))
        for key, what in keys:
            j = first.setdefault(key, k)
            _require(j == k, f"{where}: recording entry {k}", f"{what} is entry {j}'s too (each must be unique)")
    return shards, recordings


def _shard_info(entry: Any, where: str) -> ShardInfo:
    _require(isinstance(entry, dict), where, "not an object")
    file, events, sealed = entry.get("file"), entry.get("events"), entry.get("sealed", False)
    _require(isinstance(file, str) and SHARD_NAME.fullmatch(file) is not None, where, f"file {file!r} is no shard name")
    _require(_is_int(events) and 0 <= events <= MAX_SHARD_EVENTS, where, f"events {events!r} not in 0..2^40")
    _require(isinstance(sealed, bool), where, f"sealed {sealed!r} is not true/false")
    return ShardInfo(file, events, sealed)


def recording_info(entry: Any, where: str, shards: dict[str, ShardInfo]) -> RecordingInfo:
    """One recording entry, checked, down to its lying inside the events its shard committed."""
    _require(isinstance(entry, dict), where, "not an object")
    missing = [f.name for f in fields(RecordingInfo) if f.name not in entry]
    _require(not missing, where, f"missing {', '.join(missing)}")
    e = entry
    sensor = e["sensor"]
    _require(isinstance(sensor, list) and len(sensor) == 2 and all(map(_is_int, sensor)), where, "bad sensor")
    problem = sensor_problem(SensorSize(*sensor))
    _require(problem is None, where, str(problem))
    _require(isinstance(e["name"], str) and e["name"] != "", where, f"name {e['name']!r}")
    _require(isinstance(e["session"], str), where, f"session {e['session']!r}")
    for key in ("n_events", "offset", "segment"):
        _require(_is_int(e[key]) and 0 <= e[key] <= MAX_SHARD_EVENTS, where, f"{key} {e[key]!r} not in 0..2^40")
    times = (e["t_min"], e["t_max"])
    if e["n_events"]:
        _require(all(map(_is_int, times)) and times[0] <= times[1], where, f"t_min/t_max {times!r}")
    else:
        _require(all(t is None or _is_int(t) for t in times), where, f"t_min/t_max {times!r}")
    _require(e["label"] is None or isinstance(e["label"], str) or _is_int(e["label"]), where, f"label {e['label']!r}")
    _require(isinstance(e["metadata"], dict), where, "metadata is not an object")
    _require(isinstance(e["complete"], bool), where, f"complete {e['complete']!r}")
    _require(isinstance(e["shard"], str), where, f"shard {e['shard']!r}")  # (a list is no dict key)
    shard = shards.get(e["shard"])
    _require(shard is not None, where, f"shard {e['shard']!r} is not listed in the manifest's shards")
    end = e["offset"] + e["n_events"]
    _require(end <= shard.events, where, f"events {e['offset']}..{end} beyond the {shard.events} of {shard.file}")
    return RecordingInfo(**{**{f.name: e[f.name] for f in fields(RecordingInfo)}, "sensor": SensorSize(*sensor)})


MIN_PER_CLASS = 2  # recordings of each class a labelled corpus needs to train a classifier: one is held out


def labels_problem(counts: dict[str, int], classes: Iterable[str] = ()) -> str | None:
    """Why a labelled corpus with ``counts`` recordings per class cannot train a classifier of its classes and of
    ``classes`` (what to capture still), or None."""
    if len(counts) < 2:
        have = f"only {', '.join(counts)}" if counts else "none"
        return f"training needs captures of at least 2 classes, have {have}"
    wanted = sorted({*counts, *classes})
    few = ", ".join(f"{name} has {counts.get(name, 0)}" for name in wanted if counts.get(name, 0) < MIN_PER_CLASS)
    if few:
        return f"training needs at least {MIN_PER_CLASS} captures of every class (one is held out): {few}"
    return None


def _require(ok: bool, where: str, problem: str) -> None:
    if not ok:
        raise CorpusError(f"{where} is malformed: {problem}")
