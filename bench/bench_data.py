"""Data-pipeline benchmark: histogram throughput and the cost of one 30 000-event window -> model input.

Measures in one run, single-threaded (torch and numba on one core), so the numbers are ratios on this machine:
histogram Mev/s for the numba kernel vs ``np.bincount`` on a flat index vs ``np.add.at`` on the same 1M-event
real N-Cars stream, then milliseconds per window -> model input (the paper's 224 x 224 and cpu-tiny's 64 x 64), per
sample (``preprocess``) and batched (``prepare_events`` + ``collate_events`` + ``batch_preprocess`` at B = 64,
amortized per sample), the DataLoader's training windows from a corpus, and from samples stored one per file
(read at every epoch as ``.dat`` or LZMA ``.evz``, or preloaded once).

Run: ``uv run mem bench data --json-out out.json``
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from mem_core import shared_data_dir
from mem_core.adapters import loader_worker_pids
from mem_core.corpus import CorpusWriter
from mem_core.datasets import FileSource
from mem_core.datasets.corpus import CorpusSource
from mem_core.events import SensorSize, make_events
from mem_core.io import read_events
from mem_core.io.evz import EXTENSION as EVZ
from mem_core.io.evz import write_evz
from mem_core.representation import (
    InputSpec,
    batch_preprocess,
    collate_events,
    event_histogram,
    prepare_events,
    preprocess,
)
from mem_core.train.data import build_loader
from mem_core.train.runtime import Runtime

NCARS_SENSOR = SensorSize(100, 120)
STREAM_EVENTS = 1_000_000
BATCH = 64


def load_stream(n_events: int) -> tuple[np.ndarray, SensorSize, str]:
    """``n_events`` real N-Cars events (samples back to back in time), or a synthetic stream if the data is missing."""
    root = shared_data_dir() / "ncars-dev" / "train"
    paths = sorted(root.glob("*/*.dat"))
    if not paths:
        rng = np.random.default_rng(0)
        h, w = NCARS_SENSOR
        t = np.sort(rng.integers(0, 10 * n_events, n_events))
        return (
            make_events(t, rng.integers(0, w, n_events), rng.integers(0, h, n_events), rng.integers(0, 2, n_events)),
            NCARS_SENSOR,
            "synthetic",
        )
    parts, total, offset = [], 0, 0
    for path in paths[:: max(1, len(paths) // 400)]:
        ev = read_events(path).events.copy()
        if not len(ev):
            continue
        ev["t"] += offset - ev["t"][0]
        offset = int(ev["t"][-1]) + 1
        parts.append(ev)
        total += len(ev)
        if total >= n_events:
            break
    stream = np.concatenate(parts)[:n_events]
    return stream, NCARS_SENSOR, f"N-Cars ({len(parts)} samples)"


def best_seconds(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best of ``repeats`` timings of each function, in CPU seconds of this process, after one warm-up call each.

    The functions take turns (round robin) so that a change in the machine's load hits all of them alike and
    their ratios stay meaningful. CPU time rather than wall time: the benchmark runs single-threaded on a
    machine shared with other jobs, and wall time would add the time spent waiting for a core.
    """
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    return best


def histogram_rows(stream: np.ndarray, sensor: SensorSize) -> list[dict]:
    height, width = sensor
    p, y, x = (stream[f].astype(np.intp) for f in ("p", "y", "x"))

    def bincount() -> np.ndarray:
        flat = (stream["p"].astype(np.intp) * height + stream["y"]) * width + stream["x"]
        return np.bincount(flat, minlength=2 * height * width).reshape(2, height, width).astype(np.float32)

    def add_at() -> np.ndarray:
        out = np.zeros((2, height, width), np.float32)
        np.add.at(out, (p, y, x), 1)
        return out

    def numba_kernel() -> np.ndarray:
        return event_histogram(stream, sensor)

    reference = add_at()
    if not (np.array_equal(numba_kernel(), reference) and np.array_equal(bincount(), reference)):
        raise RuntimeError("the three histogram implementations disagree; the benchmark would compare nonsense")
    fast = best_seconds({"numba": numba_kernel, "bincount": bincount}, 15)
    slow = best_seconds({"add_at": add_at}, 2)
    numba_rate, bincount_rate = (len(stream) / fast[k] / 1e6 for k in ("numba", "bincount"))
    ratio = numba_rate / bincount_rate
    return [
        row("histogram numba", numba_rate, "Mev/s", ">= 300", numba_rate >= 300),
        row("histogram np.bincount (flat index)", bincount_rate, "Mev/s"),
        row("histogram np.add.at (index prepared)", len(stream) / slow["add_at"] / 1e6, "Mev/s"),
        row("numba / bincount", ratio, "x", ">= 3", ratio >= 3),
    ]


