"""``mem record`` and ``mem ingest``: events in. Each option of ``record`` and ``ingest`` is a field of
``RecordConfig`` / ``IngestConfig`` (its type and default) with its flag and help declared here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli.options import SIM_SOURCES, Converted, fail, with_options
from recorders.config import SPECS, IngestConfig, RecordConfig

MB = 1 << 20
MIN_FREE = Converted(
    typer.Option("--min-free-mb", help="Stop before the disk has less than this free."),
    float,
    lambda mb: int(mb * MB),
    lambda size: size / MB,
)
RECORD_OPTIONS = {
    "source": typer.Option("--source", help=f"{SPECS} (a file is replayed). {SIM_SOURCES}"),
    "out": typer.Option("--out", help="Corpus directory (created, or appended to)."),
    "duration_s": typer.Option(
        "--duration",
        help="Stop after this many seconds of the source's time (its events' clock): with --speed 0 a file or the "
        "simulator records that much of its time however fast it runs; a camera's time is the wall clock's.",
    ),
    "segment_minutes": typer.Option("--segment-minutes", help="Start a new segment (shard) every M minutes."),
    "publish": typer.Option("--publish", help="Also publish the events over ZMQ: tcp://127.0.0.1:PORT or PORT."),
    "name": typer.Option("--name", help="Session name (default: <kind>-<UTC time>)."),
    "speed": typer.Option("--speed", help="File replay / simulator speed: 1 = real time, 0 = as fast as possible."),
    "loop": typer.Option("--loop", help="Replay the file over and over."),
    "min_free_bytes": MIN_FREE,
}
INGEST_OPTIONS = {
    "paths": Converted(
        typer.Argument(
            help="Event files, folders (searched recursively) or corpora (each recording kept with its label)."
        ),
        list[Path],
        tuple,
        list,
    ),
    "out": typer.Option("--out", help="Corpus directory (created, or appended to)."),
    "dataset": typer.Option(
        "--dataset", help="Read PATHS as this dataset's layout and keep labels: ncars, nmnist, ..."
    ),
    "workers": typer.Option("--workers", help="Reader processes (1 = read in this process)."),
    "min_free_bytes": MIN_FREE,
    "follow_links": typer.Option(
        "--follow-links",
        help="Also read HDF5 data a file keeps elsewhere (soft and external links, external storage, virtual datasets), refused by default: such a file can name any file on the machine.",
    ),
}


@with_options(config=RECORD_OPTIONS)
def record(config: RecordConfig) -> None:
    """Record events from a camera, the simulator or a replayed file into a corpus, until Ctrl-C or --duration."""
    from recorders.base import RecorderError
    from recorders.record import run

    try:
        result = run(config)
    except RecorderError as e:
        raise fail(str(e)) from None
    typer.echo(
        f"recorded {result.stored:,} events, {result.source_s:.1f} s of the source's time in {result.seconds:.1f} s, "
        f"into {result.out} (session {result.name}, {result.segments} segment(s), stopped: {result.stop_reason})"
    )
    if result.lag_warning:
        typer.echo(f"warning: {result.lag_warning}", err=True)
    if result.reconnects:
        typer.echo(f"camera reconnected {result.reconnects} time(s)")
    if config.publish:
        typer.echo(f"published {result.published} batches, dropped {result.publish_dropped} (a subscriber was full)")
    if result.error:
        raise fail(result.error, code=1)


@with_options(config=INGEST_OPTIONS)
def ingest(
    config: IngestConfig,
    strict: Annotated[bool, typer.Option("--strict", help="Exit with status 1 when any file failed.")] = False,
) -> None:
    """Ingest event files into a corpus; bad files are listed (and written to an ingest report), not fatal.

    Exits with status 1 when an input gave nothing to ingest (missing, no event files, not the --dataset layout),
    when no file could be read, or when the disk filled up; with --strict also when any file failed.
    """
    from rich.console import Console
    from rich.table import Table

    from recorders.base import RecorderError
    from recorders.ingest import run

    try:
        report = run(config)
    except RecorderError as e:
        raise fail(str(e)) from None
    console = Console()
    table = Table(title=f"ingest into {config.out}", show_header=False)
    table.add_row("found", f"{report.files} files")
    table.add_row("ingested", f"{len(report.ingested)} files, {report.events:,} events")
    table.add_row("skipped (already ingested)", str(len(report.skipped)))
    if report.left_out:
        table.add_row(f"left out (not {config.dataset} samples)", str(len(report.left_out)))
    table.add_row("failed", str(len(report.failed)))
    table.add_row("time", f"{report.seconds:.1f} s ({report.events / max(report.seconds, 1e-9) / 1e6:.1f} Mev/s)")
    console.print(table)
    typer.echo(f"report: {report.report_path}")
    for entry in report.failed:  # plain lines (no wrapping): one per file, easy to grep
        typer.echo(f"failed {entry['path']}: {entry['reason']}")
    for entry in report.left_out:
        typer.echo(f"left out {entry['path']}: {entry['reason']}")
    if (failure := report.failure()) is not None:
        raise fail(failure, code=1)
    if strict and report.failed:
        raise typer.Exit(code=1)
