"""``mem ingest``: turn event files (or a dataset's layout, with its labels, or another corpus) into a pretraining
corpus.

Reader processes (``workers``) decode files; this process is the single corpus writer and appends each file as one
recording, in a fixed order. A bad file (truncated, garbage, empty, unknown format) never stops the run: it is
listed with its reason in the returned report and in ``ingest-report-<UTC time>.json`` inside the corpus. A full
disk does stop it (everything committed stays). ``IngestReport.failure`` says when the run as a whole failed: an
input path that gave nothing to ingest (missing, no event files, not the dataset's layout), no file that could be
read at all, or a stop. Re-running skips files already ingested, recognised by the source
path, size and mtime kept in each recording's metadata.

A corpus given as an input (a folder with a manifest, such as ``mem record`` or ``mem serve`` writes) gives one item
per recording (each segment of a long session): its events, sensor, label and metadata are kept, its name becomes
``<corpus folder>:<name>`` (``/`` of a segment's name as ``:``), and re-running recognises it by corpus and name.
"""

from __future__ import annotations

import functools
import itertools
import json
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from mem_core.corpus import MANIFEST, Corpus, CorpusError, CorpusFullError, CorpusWriter, prepare_corpus_dir
from mem_core.events import SensorSize
from mem_core.io import EventFileError, read_events
from recorders.base import RecorderError
from recorders.config import IngestConfig
from recorders.inventory import EVENT_SUFFIXES, found_files

SPLITS = ("train", "val", "test")
_IN_FLIGHT_PER_WORKER = 4  # decoded files waiting for the writer, per worker (bounds memory)


@dataclass(frozen=True)
class IngestItem:
    """One file to ingest, the recording name it gets, and its label (class name) if the dataset has one."""

    path: Path
    name: str
    label: str | None = None
    split: str | None = None
    sensor: SensorSize | None = None  # the dataset's sensor: events off it are dropped (as training does)
    recording: int | None = None  # a recording of the corpus at ``path`` (an input corpus), else None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)  # kept from an input corpus's recording
    source_key: tuple[str, int, int] | None = None  # an input corpus's recording: (corpus::name, events, 0)


@dataclass
class IngestReport:
    """What happened to every file found: ingested, skipped (already in the corpus), left out (not in the layout of
    the ``--dataset``, or one file that two class folders claim) or failed (with the reason: a path named as an event
    file that is none, a link to nowhere or a FIFO, fails too)."""

    corpus: str
    started_utc: str
    dataset: str | None
    ingested: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[dict[str, Any]] = field(default_factory=list)  # event files under a --dataset root it does not take
    files: int = 0  # files (and input corpora's recordings) found: ingested + skipped + left out + failed of them
    events: int = 0
    seconds: float = 0.0
    stopped: str | None = None  # why the run ended early (disk full), else None
    unusable_inputs: list[str] = field(default_factory=list)  # input paths that gave nothing to ingest (in failed)
    report_path: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failed and self.stopped is None

    def failure(self) -> str | None:
        """Why the run as a whole failed, in one line, or None (a run with some bad files among good ones is no
        failure: its bad files are listed in ``failed``)."""
        if self.stopped is not None:
            return f"ingest stopped early: {self.stopped}"
        if self.unusable_inputs:
            first = next(e for e in self.failed if e["path"] == self.unusable_inputs[0])
            more = f" (and {len(self.unusable_inputs) - 1} more inputs)" if len(self.unusable_inputs) > 1 else ""
            return f"{first['path']}: {first['reason']}{more}"
        if self.failed and not self.ingested and not self.skipped:
            return f"none of the {len(self.failed)} files could be ingested (first: {self.failed[0]['path']})"
        return None


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def _name_for(path: Path, root: Path) -> str:
    """``<root folder>:<path relative to it, ':' for '/'>`` (corpus names cannot hold '/')."""
    return ":".join((root.name or "root", *path.relative_to(root).parts))


