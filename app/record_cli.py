"""``mem record`` and ``mem ingest``: parse the options, build a config, call ``recorders`` (registered by app.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=code)


def record(
    source: Annotated[
        str, typer.Option("--source", help="camera, camera:SERIAL, sim, sim:fast or an event file to replay.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Corpus directory (created, or appended to).")],
    duration: Annotated[float | None, typer.Option("--duration", help="Stop after this many seconds.")] = None,
    segment_minutes: Annotated[
        float | None, typer.Option("--segment-minutes", help="Start a new segment (shard) every M minutes.")
    ] = None,
    publish: Annotated[
        str | None, typer.Option("--publish", help="Also publish the events over ZMQ: tcp://127.0.0.1:PORT or PORT.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Session name (default: <kind>-<UTC time>).")] = None,
    speed: Annotated[
        float, typer.Option("--speed", help="File replay / simulator speed: 1 = real time, 0 = as fast as possible.")
    ] = 1.0,
    loop: Annotated[bool, typer.Option("--loop", help="Replay the file over and over.")] = False,
    min_free_mb: Annotated[
        float, typer.Option("--min-free-mb", help="Stop before the disk has less than this free.")
    ] = 256.0,
) -> None:
    """Record events from a camera, the simulator or a replayed file into a corpus, until Ctrl-C or --duration."""
    from recorders.base import RecorderError
    from recorders.config import RecordConfig
    from recorders.record import run

    config = RecordConfig(
        source=source,
        out=out,
        name=name,
        duration_s=duration,
        segment_minutes=segment_minutes,
        publish=publish,
        speed=speed,
        loop=loop,
        min_free_bytes=int(min_free_mb * (1 << 20)),
    )
    try:
        result = run(config)
    except RecorderError as e:
        raise _fail(str(e)) from None
    typer.echo(
        f"recorded {result.stored:,} events in {result.seconds:.1f} s into {result.out} "
        f"(session {result.name}, {result.segments} segment(s), stopped: {result.stop_reason})"
    )
    if result.reconnects:
        typer.echo(f"camera reconnected {result.reconnects} time(s)")
    if publish:
        typer.echo(f"published {result.published} batches, dropped {result.publish_dropped} (a subscriber was full)")
    if result.error:
        raise _fail(result.error, code=1)


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Event files or folders (searched recursively).")],
    out: Annotated[Path, typer.Option("--out", help="Corpus directory (created, or appended to).")],
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="Read PATHS as this dataset's layout and keep labels: ncars, nmnist, ..."),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="Reader processes (1 = read in this process).")] = 1,
    strict: Annotated[bool, typer.Option("--strict", help="Exit with status 1 when any file failed.")] = False,
    min_free_mb: Annotated[
        float, typer.Option("--min-free-mb", help="Stop before the disk has less than this free.")
    ] = 256.0,
) -> None:
    """Ingest event files into a corpus; bad files are listed (and written to an ingest report), not fatal."""
    from rich.console import Console
    from rich.table import Table

    from recorders.base import RecorderError
    from recorders.config import IngestConfig
    from recorders.ingest import run

    if workers < 1:
        raise _fail(f"--workers must be >= 1, got {workers}")
    config = IngestConfig(
        paths=tuple(paths), out=out, dataset=dataset, workers=workers, min_free_bytes=int(min_free_mb * (1 << 20))
    )
    try:
        report = run(config)
    except RecorderError as e:
        raise _fail(str(e)) from None
    console = Console()
    table = Table(title=f"ingest into {out}", show_header=False)
    table.add_row("ingested", f"{len(report.ingested)} files, {report.events:,} events")
    table.add_row("skipped (already ingested)", str(len(report.skipped)))
    table.add_row("failed", str(len(report.failed)))
    table.add_row("time", f"{report.seconds:.1f} s ({report.events / max(report.seconds, 1e-9) / 1e6:.1f} Mev/s)")
    console.print(table)
    typer.echo(f"report: {report.report_path}")
    for entry in report.failed:  # plain lines (no wrapping): one per file, easy to grep
        typer.echo(f"failed {entry['path']}: {entry['reason']}")
    if report.stopped:
        raise _fail(f"ingest stopped early: {report.stopped}")
    if strict and report.failed:
        raise typer.Exit(code=1)
