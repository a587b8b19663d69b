"""``mem record`` and ``mem ingest``: events in. Each option is a field of ``RecordConfig`` / ``IngestConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli.options import MIN_FREE, Converted, fail, with_options
from recorders.config import IngestConfig, RecordConfig

# the fields given in another form on the command line; every other option is a field's own (``recorders.config``)
RECORD_OPTIONS = {"min_free_bytes": MIN_FREE}
INGEST_OPTIONS = {"paths": Converted(typer.Argument(), list[Path], tuple, list), "min_free_bytes": MIN_FREE}


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
    if report.report_path is not None:  # (none when no input could be read: nothing was written)
        typer.echo(f"report: {report.report_path}")
    failure = report.failure()
    for entry in report.failed:  # plain lines (no wrapping): one per file, easy to grep
        if f"{entry['path']}: {entry['reason']}" != failure:  # (the error line says it)
            typer.echo(f"failed {entry['path']}: {entry['reason']}")
    for entry in report.left_out:
        typer.echo(f"left out {entry['path']}: {entry['reason']}")
    if failure is not None:
        raise fail(failure, code=1)
    if strict and report.failed:
        raise typer.Exit(code=1)