# The two inputs that matter: the paper's (224 x 224 with RandAugment at train; on a GPU it is computed there) and
# cpu-tiny's (64 x 64, log scale, no RandAugment: the recipe trained on CPUs, where this pipeline is the main process).
PIPELINE_SPECS = {
    "224 paper": InputSpec(),
    "64 cpu-tiny": InputSpec(size=(64, 64), scale="log", randaug_ops=0, flip_polarity_p=0.0),
}


def pipeline_rows(stream: np.ndarray, sensor: SensorSize) -> list[dict]:
    """ms per sample from a 30 000-event window to the model input, for each of ``PIPELINE_SPECS``."""
    rows = []
    for label, spec in PIPELINE_SPECS.items():
        rows += _pipeline_rows(stream, sensor, spec, label, target=0.5 if "cpu-tiny" in label else None)
    return rows


def _pipeline_rows(stream: np.ndarray, sensor: SensorSize, spec: InputSpec, label: str, target: float | None):
    # 64 recordings of 2 * n_max events each: every sample cuts its own 30 000-event window.
    length = 2 * spec.n_max
    recordings = [stream[(i * length // 4) % (len(stream) - length) :][:length] for i in range(BATCH)]
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    per_sample_count = 16

    def per_sample(train: bool) -> Callable[[], None]:
        def run() -> None:
            for rec in recordings[:per_sample_count]:
                preprocess(rec, sensor, spec, train=train, rng=rng if train else None)

        return run

    def batched(train: bool) -> Callable[[], None]:
        def run() -> None:
            windows = [prepare_events(rec, sensor, spec, train=train, rng=rng) for rec in recordings]
            batch_preprocess(collate_events(windows, sensor), spec, train=train, generator=generator if train else None)

        return run

    eval_batch = collate_events([prepare_events(r, sensor, spec, train=False) for r in recordings], sensor)
    times = best_seconds(
        {
            "per-sample eval": per_sample(False),
            "per-sample train": per_sample(True),
            "batched eval": batched(False),
            "batched train": batched(True),
            "batch_preprocess eval": lambda: batch_preprocess(eval_batch, spec, train=False),
            "batch_preprocess train": lambda: batch_preprocess(eval_batch, spec, train=True, generator=generator),
            "windows train": lambda: collate_events(
                [prepare_events(rec, sensor, spec, train=True, rng=rng) for rec in recordings], sensor
            ),
        },
        4,
    )
    rows = []
    goal = None if target is None else f"<= {target:g}"
    for mode in ("eval", "train"):
        ms = times[f"per-sample {mode}"] / per_sample_count * 1e3
        rows.append(row(f"{label}: window -> input, per sample ({mode})", ms, "ms"))
        ms = times[f"batched {mode}"] / BATCH * 1e3
        ok = None if target is None else ms <= target
        rows.append(row(f"{label}: window -> input, batched B={BATCH} ({mode}), per sample", ms, "ms", goal, ok))
    for mode in ("eval", "train"):  # the main-process share; windows and collation run in DataLoader workers
        ms = times[f"batch_preprocess {mode}"] / BATCH * 1e3
        rows.append(row(f"{label}:   of which batch_preprocess ({mode})", ms, "ms"))
    ms = times["windows train"] / BATCH * 1e3
    rows.append(row(f"{label}:   of which prepare_events + collate_events (train)", ms, "ms"))
    return rows


LOADER_SAMPLES = 1500


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name may contain spaces
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_training_loader(source, spec: InputSpec, batch: int, workers: int, preload_mib: int = 0):
    """The training stages' own loader (and its sampler) of ``source`` on the CPU, seed 0."""
    return build_loader(
        source,
        spec,
        train=True,
        seed=0,
        batch_size=batch,
        runtime=Runtime(torch.device("cpu")),
        num_workers=workers,
        preload_mib=preload_mib,
    )


def loader_rows(stream: np.ndarray, sensor: SensorSize) -> list[dict]:
    """DataLoader samples/s per worker core: 30 000-event training windows read from a corpus, event-augmented.

    The corpus holds the stream written ten times over (10 M events in 333 sample slots of 30 000); one worker
    process reads windows through HDF5, applies the event augmentations and collates (into shared memory), the
    main process receives the batches. Counted after a warm-up that excludes worker start-up and numba loading:
    samples per wall-clock second (the worker competes for a core with everything else on a shared machine)
    and samples per CPU second of the worker process, i.e. per worker core (the target).
    """
    spec = InputSpec()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mem-bench-corpus-") as tmp:
        with CorpusWriter(tmp, provenance={"source": "bench"}) as writer:
            writer.begin_recording("bench", sensor)
            span = int(stream["t"][-1]) + 1
            for k in range(10):
                shifted = stream.copy()
                shifted["t"] += k * span
                writer.append(shifted)
            writer.end_recording()
        source = CorpusSource(Path(tmp), "all")
        for workers in (0, 1):  # the training stages' own loader
            loader, sampler = cpu_training_loader(source, spec, BATCH, workers)
            seen, epoch, start, worker_cpu = 0, 0, None, None
            while seen < LOADER_SAMPLES:
                sampler.set_epoch(epoch)
                for batch, _, _ in loader:
                    if start is None:  # the first batch pays worker start-up: not counted
                        start = time.perf_counter()
                        pid = loader_worker_pids(loader)[0] if workers else os.getpid()
                        worker_cpu = process_cpu_seconds(pid)
                        continue
                    seen += len(batch)
                    if seen >= LOADER_SAMPLES:
                        break
                epoch += 1
            rate = seen / (time.perf_counter() - start)
            if workers:
                rows.append(
                    row("DataLoader, 1 worker process, wall clock (corpus windows, train aug.)", rate, "samples/s")
                )
                end_cpu = process_cpu_seconds(pid)
                if worker_cpu is not None and end_cpu is not None:
                    per_core = seen / max(end_cpu - worker_cpu, 1e-9)
                    name = "DataLoader, 1 worker process, per worker CPU second"
                    rows.append(row(name, per_core, "samples/s", ">= 1000", per_core >= 1000))
            else:
                rows.append(row("DataLoader, in the main process, wall clock", rate, "samples/s"))
    return rows


FILE_SAMPLES = 512  # N-Cars training files, read in turn with and without preloading


def file_rows() -> list[dict]:
    """Training windows of samples stored one per file, in the main process: read from the N-Cars ``.dat`` files at
    every epoch, from the same samples packed as ``.evz`` (LZMA, what a GPU call carries), and preloaded once
    (``datasets.preload``, from the ``.evz`` files; the preload's own CPU time in its row's name). Samples per CPU
    second of the process (what a loader worker's core gives; the wall clock of a shared machine would not be) over
    two epochs of the same windows, augmentations and collation; no rows without the N-Cars data."""
    paths = sorted((shared_data_dir() / "ncars-dev" / "train").glob("*/*.dat"))[:FILE_SAMPLES]
    if not paths:
        return []
    spec, labels = InputSpec(), [0] * len(paths)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mem-bench-files-") as tmp:
        packed = []
        for k, path in enumerate(paths):
            packed.append(Path(tmp) / f"{k}{EVZ}")
            write_evz(packed[-1], read_events(path).events, NCARS_SENSOR)
        for name, files, preload_mib in (
            ("N-Cars .dat files, read at every epoch", paths, 0),
            ("N-Cars .evz files (LZMA), read at every epoch", packed, 0),
            ("N-Cars .evz files, preloaded", packed, 1024),
        ):
            source = FileSource("ncars", files, labels, ["car"], NCARS_SENSOR)
            started = time.process_time()
            loader, sampler = cpu_training_loader(source, spec, BATCH, 0, preload_mib)
            if preload_mib:
                name += f" once ({time.process_time() - started:.1f} CPU s)"
            seen, started = 0, time.process_time()
            for epoch in range(2):
                sampler.set_epoch(epoch)
                seen += sum(len(batch) for batch, _, _ in loader)
            rows.append(row(name, seen / (time.process_time() - started), "samples/CPU s"))
    return rows


STREAM_EPOCHS, STREAM_STEPS, STREAM_BATCH, STREAM_STEP_S, STREAM_VALIDATION_S = 3, 10, 256, 0.1, 0.2


def stream_rows() -> list[dict]:
    """Epoch boundaries: epochs of 10 batches of 256 N-Cars windows (gpu-small's finetuning input, preloaded) from 2
    loader workers, each batch taken by a stand-in step of 100 ms and each epoch ended by a 200 ms stand-in
    validation (a GPU's pace, which the workers keep up with between epochs). Seconds an epoch takes, the loader
    started anew for each epoch and read on as one stream (``train.data.EpochStream``, what the stages do); no rows
    without the N-Cars data."""
    from mem_core.train.data import EpochStream
    from mem_core.train.experiment import LabelEfficiencyConfig, finetune_config

    root = shared_data_dir() / "ncars-dev"
    if not (root / "train").is_dir():
        return []
    experiment = LabelEfficiencyConfig(dataset="ncars", data=str(root), out="", preset="gpu-small")
    spec = finetune_config(experiment, "mem", 1.0, 0).input
    files = sorted((root / "train").glob("*/*.dat"))[: STREAM_STEPS * STREAM_BATCH]
    source = FileSource("ncars", files, [0] * len(files), ["car"], NCARS_SENSOR)
    rows = []
    for name, streamed in (("loader started anew each epoch", False), ("one stream across epochs", True)):
        loader, sampler = cpu_training_loader(source, spec, STREAM_BATCH, 2, 1024)
        batches = EpochStream(loader, sampler) if streamed else loader
        epochs = []
        try:
            for epoch in range(STREAM_EPOCHS + 1):  # the first epoch pays the workers' start: not counted
                (batches if streamed else sampler).set_epoch(epoch)
                started = time.perf_counter()
                for _ in batches:
                    time.sleep(STREAM_STEP_S)
                time.sleep(STREAM_VALIDATION_S)
                epochs.append(time.perf_counter() - started)
        finally:
            loader.close()
        rows.append(
            row(f"an epoch of {STREAM_STEPS} steps of 100 ms + 200 ms: {name}", float(np.mean(epochs[1:])), "s")
        )
    return rows


def row(name: str, value: float, unit: str, target: str | None = None, ok: bool | None = None) -> dict:
    return {"name": name, "value": round(value, 4), "unit": unit, "target": target, "ok": ok}


def main(json_path: str | Path | None = None) -> list[dict]:
    """Run the benchmark, print a table, write the rows as JSON to ``json_path`` (if given) and return them."""
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    stream, sensor, source = load_stream(STREAM_EVENTS)
    rows = (
        histogram_rows(stream, sensor)
        + pipeline_rows(stream, sensor)
        + loader_rows(stream, sensor)
        + file_rows()
        + stream_rows()
    )

    title = (
        f"MEM data pipeline, 1 thread, CPU time ({len(stream):,} events from {source}, sensor "
        f"{sensor.width}x{sensor.height})"
    )
    return report(rows, title, json_path)


def report(rows: list[dict], title: str, json_path: str | None) -> list[dict]:
    """Print ``rows`` (name, value, unit, target, ok) as a table titled with the machine's cores and load, and
    write them as JSON to ``json_path``."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    table = Table(title=f"{title} ({os.cpu_count()} cores, load average {load:.1f} at the end)")
    for column in ("name", "value", "unit", "target", "ok"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for r in rows:
        ok = "" if r["ok"] is None else ("[green]yes" if r["ok"] else "[red]NO")
        table.add_row(r["name"], f"{r['value']:.3f}", r["unit"], r["target"] or "", ok)
    Console().print(table)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(rows, indent=2) + "\n")
    return rows