@dataclass
class Collected:
    """What ``collect`` found: the ``items`` to ingest, in a fixed order; the input paths that failed outright
    (``failed_inputs``, with the reason); the paths found under them named as event files that are none
    (``unreadable``: a link to nowhere, a FIFO); the event files under a ``--dataset`` root that it does not take
    (``left_out``); each with its reason."""

    items: list[IngestItem] = field(default_factory=list)
    failed_inputs: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[dict[str, Any]] = field(default_factory=list)


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` (links followed; a link loop is where it is) lies inside ``folder`` (a resolved path)."""
    return folder in Path(os.path.realpath(path)).parents


def collect(config: IngestConfig) -> Collected:
    """Every path to ingest, or that could not be or is left out, with its reason (``Collected``).

    Raises ``RecorderError`` for an unknown dataset name (a usage error, not a bad file).
    """
    found = Collected()
    items, failed, left_out = found.items, found.failed_inputs, found.left_out
    out = config.out.resolve()
    if config.dataset is not None:
        from mem_core.datasets import dataset_names

        if config.dataset not in dataset_names():
            raise RecorderError(f"unknown dataset {config.dataset!r}; known: {', '.join(dataset_names())}")
    for root in config.paths:
        try:
            root.stat()
        except OSError as e:  # missing, a name too long, a folder on the way that is not one
            failed.append({"path": str(root), "reason": (e.strerror or str(e)).lower()})
            continue
        if config.dataset is not None:
            try:
                taken, broken = _dataset_items(config.dataset, root)
            except RecorderError as e:
                failed.append({"path": str(root), "reason": str(e)})
                continue
            taken, claimed = _one_class_per_file(taken)
            items += taken
            left_out += claimed
            accounted = {os.path.normpath(path) for path in [*(i.path for i in taken), *(e["path"] for e in claimed)]}
            _not_taken(root, accounted, config, broken, found)
        elif root.is_file():
            items.append(IngestItem(root, root.name))
        elif not root.is_dir():  # a FIFO would block its reader, a device never end
            failed.append({"path": str(root), "reason": "not a regular file or a folder"})
        elif (root / MANIFEST).exists():
            try:
                items += _corpus_items(root, out)
            except (RecorderError, CorpusError) as e:
                failed.append({"path": str(root), "reason": str(e).removeprefix(f"{root}: ")})
        else:
            files, others = found_files(root)
            files = [IngestItem(path, _name_for(path, root)) for path in files if not _inside(path, out)]
            others = [e for e in others if not _inside(Path(e["path"]), out)]
            if not files and not others:
                failed.append({"path": str(root), "reason": f"no event files ({', '.join(EVENT_SUFFIXES)}) in it"})
            items += files
            found.unreadable += others
    return found


def _corpus_items(root: Path, out: Path) -> list[IngestItem]:
    """One item per recording of the corpus at ``root``, with its label and metadata."""
    if root.resolve() == out:
        raise RecorderError("is the output corpus: ingest it into another folder")
    recordings = Corpus(root).recordings
    if not recordings:
        raise RecorderError("the corpus holds no recordings")
    base, where = root.resolve().name or "root", str(root.resolve())
    return [
        IngestItem(
            root,
            f"{base}:{r.name.replace('/', ':')}",
            label=None if r.label is None else str(r.label),
            split=r.metadata.get("split"),
            sensor=r.sensor,
            recording=i,
            metadata=dict(r.metadata),
            source_key=(f"{where}::{r.name}", r.n_events, 0),
        )
        for i, r in enumerate(recordings)
        if r.n_events > 0
    ]


def _dataset_items(dataset: str, root: Path) -> tuple[list[IngestItem], dict[Path, str]]:
    """Every file of every split of ``dataset`` under ``root`` as the dataset ships them (nothing held out for
    validation: training carves its splits from the corpus), labelled with its class name and shipped split; and
    the folders of a split the dataset refused (one without a class folder), with why."""
    from mem_core.datasets import DatasetError, FileSource, open_shipped

    items, seen, problems, broken = [], set(), [], {}
    for split in SPLITS:
        try:
            source = open_shipped(dataset, root, split)
        except DatasetError as e:
            problems.append((split, str(e).removeprefix(f"{root}: ")))
            if e.folder is not None:
                broken[Path(e.folder)] = str(e)
            continue
        if not isinstance(source, FileSource):
            raise RecorderError(f"dataset {dataset!r} is not stored one sample per file; ingest reads files only")
        for path, label in zip(source.files, source.labels.tolist(), strict=True):
            if path not in seen:
                seen.add(path)
                cls = source.classes[label] if label >= 0 else None
                items.append(IngestItem(path, _name_for(path, root), cls, split, source.sensor))
    if not items:
        reasons = {reason for _, reason in problems}
        if len(reasons) == 1:  # the same for every split: said once
            raise RecorderError(reasons.pop())
        raise RecorderError(f"no {dataset} samples ({'; '.join(f'{split}: {reason}' for split, reason in problems)})")
    return items, broken


def _one_class_per_file(items: list[IngestItem]) -> tuple[list[IngestItem], list[dict[str, Any]]]:
    """``items`` but the links that make one file a sample of two classes (a link in ``background/`` to a file of
    ``cars/``), which are left out with the reason: the file is the sample of the class folder it lies in; when it
    lies in none (links from two class folders to a file elsewhere), every link to it is left out."""
    classes: dict[str, set[str | None]] = {}
    for item in items:
        classes.setdefault(os.path.realpath(item.path), set()).add(item.label)
    kept, left_out = [], []
    for item in items:
        target = os.path.realpath(item.path)
        if len(classes[target]) == 1 or target == os.path.join(os.path.realpath(item.path.parent), item.path.name):
            kept.append(item)
            continue
        others = " and ".join(f"{c}/" for c in sorted(map(str, classes[target] - {item.label})))
        reason = f"a link to {target}, which {others} holds too: one file cannot be a sample of two classes"
        left_out.append({"path": str(item.path), "reason": reason})
    return kept, left_out


def _not_taken(
    root: Path, accounted: set[str], config: IngestConfig, broken: dict[Path, str], found: Collected
) -> None:
    """Account in ``found`` for the paths under the ``--dataset`` root ``root`` not yet ``accounted`` for (the output
    corpus aside): stray event files beside the dataset's layout or in a split folder the dataset refused (left out,
    with why), and paths named as event files that are none (unreadable)."""
    files, others = found_files(root)
    out = config.out.resolve()
    for path in files:
        if os.path.normpath(path) not in accounted and not _inside(path, out):
            why = next((reason for folder, reason in broken.items() if folder in path.parents), "outside its layout")
            found.left_out.append({"path": str(path), "reason": f"not a {config.dataset} sample ({why})"})
    found.unreadable += [e for e in others if not _inside(Path(e["path"]), out)]


def read_item(item: IngestItem, follow_links: bool = False) -> tuple[np.ndarray, SensorSize] | str:
    """Decode one item (in a worker): a file (``read_file``) or a recording of an input corpus."""
    if item.recording is None:
        return read_file(item.path, item.sensor, follow_links)
    try:
        return _input_corpus(item.path).events(item.recording), item.sensor
    except CorpusError as e:
        return str(e)
    except Exception as e:  # as for a file: reported with the recording, never a stop
        return f"{type(e).__name__}: {e}"


@functools.lru_cache(maxsize=4)
def _input_corpus(path: Path) -> Corpus:
    """An input corpus opened once per process (its manifest parsed once, not once per recording)."""
    return Corpus(path)


def read_file(
    path: Path, sensor: SensorSize | None = None, follow_links: bool = False
) -> tuple[np.ndarray, SensorSize] | str:
    """Decode one file (in a worker): the events and sensor, or the reason it cannot be read.

    With ``sensor`` (a dataset's), events outside it are dropped and the recording gets that sensor;
    ``follow_links`` as for ``mem_core.io.read_events``.
    """
    try:
        events, file_sensor = read_events(path, follow_links=follow_links)
    except EventFileError as e:
        return e.reason
    # A reader bug on a strange file must not stop a long ingest either: report it with the file instead.
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    if sensor is None:
        sensor = file_sensor
    else:
        inside = (events["x"] < sensor.width) & (events["y"] < sensor.height)
        if not inside.all():
            events = events[inside]
    if events.size == 0:
        return "holds no events"
    return events, sensor


class _Decoder:
    """``(item, read_file(...))`` for each item, in order; with ``workers`` > 0 decoded ahead in that many worker
    processes.

    Workers are forked on entry, before this process opens the corpus or starts a progress thread, so they inherit
    the imported modules (no second start-up of numba/h5py) and nothing else of interest.
    """

    def __init__(self, items: list[IngestItem], workers: int, follow_links: bool = False) -> None:
        self._items, self._workers, self._follow = iter(items), workers, follow_links
        self._pool: ProcessPoolExecutor | None = None
        self._pending: deque[tuple[IngestItem, Future]] = deque()

    def __enter__(self) -> _Decoder:
        if self._workers > 0:
            self._pool = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("fork"))
            self._submit(self._workers * _IN_FLIGHT_PER_WORKER)  # forks all workers now
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def _submit(self, n: int) -> None:
        for item in itertools.islice(self._items, n):
            self._pending.append((item, self._pool.submit(read_item, item, self._follow)))

    def __iter__(self) -> Iterator[tuple[IngestItem, tuple[np.ndarray, SensorSize] | str]]:
        if self._pool is None:
            for item in self._items:
                yield item, read_item(item, self._follow)
            return
        while self._pending:
            item, future = self._pending.popleft()
            self._submit(1)
            yield item, future.result()


def _ingested_keys(out: Path) -> tuple[set[tuple[str, int, int]], set[str]]:
    """Source-file keys and recording names already in the corpus at ``out`` (empty for a new corpus)."""
    if not (out / MANIFEST).exists():
        return set(), set()
    keys, names = set(), set()
    for r in Corpus(out).recordings:
        names.update((r.name, r.session))
        m = r.metadata
        if {"source_path", "source_size", "source_mtime_ns"} <= m.keys():
            keys.add((m["source_path"], m["source_size"], m["source_mtime_ns"]))
    return keys, names


def _unique(name: str, names: set[str]) -> str:
    candidate, k = name, 1
    while candidate in names:
        k += 1
        candidate = f"{name}~{k}"
    names.add(candidate)
    return candidate


class _Progress:
    """A transient rich progress bar on stderr (files done / total, events), only on a terminal."""

    def __init__(self, enabled: bool, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self._bar = None
        if enabled and console.is_terminal:
            self._bar = Progress(
                TextColumn("ingest"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[events]:,} events"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task("ingest", total=total, events=0)

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, events: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, events=events)


def run(config: IngestConfig) -> IngestReport:
    """Ingest ``config.paths`` into ``config.out``; bad files are reported, not raised (see ``IngestReport``)."""
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    report = IngestReport(str(config.out), started.isoformat(timespec="seconds"), config.dataset)
    found = collect(config)
    items, report.failed, report.left_out = found.items, found.failed_inputs, found.left_out
    report.unusable_inputs = [e["path"] for e in report.failed]
    report.failed += found.unreadable
    report.files = len(items) + len(report.left_out) + len(found.unreadable)
    if len(report.unusable_inputs) == len(config.paths):  # nothing to read: no corpus made, no report written in one
        report.seconds = time.perf_counter() - t0
        return report
    prepare_corpus_dir(config.out)
    done_keys, names = _ingested_keys(config.out)
    todo = []
    for item in items:
        try:
            key = item.source_key or _file_key(item.path)
        except OSError as e:
            report.failed.append({"path": str(item.path), "reason": f"cannot stat: {e.strerror}"})
            continue
        if key in done_keys:
            report.skipped.append({"path": str(item.path), "reason": "already ingested"})
        else:
            done_keys.add(key)  # a file named twice (or reached twice) is ingested once
            todo.append((item, key))
    provenance = {"tool": "mem ingest", "paths": [str(p) for p in config.paths], "dataset": config.dataset}
    with (
        _Decoder([item for item, _ in todo], config.workers, config.follow_links) as decoded,
        CorpusWriter(
            config.out,
            provenance=provenance,
            flush_interval_s=config.flush_interval_s,
            min_free_bytes=config.min_free_bytes,
        ) as writer,
        _Progress(config.progress, len(todo)) as progress,
    ):
        keys = dict(todo)
        try:
            for item, result in decoded:
                if isinstance(result, str):
                    report.failed.append({"path": str(item.path), "reason": result})
                else:
                    _add(writer, item, keys[item], result, names, report)
                progress.advance(report.events)
        except CorpusFullError as e:
            report.stopped = str(e)
        finally:
            _input_corpus.cache_clear()  # a later run reads the input corpora as they are then
    report.seconds = time.perf_counter() - t0
    report.report_path = str(_write_report(config.out, report, started))
    return report


def _add(writer: CorpusWriter, item: IngestItem, key, decoded, names: set[str], report: IngestReport) -> None:
    events, sensor = decoded
    path, size, mtime_ns = key
    metadata = {
        **item.metadata,
        "source_path": path,
        "source_size": size,
        "source_mtime_ns": mtime_ns,
        "format": "corpus" if item.recording is not None else item.path.suffix.lower().lstrip("."),
        **({"split": item.split} if item.split else {}),
    }
    name = _unique(item.name, names)
    try:
        writer.add_recording(name, events, sensor, label=item.label, metadata=metadata)
    except ValueError as e:  # events the corpus refuses (off-sensor, unsorted): a bad file, not a stop
        names.discard(name)
        report.failed.append({"path": str(item.path), "reason": str(e)})
        return
    report.ingested.append({"path": str(item.path), "name": name, "events": int(events.size), "label": item.label})
    report.events += int(events.size)


def _write_report(out: Path, report: IngestReport, started: datetime) -> Path:
    path = out / f"ingest-report-{started:%Y%m%dT%H%M%S%fZ}.json"
    data = {f.name: getattr(report, f.name) for f in fields(report) if f.name != "report_path"}
    data["mev_per_s"] = report.events / report.seconds / 1e6 if report.seconds > 0 else None
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return path
