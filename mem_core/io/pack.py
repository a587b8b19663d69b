"""Packing a dataset folder as ``.evz`` files: the same tree, every event file packed under its own stem, the small
files beside them (``index.csv``, README, N-MNIST's ``train1K.txt`` lists) copied as they are.

A packed N-Cars, N-MNIST or N-Caltech101 folder is read by the same dataset code as the original: the datasets
list ``.evz`` files wherever they list their native files, in the same order (``datasets.base.sorted_files``).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

from mem_core.cores import usable_cores
from mem_core.io.base import EventFileError
from mem_core.io.evz import EXTENSION
from mem_core.io.registry import extensions, read_events, write_events

MAX_COPY_BYTES = 16 << 20  # other files copied along: lists, indexes, READMEs, split files (never recordings)
_FILES_PER_TASK = 32  # enough to hide the cost of a task, few enough for a steady progress line
_PROGRESS_EVERY_S = 5.0


class PackReport(NamedTuple):
    """What ``pack_folder`` did; paths in ``skipped`` are relative to the source folder."""

    packed: int  # event files written as .evz
    events: int
    source_bytes: int  # of the event files packed
    packed_bytes: int  # of the .evz files written
    copied: int  # other files copied as they are
    skipped: list[tuple[str, str]]  # (path, why): event files that do not read, large other files, special files
    seconds: float


class _Done(NamedTuple):
    """One file's outcome: ``kind`` packed, copied or skipped (``why``), its events and bytes before and after."""

    kind: str
    events: int = 0
    source_bytes: int = 0
    packed_bytes: int = 0
    why: str = ""


def pack_folder(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> PackReport:
    """Mirror the folder tree ``src`` into ``dst``, event files as ``.evz`` (same stem), other files of at most
    ``MAX_COPY_BYTES`` copied; ``workers`` processes (default: one per CPU). ``progress`` (e.g. ``print``) gets a
    line every few seconds and at the end.

    An event file that does not read is listed in ``skipped`` and not written. ``ValueError`` when ``src`` is not a
    folder, ``dst`` lies inside it, or two files would become the same ``.evz`` (``a.dat`` and ``a.bin``).
    """
    started = time.perf_counter()
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if not src.is_dir():
        raise ValueError(f"{src}: not a folder")
    if dst == src or src in dst.parents:
        raise ValueError(f"{dst}: the packed folder must lie outside the folder it packs ({src})")
    jobs = _jobs(src)
    tasks = [jobs[i : i + _FILES_PER_TASK] for i in range(0, len(jobs), _FILES_PER_TASK)]
    workers = min(workers or usable_cores(), max(len(tasks), 1))
    results: list[tuple[Path, _Done]] = []
    last = started
    # fork: the workers inherit the imported readers (numba kernels included) instead of importing them again
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) if workers > 1 else None
    try:
        outcomes = (
            pool.map(_pack_files, tasks, [src] * len(tasks), [dst] * len(tasks))
            if pool
            else (_pack_files(task, src, dst) for task in tasks)
        )
        for task, done in zip(tasks, outcomes, strict=True):
            results += zip(task, done, strict=True)
            if progress is not None and (time.perf_counter() - last >= _PROGRESS_EVERY_S or len(results) == len(jobs)):
                last = time.perf_counter()
                progress(_progress_line(results, len(jobs), last - started))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    packed = [d for _, d in results if d.kind == "packed"]
    return PackReport(
        packed=len(packed),
        events=sum(d.events for d in packed),
        source_bytes=sum(d.source_bytes for d in packed),
        packed_bytes=sum(d.packed_bytes for d in packed),
        copied=sum(1 for _, d in results if d.kind == "copied"),
        skipped=[(str(rel), d.why) for rel, d in results if d.kind == "skipped"],
        seconds=time.perf_counter() - started,
    )


def _jobs(src: Path) -> list[Path]:
    """Every file under ``src`` (relative paths, sorted); ``ValueError`` when two would be packed to one name."""
    event_suffixes = extensions()
    jobs, targets = [], {}
    for folder, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            rel = (Path(folder) / name).relative_to(src)
            jobs.append(rel)
            if rel.suffix.lower() in event_suffixes:
                target = rel.with_suffix(EXTENSION)
                if target in targets:
                    raise ValueError(f"{src}: {targets[target]} and {rel} would both be packed as {target}")
                targets[target] = rel
    return jobs


def _pack_files(rels: list[Path], src: Path, dst: Path) -> list[_Done]:
    return [_pack_file(rel, src, dst) for rel in rels]


def _pack_file(rel: Path, src: Path, dst: Path) -> _Done:
    """Pack or copy one file (a worker's job)."""
    path = src / rel
    if not path.is_file():
        return _Done("skipped", why="not a regular file")
    size = path.stat().st_size
    target = dst / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if rel.suffix.lower() not in extensions():
        if size > MAX_COPY_BYTES:
            return _Done("skipped", why=f"not an event file, and larger than the {MAX_COPY_BYTES} bytes copied")
        partial = target.with_name(f".{target.name}.partial")
        try:
            shutil.copyfile(path, partial)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
        return _Done("copied", source_bytes=size)
    try:
        events, sensor = read_events(path)
        written = write_events(target.with_suffix(EXTENSION), events, sensor)
    except (EventFileError, ValueError) as e:  # ValueError: events the reader let outside its sensor
        return _Done("skipped", why=getattr(e, "reason", str(e)))
    return _Done("packed", int(events.size), size, written.stat().st_size)


def _progress_line(results: list[tuple[Path, _Done]], total: int, seconds: float) -> str:
    packed = [d for _, d in results if d.kind == "packed"]
    events = sum(d.events for d in packed)
    out = sum(d.packed_bytes for d in packed)
    per_event = f", {out / events:.3f} B/event" if events else ""
    return (
        f"packed {len(results)}/{total} files: {events / 1e6:.2f} M events in {out / 1e6:.1f} MB{per_event}, "
        f"{sum(1 for _, d in results if d.kind == 'skipped')} skipped, {seconds:.0f} s"
    )
