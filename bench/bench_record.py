"""Recording and ingest throughput (``mem bench record``): prints a table and writes JSON rows.

Ingest runs in one process (``--workers 1``: read + decode + append), timed by wall clock and by the process's CPU
time; "per CPU-second" (events / CPU seconds) is the per-core figure, robust to other load on a shared machine.
Inputs: real N-Cars ``.dat`` and N-MNIST ``.bs2`` files (thousands of small files: per-file costs dominate) and
large synthetic ``.dat`` / ``.bin`` files (the streaming rate); decode-only rows show how the time splits.
Recording streams into a corpus as fast as the source delivers, for a few seconds each: the simulator (fast
config; the simulator itself is the limit), a looped file replay, and the replay again with ``--publish``; loss =
events the source delivered minus events in the corpus. The 1-minute load average is recorded with the rows.

Run: ``uv run mem bench record --json-out out.json``, about a minute.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from mem_core import shared_data_dir
from mem_core.events import SensorSize, make_events
from mem_core.io import read_events, write_events
from mem_core.simulator import EventSimulator, fast_config
from recorders.config import IngestConfig, RecordConfig
from recorders.ingest import run as ingest
from recorders.record import run as record
from recorders.replay import ReplaySource
from recorders.simulated import SimulatorSource

INGEST_TARGET = 20.0  # Mev/s per core
RECORD_TARGET = 30.0  # Mev/s
REAL_FILES = 1000  # files per real dataset
SYNTHETIC_EVENTS = 10_000_000
RECORD_SECONDS = 4.0


def _row(name: str, value: float, unit: str, target: float | None = None, higher_is_better: bool = True) -> dict:
    ok = None if target is None else (value >= target if higher_is_better else value <= target)
    return {"name": name, "value": round(float(value), 3), "unit": unit, "target": target, "ok": ok}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``'s result, wall seconds and CPU seconds of this process (all its threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _synthetic(n: int, sensor, span_us: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, span_us, n))
    return make_events(t, rng.integers(0, sensor.width, n), rng.integers(0, sensor.height, n), rng.integers(0, 2, n))


def _ingest_rows(label: str, paths: list[Path], out: Path) -> list[dict]:
    decoded, _, decode_cpu = _timed(lambda: sum(read_events(p).events.size for p in paths))
    config = IngestConfig(paths=tuple(paths), out=out, workers=0, progress=False, min_free_bytes=0)
    report, wall, cpu = _timed(lambda: ingest(config))
    if report.failed or report.events != decoded:
        raise RuntimeError(f"benchmark files did not all ingest: {report.failed[:3]}")
    mev = report.events / 1e6
    return [
        _row(f"ingest {label}: per CPU-second", mev / cpu, "Mev/s", INGEST_TARGET),
        _row("  wall clock", mev / wall, "Mev/s"),
        _row("  decode only, per CPU-second", mev / decode_cpu, "Mev/s"),
    ]


def _record_rows(label: str, source, out: Path, publish: str | None = None) -> list[dict]:
    config = RecordConfig(
        source=label, out=out, duration_s=RECORD_SECONDS, publish=publish, speed=0, min_free_bytes=0, status=False
    )
    result, wall, cpu = _timed(lambda: record(config, source=source))
    mev = result.stored / 1e6
    rows = [
        _row(f"record {label}: wall clock", mev / wall, "Mev/s", RECORD_TARGET),
        _row("  per CPU-second", mev / cpu, "Mev/s"),
        _row("  loss (delivered - stored)", result.events - result.stored, "events", 0, higher_is_better=False),
    ]
    if publish:
        rows.append(_row("  batches published / dropped", result.published, f"/ {result.publish_dropped}"))
    return rows


def main(json_path: Path | None = None) -> list[dict]:
    """Run the benchmark, print a table, write the rows as JSON to ``json_path`` (if given) and return them."""
    data = shared_data_dir()
    rows = [_row("load average (1 min) at start", os.getloadavg()[0], f"on {os.cpu_count()} CPUs")]
    with tempfile.TemporaryDirectory(prefix="mem-bench-record-") as tmp:
        tmp = Path(tmp)
        ncars = sorted((data / "ncars-dev" / "train").glob("*/*.dat"))
        nmnist = sorted((data / "nmnist-small").glob("*.bs2"))
        _ingest_rows("warm-up", ncars[-20:] + nmnist[-20:], tmp / "c-warm-up")  # numba/JIT and import costs
        if ncars:
            rows += _ingest_rows(f"N-Cars .dat ({len(ncars[:REAL_FILES])} files)", ncars[:REAL_FILES], tmp / "c-ncars")
        if nmnist:
            rows += _ingest_rows(f"N-MNIST .bs2 ({len(nmnist[:REAL_FILES])} files)", nmnist[:REAL_FILES], tmp / "c-nm")
        big_dat, big_bin = tmp / "big.dat", tmp / "big.bin"
        write_events(big_dat, _synthetic(SYNTHETIC_EVENTS, SensorSize(480, 640), 10**8), SensorSize(480, 640))
        write_events(big_bin, _synthetic(SYNTHETIC_EVENTS, SensorSize(180, 240), 8_000_000), SensorSize(180, 240))
        rows += _ingest_rows("synthetic .dat (10M events, VGA)", [big_dat], tmp / "c-dat")
        rows += _ingest_rows("synthetic .bin (10M events)", [big_bin], tmp / "c-bin")

        rows += _record_rows("simulator (fast config)", SimulatorSource(fast_config(), speed=0), tmp / "r-sim")
        sim = EventSimulator(fast_config(seed=1))
        replay_file = tmp / "sim.dat"
        write_events(replay_file, sim.simulate(50_000), sim.sensor)  # ~5M simulated VGA events
        rows += _record_rows("looped replay", ReplaySource(replay_file, speed=0, loop=True), tmp / "r-replay")
        replay = ReplaySource(replay_file, speed=0, loop=True)
        rows += _record_rows("looped replay + publish", replay, tmp / "r-publish", publish="tcp://127.0.0.1:*")
    table = Table(title="mem bench record")
    for column in ("benchmark", "value", "unit", "target", "ok"):
        table.add_column(column)
    for r in rows:
        ok = "" if r["ok"] is None else ("[green]yes[/green]" if r["ok"] else "[red]no[/red]")
        table.add_row(r["name"], f"{r['value']:,.2f}", r["unit"], "" if r["target"] is None else str(r["target"]), ok)
    Console().print(table)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(rows, indent=2) + "\n")
    return rows
