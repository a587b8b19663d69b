"""``mem demo``: the whole product on the simulated camera. Each option is a field of ``DemoConfig`` (its type and
default) with its flag and help declared here."""

from __future__ import annotations

import typer

from app.cli.options import comma_separated, with_options
from app.config import DemoConfig

DEMO_OPTIONS = {
    "out": typer.Option("--out", help="Where the demo writes everything."),
    "headless": typer.Option(
        "--headless/--window", help="Snapshots and a report instead of a window (default: no display)."
    ),
    "fresh": typer.Option("--fresh", help="Start over instead of reusing the last demo's work."),
    "labels_per_class": typer.Option("--labels-per-class", help="Labelled samples per class in each finetuning run."),
    "label_seeds": comma_separated(
        typer.Option("--seeds", help="Comma-separated label seeds: each draws other labelled samples for both arms."),
        int,
    ),
    "jobs": typer.Option("--jobs", help="Finetuning runs at once, each in its own process."),
}


@with_options(config=DEMO_OPTIONS)
def demo(config: DemoConfig) -> None:
    """The whole product on the simulated camera: record, pretrain, finetune MEM vs scratch, live viewer."""
    from app.demo import label_fraction, run

    try:
        label_fraction(config.labels_per_class)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--labels-per-class") from None
    run(config)
