"""The ``mem`` command line: it parses options, builds a config and calls one library function per command.

``train`` holds the training commands, ``record`` the ones that bring events in, ``describe`` ``mem inspect``,
``live`` the server and viewer, ``demo`` the demo; other packages add command groups through the ``mem.commands`` entry point (``mem bench``).
Heavy modules (torch, Qt) are imported by the commands that use them, so ``mem --help`` and ``mem view`` start fast.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import typer

from app.cli import demo, describe, live, record, train
from app.cli.options import PlainHelp

app = typer.Typer(
    name="mem",
    cls=PlainHelp,
    help="Masked Event Modeling: self-supervised learning for event cameras.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
for command in (
    describe.inspect,
    train.tokenizer,
    train.pretrain,
    train.finetune,
    train.train_labels,
    train.segment,
    train.evaluate,
    train.export,
    record.record,
    record.ingest,
    live.serve,
    live.view,
    demo.demo,
):
    app.command()(command)
app.add_typer(train.experiment_app, name="experiment")
for plugin in entry_points(group="mem.commands"):
    app.add_typer(plugin.load(), name=plugin.name)


def main() -> None:
    """Entry point: bad input (``MemError``, a path the system refuses) becomes one clear line and exit status 2."""
    from mem_core.errors import MemError

    try:
        app()
    except (MemError, OSError) as exc:  # OSError: a path given that is missing, too long, not a folder, ...
        typer.secho(f"error: {_one_line(exc)}", fg=typer.colors.RED, err=True)
        sys.exit(2)


def _one_line(exc: Exception) -> str:
    """``exc`` as the rest of an ``error:`` line: an ``OSError`` about a path as ``<path>: <what the system said>``."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)
