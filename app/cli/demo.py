"""``mem demo``: the whole product on the simulated camera. Each option is a field of ``DemoConfig``."""

from __future__ import annotations

import typer

from app.cli.options import Renamed, comma_separated, refusing, with_options
from app.config import DemoConfig

# the fields given in another form on the command line; every other option is a field's own (``app.config``)
DEMO_OPTIONS = {
    "label_seeds": comma_separated(typer.Option("--label-seeds"), int),
    "held_out": comma_separated(typer.Option("--held-out")),
}


@refusing(
    Renamed("--window", "--viewer", "--window-events is the events of mem serve's windows", takes_value=False),
    Renamed("--seeds", "--label-seeds", "the experiment's --seeds are its finetuning seeds"),
)
@with_options(config=DEMO_OPTIONS)
def demo(config: DemoConfig) -> None:
    """The whole product on the simulated camera: record, pretrain, finetune MEM against a ViT and a ResNet-18 from
    scratch, live viewer."""
    from app.demo import label_fraction, run

    try:
        label_fraction(config.labels_per_class)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--labels-per-class") from None
    try:
        run(config)
    except KeyboardInterrupt:  # the demo has said what it kept; no "Aborted!" after it
        raise typer.Exit(130) from None
