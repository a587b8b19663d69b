"""``mem serve`` and ``mem view``: the live app. Each option is a field of ``ServeConfig`` / ``ViewConfig`` (its type
and default) with its flag and help declared here."""

from __future__ import annotations

import typer

from app.cli.options import SIM_SOURCES, comma_separated, fail, with_options
from app.config import ServeConfig, ViewConfig
from recorders.config import SPECS

SERVE_OPTIONS = {
    "model": typer.Option(
        "--model",
        help="Export directory (mem export) or finetune/segment run. Without one the server streams the sensor "
        "view for labelling (mem view: number keys capture, Train finetunes --pretrain on the captures).",
    ),
    "source": typer.Option("--source", help=f"{SPECS} (a file is replayed, in a loop unless --no-loop). {SIM_SOURCES}"),
    "tokenizer": typer.Option(
        "--tokenizer", help="Tokenizer run or export for the token overlay (default: the one exported with the model)."
    ),
    "window": typer.Option(
        "--window",
        help="Events per window (default: the model's n_max, 30000 for the paper's models; mem view can change it).",
    ),
    "window_ms": typer.Option(
        "--window-ms",
        help="Also cap the window's time span (ms); 0: no cap. Default: the span of the model's training samples "
        "where its export records one (100 for N-Cars, 50 for sim), else no cap.",
    ),
    "pub": typer.Option("--pub", help="PUB endpoint to bind."),
    "control": typer.Option("--control", help="Control (REP) endpoint to bind (default: the --pub port + 1)."),
    "speed": typer.Option("--speed", help="Replay / simulator speed (x real time)."),
    "loop": typer.Option("--loop/--no-loop", help="Replay a file in a loop."),
    "threads": typer.Option("--threads", help="Torch CPU threads for inference."),
    "device": typer.Option("--device", help="cpu or cuda[:N]."),
    "record_dir": typer.Option("--record-dir", help="Corpus that record_start writes into (camera and sim sources)."),
    "duration_s": typer.Option("--duration", help="Stop after S seconds."),
    "labels": typer.Option("--labels", help="Labelled corpus that the viewer's captures go into (created)."),
    "classes": comma_separated(
        typer.Option(
            "--classes", help="Comma-separated class names to label (default: the model's, else those captured)."
        )
    ),
    "pretrain": typer.Option(
        "--pretrain", help="Pretraining run that Train finetunes (default: the one behind --model)."
    ),
    "train_out": typer.Option("--train-out", help="Where Train writes its runs and exports."),
    "train_epochs": typer.Option("--train-epochs", help="Epochs of a Train run."),
    "watch": typer.Option("--watch", help="Load a newer export of --model when one appears (no restart)."),
}
VIEW_OPTIONS = {
    "connect": typer.Option("--connect", help="The server's PUB endpoint."),
    "snapshot": typer.Option(
        "--snapshot", help="Save the window as PNG (plus a .json of what it shows) when quitting."
    ),
    "quit_after_s": typer.Option("--quit-after", help="Quit after S seconds."),
}


@with_options(config=SERVE_OPTIONS)
def serve(config: ServeConfig) -> None:
    """Live inference: run a model on the newest events of a source and publish over ZMQ (docs/protocol.md).

    Ctrl-C (SIGINT) or SIGTERM stops it cleanly, also when it was started in the background (`mem serve ... &`).
    """
    import signal

    import zmq

    from app.live.server import run
    from recorders.base import RecorderError
    from recorders.publish import bind_problem

    for flag, endpoint in (("--pub", config.pub), ("--control", config.control)):
        if endpoint is not None and (problem := bind_problem(endpoint)) is not None:  # before a model or source opens
            raise fail(f"{flag} {endpoint!r}: {problem}")

    # a shell starts a background job with SIGINT ignored, and Python then leaves it ignored; SIGTERM would end the
    # process without closing the source, the recording and the sockets
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    try:
        run(config)
    except (RecorderError, zmq.ZMQError) as exc:  # no camera, a source that failed, an endpoint in use
        raise fail(str(exc)) from None


@with_options(config=VIEW_OPTIONS)
def view(config: ViewConfig) -> None:
    """The live viewer: histogram, token grid, predictions, controls. Starts before or after the server."""
    from app.qt_platform import window_problem
    from mem_core.protocol import endpoint_problem

    problem = endpoint_problem(config.connect)
    if problem is not None:  # checked before Qt starts: a bad endpoint is one line, not a traceback
        raise fail(f"--connect {config.connect!r}: {problem}")
    problem = window_problem()
    if problem is not None:  # Qt itself would abort the process (exit 134) with a raw message
        raise fail(f"mem view cannot open a window: {problem}")
    import zmq

    from app.viewer.window import run

    try:
        status = run(config)
    except zmq.ZMQError as exc:  # an endpoint ZMQ still refuses
        raise fail(f"--connect {config.connect!r}: {exc}") from None
    raise typer.Exit(status)
