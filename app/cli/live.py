"""``mem serve`` and ``mem view``: the live app. Option defaults are the fields of ``ServeConfig`` / ``ViewConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli.options import fail
from app.config import ServeConfig, ViewConfig
from recorders.config import SPECS

_S, _V = ServeConfig, ViewConfig


def serve(
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="Export directory (mem export) or finetune/segment run. Without one the server streams the sensor "
            "view for labelling (mem view: number keys capture, Train finetunes --pretrain on the captures).",
        ),
    ] = _S.model,
    source: Annotated[
        str, typer.Option("--source", help=f"{SPECS} (a file is replayed, in a loop unless --no-loop).")
    ] = _S.source,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="Tokenizer run or export for the token overlay (default: the one exported with the model).",
        ),
    ] = _S.tokenizer,
    window: Annotated[
        int | None,
        typer.Option(
            "--window",
            help="Events per window (default: the model's n_max, 30000 for the paper's models; mem view can change it).",
        ),
    ] = _S.window,
    window_ms: Annotated[
        float | None,
        typer.Option(
            "--window-ms",
            help="Also cap the window's time span (ms); 0: no cap. Default: the span of the model's training samples "
            "where its export records one (100 for N-Cars, 50 for sim), else no cap.",
        ),
    ] = _S.window_ms,
    pub: Annotated[str, typer.Option("--pub", help="PUB endpoint to bind.")] = _S.pub,
    control: Annotated[
        str | None, typer.Option("--control", help="Control (REP) endpoint to bind (default: the --pub port + 1).")
    ] = _S.control,
    speed: Annotated[float, typer.Option("--speed", help="Replay / simulator speed (x real time).")] = _S.speed,
    loop: Annotated[bool, typer.Option("--loop/--no-loop", help="Replay a file in a loop.")] = _S.loop,
    threads: Annotated[int, typer.Option("--threads", help="Torch CPU threads for inference.")] = _S.threads,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N].")] = _S.device,
    record_dir: Annotated[
        Path, typer.Option("--record-dir", help="Corpus that record_start writes into (camera and sim sources).")
    ] = _S.record_dir,
    duration: Annotated[float | None, typer.Option("--duration", help="Stop after S seconds.")] = _S.duration_s,
    labels: Annotated[
        Path, typer.Option("--labels", help="Labelled corpus that the viewer's captures go into (created).")
    ] = _S.labels,
    classes: Annotated[
        str,
        typer.Option(
            "--classes", help="Comma-separated class names to label (default: the model's, else those captured)."
        ),
    ] = ",".join(_S.classes),
    pretrain: Annotated[
        Path | None,
        typer.Option("--pretrain", help="Pretraining run that Train finetunes (default: the one behind --model)."),
    ] = _S.pretrain,
    train_out: Annotated[
        Path, typer.Option("--train-out", help="Where Train writes its runs and exports.")
    ] = _S.train_out,
    train_epochs: Annotated[int, typer.Option("--train-epochs", help="Epochs of a Train run.")] = _S.train_epochs,
    watch: Annotated[
        bool, typer.Option("--watch", help="Load a newer export of --model when one appears (no restart).")
    ] = _S.watch,
) -> None:
    """Live inference: run a model on the newest events of a source and publish over ZMQ (docs/protocol.md)."""
    import zmq

    from app.live.server import run
    from recorders.base import RecorderError

    config = ServeConfig(
        model=model,
        source=source,
        tokenizer=tokenizer,
        window=window,
        window_ms=window_ms,
        pub=pub,
        control=control,
        speed=speed,
        loop=loop,
        threads=threads,
        device=device,
        record_dir=record_dir,
        duration_s=duration,
        labels=labels,
        classes=tuple(c.strip() for c in classes.split(",") if c.strip()),
        pretrain=pretrain,
        train_out=train_out,
        train_epochs=train_epochs,
        watch=watch,
    )
    try:
        run(config)
    except (RecorderError, zmq.ZMQError) as exc:  # no camera, a source that failed, an endpoint in use
        raise fail(str(exc)) from None


def view(
    connect: Annotated[str, typer.Option("--connect", help="The server's PUB endpoint.")] = _V.connect,
    snapshot: Annotated[
        Path | None,
        typer.Option("--snapshot", help="Save the window as PNG (plus a .json of what it shows) when quitting."),
    ] = _V.snapshot,
    quit_after: Annotated[float | None, typer.Option("--quit-after", help="Quit after S seconds.")] = _V.quit_after_s,
) -> None:
    """The live viewer: histogram, token grid, predictions, controls. Starts before or after the server."""
    from app.qt_platform import window_problem
    from mem_core.protocol import endpoint_problem

    problem = endpoint_problem(connect)
    if problem is not None:  # checked before Qt starts: a bad endpoint is one line, not a traceback
        raise fail(f"--connect {connect!r}: {problem}")
    problem = window_problem()
    if problem is not None:  # Qt itself would abort the process (exit 134) with a raw message
        raise fail(f"mem view cannot open a window: {problem}")
    import zmq

    from app.viewer.window import run

    try:
        status = run(ViewConfig(connect=connect, snapshot=snapshot, quit_after_s=quit_after))
    except zmq.ZMQError as exc:  # an endpoint ZMQ still refuses
        raise fail(f"--connect {connect!r}: {exc}") from None
    raise typer.Exit(status)
