"""``mem serve`` and ``mem view``: thin typer commands (registered by app/cli.py) for the live app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def serve(
    model: Annotated[Path, typer.Option("--model", help="Export directory (mem export) or finetune/segment run.")],
    source: Annotated[
        str,
        typer.Option(
            "--source",
            help="camera[:SERIAL], sim, sim:fast, an event file (replayed "
            "in a loop), or tcp://HOST:PORT (events of mem record --publish).",
        ),
    ] = "sim",
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="Tokenizer run or export for the token overlay (default: the one exported with the model).",
        ),
    ] = None,
    window: Annotated[
        int | None,
        typer.Option("--window", help="Events per window (default: the model's n_max, 30000 for the paper's models)."),
    ] = None,
    window_ms: Annotated[
        float | None,
        typer.Option(
            "--window-ms",
            help="Also cap the window's time span (ms), e.g. 100 for a model trained on 100 ms N-Cars samples.",
        ),
    ] = None,
    pub: Annotated[str, typer.Option("--pub", help="PUB endpoint to bind.")] = "tcp://127.0.0.1:5557",
    control: Annotated[
        str | None, typer.Option("--control", help="Control (REP) endpoint to bind (default: the --pub port + 1).")
    ] = None,
    speed: Annotated[float, typer.Option("--speed", help="Replay / simulator speed (x real time).")] = 1.0,
    loop: Annotated[bool, typer.Option("--loop/--no-loop", help="Replay a file in a loop.")] = True,
    threads: Annotated[int, typer.Option("--threads", help="Torch CPU threads for inference.")] = 1,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N].")] = "cpu",
    record_dir: Annotated[
        Path, typer.Option("--record-dir", help="Corpus that record_start writes into (camera and sim sources).")
    ] = Path("recordings"),
    duration: Annotated[float | None, typer.Option("--duration", help="Stop after S seconds.")] = None,
) -> None:
    """Live inference: run a model on the newest events of a source and publish over ZMQ (docs/protocol.md)."""
    import zmq

    from app.config import ServeConfig
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
    )
    try:
        run(config)
    except (RecorderError, zmq.ZMQError) as exc:  # no camera, a source that failed, an endpoint in use
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None


def view(
    connect: Annotated[str, typer.Option("--connect", help="The server's PUB endpoint.")] = "tcp://127.0.0.1:5557",
    snapshot: Annotated[
        Path | None,
        typer.Option("--snapshot", help="Save the window as PNG (plus a .json of what it shows) when quitting."),
    ] = None,
    quit_after: Annotated[float | None, typer.Option("--quit-after", help="Quit after S seconds.")] = None,
) -> None:
    """The live viewer: histogram, token grid, predictions, controls. Starts before or after the server."""
    from app.config import ViewConfig
    from app.viewer.window import run

    raise typer.Exit(run(ViewConfig(connect=connect, snapshot=snapshot, quit_after_s=quit_after)))
