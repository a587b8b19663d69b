"""``mem demo``: the whole product on the simulated camera. Option defaults are the fields of ``DemoConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.config import DemoConfig

_D = DemoConfig


def demo(
    out: Annotated[Path, typer.Option("--out", help="Where the demo writes everything.")] = _D.out,
    headless: Annotated[
        bool | None,
        typer.Option("--headless/--window", help="Snapshots and a report instead of a window (default: no display)."),
    ] = _D.headless,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Start over instead of reusing the last demo's work.")
    ] = _D.fresh,
    labels_per_class: Annotated[
        int, typer.Option("--labels-per-class", help="Labelled samples per class in each finetuning run.")
    ] = _D.labels_per_class,
    seeds: Annotated[
        str,
        typer.Option("--seeds", help="Comma-separated label seeds: each draws other labelled samples for both arms."),
    ] = ",".join(map(str, _D.label_seeds)),
    jobs: Annotated[int, typer.Option("--jobs", help="Finetuning runs at once, each in its own process.")] = _D.jobs,
) -> None:
    """The whole product on the simulated camera: record, pretrain, finetune MEM vs scratch, live viewer."""
    from app.demo import label_fraction, run

    try:
        label_fraction(labels_per_class)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--labels-per-class") from None
    try:
        label_seeds = tuple(int(s) for s in seeds.split(","))
        cfg = DemoConfig(
            out=out,
            headless=headless,
            fresh=fresh,
            labels_per_class=labels_per_class,
            label_seeds=label_seeds,
            jobs=jobs,
        )
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} (--seeds {seeds!r}, --jobs {jobs})", param_hint="--seeds/--jobs") from None
    run(cfg)
