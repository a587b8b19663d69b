"""``mem inspect``: what an event file, a folder of event files or a corpus holds, as tables with units (times and
durations in seconds, event rates in ev/s) or as one JSON object.

A corpus's recordings each run on their own clock (a camera's, a file's), so they are shown by duration, never on
one shared time axis; their times in the JSON are each recording's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from app.cli.options import JsonOpt, fail
from app.units import event_rate

MAX_ROWS = 50  # recordings listed in a corpus's table (--json lists all)
BLANK = "\u2013"
UNFOLDED = 100_000  # columns of piped output: no table is that wide


def inspect(
    path: Annotated[Path, typer.Argument(help="An event file, a folder of event files or a corpus.", metavar="PATH")],
    as_json: JsonOpt = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Corpus: read every event and check it (shards are always opened).")
    ] = False,
    follow_links: Annotated[
        bool,
        typer.Option(
            "--follow-links",
            help="Also read HDF5 data a file keeps elsewhere (soft and external links, external storage, virtual datasets), refused by default: such a file can name any file on the machine.",
        ),
    ] = False,
) -> None:
    """Describe an event file (format, sensor, events, ON/OFF, start, end, duration, event rate), the event files
    of a folder, or a corpus (its recordings, sensors and labels).

    A corpus's shards are opened and their event counts checked (with --verify every event is read and checked
    too); damaged shards are listed and the command exits with status 1. In a folder, a file over 256 MB is named,
    not decoded, and files past the first 200 are counted (mem inspect FILE describes one).
    """
    if not os.path.isdir(path):  # never raises: an over-long path is then refused by the reader in one line
        from mem_core.io import describe

        info = describe(path, follow_links=follow_links)
        info.update(_span(info))
        _print(info, as_json, lambda console: _print_file(console, str(path), info))
    elif (path / "manifest.json").exists():
        _inspect_corpus(path, as_json, verify)
    else:
        from recorders.inventory import EVENT_SUFFIXES, describe_folder

        info = describe_folder(path, follow_links=follow_links)
        if not info["event_files"]:
            raise fail(
                f"{path}: neither a corpus (no manifest.json) nor a folder of event files ({', '.join(EVENT_SUFFIXES)})"
            )
        for row in info["files"]:
            row.update(_span(row))
        _print(info, as_json, lambda console: _print_folder(console, info))


def _print(info: dict[str, Any], as_json: bool, tables) -> None:
    if as_json:
        print(json.dumps(info))
    else:
        tables(_console())


def _console() -> Console:
    """The terminal's width on a terminal; piped or redirected, as wide as the tables need, so that a program or a
    search reads every file name whole (rich would fold them at 80 columns, mid-word)."""
    console = Console()
    return console if console.is_terminal else Console(width=UNFOLDED)


def _span(info: dict[str, Any]) -> dict[str, Any]:
    """``duration_s`` and ``events_per_s`` of a description with ``t_min``/``t_max`` in us (None without events)."""
    if info.get("t_min") is None or info.get("t_max") is None:
        return {"duration_s": None, "events_per_s": None}
    duration = (info["t_max"] - info["t_min"]) / 1e6
    return {"duration_s": duration, "events_per_s": info["events"] / duration if duration > 0 else None}


def seconds(value: float | None) -> str:
    """``1.250000 s``: times and durations to the microsecond (``–`` when unknown)."""
    return BLANK if value is None else f"{value:,.6f} s"


def rate(per_s: float | None) -> str:
    """``2.50 Mev/s`` (``–`` when unknown: no events, or all at one time)."""
    return BLANK if per_s is None else event_rate(per_s)


def sensor(height: int, width: int) -> str:
    """``1280 x 720 px``: width x height, as cameras are named."""
    return f"{width} x {height} px"


def size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.1f} MB"


def _heading(console: Console, text: str) -> None:
    console.print(Text(text, style="bold"), soft_wrap=True)  # above the table: a long path is not wrapped into it


def _print_file(console: Console, path: str, info: dict[str, Any]) -> None:
    _heading(console, path)
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key, value in (
        ("format", info["format"]),
        ("sensor", sensor(info["height"], info["width"])),
        ("events", f"{info['events']:,}"),
        ("ON / OFF", f"{info['on']:,} / {info['off']:,}"),
        ("start", seconds(None if info["t_min"] is None else info["t_min"] / 1e6)),
        ("end", seconds(None if info["t_max"] is None else info["t_max"] / 1e6)),
        ("duration", seconds(info["duration_s"])),
        ("event rate", rate(info["events_per_s"])),
    ):
        table.add_row(key, value)
    console.print(table)


def _print_folder(console: Console, info: dict[str, Any]) -> None:
    _heading(console, f"{info['root']}: {info['event_files']} event files (no corpus manifest)")
    table = Table()
    table.add_column("file", overflow="fold")
    for name in ("format", "sensor", "events", "duration", "event rate"):
        table.add_column(name, justify="left" if name == "format" else "right")
    for row in info["files"]:
        name = Text(row["path"])  # (a file name is not rich markup)
        if "error" in row:  # the reason is a line below the table
            table.add_row(name, row.get("format", "?"), Text("unreadable", style="red"), BLANK, BLANK, BLANK)
        elif not row["decoded"]:
            table.add_row(name, row["format"], f"{size(row['bytes'])}, not decoded", BLANK, BLANK, BLANK)
        else:
            shape, events = sensor(row["height"], row["width"]), f"{row['events']:,}"
            table.add_row(name, row["format"], shape, events, seconds(row["duration_s"]), rate(row["events_per_s"]))
    console.print(table)
    for row in info["files"]:
        if "error" in row:
            console.print(Text(f"{row['path']}: {row['error']}", style="red"), soft_wrap=True)
    left_out = [f"{info['not_described']} more files not described"] if info["not_described"] else []
    if any(not row.get("decoded", True) for row in info["files"]):
        left_out.append(f"files over {size(info['max_file_bytes'])} not decoded")
    if left_out:
        console.print(f"{'; '.join(left_out)}: mem inspect FILE describes one", highlight=False)


def _inspect_corpus(path: Path, as_json: bool, verify: bool) -> None:
    from mem_core.corpus import Corpus

    with Corpus(path) as corpus:
        info = corpus.describe()
        damaged = corpus.check(full=verify)
        recordings = [
            {
                "name": r.name,
                "sensor": [r.sensor.height, r.sensor.width],
                "events": r.n_events,
                "t_min": r.t_min,
                "t_max": r.t_max,
                **_span({"events": r.n_events, "t_min": r.t_min, "t_max": r.t_max}),
                "label": r.label,
            }
            for r in corpus.recordings
        ]
    durations = [r["duration_s"] for r in recordings if r["duration_s"] is not None]
    info["duration_s"] = sum(durations) if durations else None  # each recording on its own clock: summed
    info["events_per_s"] = info["events"] / info["duration_s"] if info["duration_s"] else None
    info["shards"] = len(corpus.shards)
    info["checked"] = "every event" if verify else "shards opened, counts"
    info["damaged_shards"] = damaged
    info["recording_list"] = recordings
    _print(info, as_json, lambda console: _print_corpus(console, info))
    for problem in damaged.values():  # plain lines (no wrapping): one per shard, easy to grep
        typer.echo(problem, err=True)
    if damaged:
        raise fail(f"{len(damaged)} of {info['shards']} shards of {path} are damaged", code=1)


def _print_corpus(console: Console, info: dict[str, Any]) -> None:
    _heading(console, f"corpus {info['root']}")
    summary = Table(show_header=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    for key, value in (
        ("recordings", f"{info['recordings']:,}"),
        ("events", f"{info['events']:,}"),
        ("duration (all recordings)", seconds(info["duration_s"])),
        ("event rate", rate(info["events_per_s"])),
        ("shards", f"{info['shards']} ({info['checked']})"),
        ("damaged shards", str(len(info["damaged_shards"]))),
    ):
        summary.add_row(key, value)
    console.print(summary)
    sensors = Table(title="sensors")
    for name in ("sensor", "recordings"):
        sensors.add_column(name, justify="right")
    for entry in info["sensors"]:
        sensors.add_row(sensor(entry["height"], entry["width"]), f"{entry['recordings']:,}")
    console.print(sensors)
    if info["labels"]:
        labels = Table(title="labels")
        labels.add_column("label")
        labels.add_column("recordings", justify="right")
        for name, count in info["labels"].items():
            labels.add_row(Text(name), f"{count:,}")
        console.print(labels)
    recordings = Table(title="recordings (each on its own clock)")
    recordings.add_column("recording", overflow="fold")
    for name in ("sensor", "events", "duration", "event rate"):
        recordings.add_column(name, justify="right")
    if info["labels"]:
        recordings.add_column("label", overflow="fold")
    for r in info["recording_list"][:MAX_ROWS]:
        shape, events = sensor(*r["sensor"]), f"{r['events']:,}"
        row = [Text(r["name"]), shape, events, seconds(r["duration_s"]), rate(r["events_per_s"])]
        recordings.add_row(*row, *([Text(str(r["label"] or ""))] if info["labels"] else []))
    console.print(recordings)
    if len(info["recording_list"]) > MAX_ROWS:
        console.print(f"{len(info['recording_list']) - MAX_ROWS} more recordings: --json lists them all")
