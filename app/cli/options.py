"""Option types the ``mem`` commands share, and the one way they report a usage error."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DatasetOpt = Annotated[
    str,
    typer.Option("--dataset", help="Dataset name: ncars, nmnist, ncaltech101, nimagenet, dsec-semantic, corpus, sim."),
]
DataOpt = Annotated[Path | None, typer.Option("--data", help="Dataset root or corpus directory.")]
OutOpt = Annotated[Path, typer.Option("--out", help="Run directory to write.")]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="Bundled preset: cpu-tiny, paper-ncars, ...")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="TOML config file (\\[input], \\[data], \\[vit] and per-stage tables).")
]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config field: key=value (repeatable).")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --out.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (the last line of stdout).")]


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` in red on stderr; raise the returned ``typer.Exit`` to end with ``code``."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=code)
