"""AEDAT4 read speed: ``read_events`` (decoded in-process with every offset checked) vs dv-processing's own reader.

Two files: the real iniVation sample (``fixtures/inivation_sample.aedat4``, 112 k events) and a multi-million-event
file that dv-processing's ``MonoCameraWriter`` writes in a temporary folder (the sample's events repeated back to
back in time, LZ4 as DV records). dv-processing is timed two ways: its batches only (``MonoCameraRecording`` +
``getNextEventBatch``), and with the batches turned into one numpy array (what a caller needs). Best of a few
round-robin runs, CPU time of this process, one thread.

Run: ``uv run mem bench aedat4 --json-out out.json``
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import dv_processing as dv
import numpy as np

from bench.bench_data import best_seconds, report
from mem_core import shared_data_dir
from mem_core.io import read_events
from mem_core.io.aedat4 import dv_processing_events

REPEATS = 7
LARGE_COPIES = 27  # 27 x 112 k = 3 M events


def dv_batches(path: Path) -> int:
    """dv-processing's reader alone: open the file and pull every event batch."""
    recording = dv.io.MonoCameraRecording(str(path))
    n = 0
    while (batch := recording.getNextEventBatch()) is not None:
        n += batch.size()
    return n


def write_large(sample: Path, out: Path, copies: int) -> Path:
    """``copies`` of the sample's events, each shifted to start after the previous, written by dv-processing."""
    events = dv_processing_events(sample)
    width, height = dv.io.MonoCameraRecording(str(sample)).getEventResolution()
    config = dv.io.MonoCameraWriter.EventOnlyConfig("bench", (width, height))
    writer = dv.io.MonoCameraWriter(str(out), config)
    span = int(events["timestamp"][-1] - events["timestamp"][0]) + 1
    for k in range(copies):
        store = dv.EventStore()
        for t, x, y, p in zip(
            events["timestamp"] + k * span, events["x"], events["y"], events["polarity"], strict=True
        ):
            store.push_back(int(t), int(x), int(y), bool(p))
        writer.writeEvents(store)
    del writer  # closing writes the data table
    return out


def file_rows(label: str, path: Path, small: bool) -> list[dict]:
    ours = read_events(path).events
    reference = dv_processing_events(path)
    if not all(np.array_equal(ours[a], reference[b]) for a, b in zip("txyp", reference.dtype.names, strict=True)):
        raise RuntimeError(f"{path}: read_events and dv-processing disagree; the benchmark would compare nonsense")
    seconds = best_seconds(
        {
            "ours": lambda: read_events(path),
            "batches": lambda: dv_batches(path),
            "numpy": lambda: dv_processing_events(path),
        },
        REPEATS,
    )
    n = ours.size
    rate = {k: n / s / 1e6 for k, s in seconds.items()}
    fastest_dv = min(seconds["batches"], seconds["numpy"])
    rows = [
        row(f"{label}: read_events", rate["ours"], "Mev/s"),
        row(f"{label}: dv-processing batches", rate["batches"], "Mev/s"),
        row(f"{label}: dv-processing batches + numpy", rate["numpy"], "Mev/s"),
    ]
    if small:
        cost = seconds["ours"] / fastest_dv
        rows.append(row(f"{label}: read_events cost / dv-processing's", cost, "x", "<= 3", cost <= 3))
    else:
        speed = fastest_dv / seconds["ours"]
        rows.append(row(f"{label}: read_events speed / dv-processing's", speed, "x", ">= 0.5", speed >= 0.5))
    return rows


def row(name: str, value: float, unit: str, target: str | None = None, ok: bool | None = None) -> dict:
    return {"name": name, "value": round(value, 4), "unit": unit, "target": target, "ok": ok}


def main(json_path: str | Path | None = None) -> list[dict]:
    """Run the benchmark, print a table, write the rows as JSON to ``json_path`` (if given) and return them."""
    sample = shared_data_dir() / "fixtures" / "inivation_sample.aedat4"
    with tempfile.TemporaryDirectory(prefix="mem-bench-aedat4-") as tmp:
        large = write_large(sample, Path(tmp) / "large.aedat4", LARGE_COPIES)
        n_large = read_events(large).events.size
        rows = file_rows(f"real sample ({sample.stat().st_size / 1e6:.1f} MB)", sample, small=True)
        rows += file_rows(
            f"dv-written, {n_large / 1e6:.1f} M events ({large.stat().st_size / 1e6:.0f} MB)", large, False
        )

    return report(rows, f"AEDAT4 read, CPU time, best of {REPEATS}", json_path)


if __name__ == "__main__":
    main()
