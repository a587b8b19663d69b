"""``mem serve`` and ``mem view``: the live app. Each option is a field of ``ServeConfig`` / ``ViewConfig``."""

from __future__ import annotations

import os
import sys
import threading

import typer

from app.cli.options import MIN_FREE, Renamed, comma_separated, fail, refusing, with_options
from app.config import ServeConfig, ViewConfig

# the fields given in another form on the command line; every other option is a field's own (``app.config``)
SERVE_OPTIONS = {"classes": comma_separated(typer.Option("--classes")), "min_free_bytes": MIN_FREE}


@refusing(
    Renamed("--window", "--window-events", "the events of each window; --window-ms caps its time span"),
    Renamed("--duration", "--stop-after", "mem record --duration is the source's time, not the wall clock's"),
)
@with_options(config=SERVE_OPTIONS)
def serve(config: ServeConfig) -> None:
    """Live inference: run a model on the newest events of a source and publish over ZMQ (docs/protocol.md).

    Ctrl-C (SIGINT) or SIGTERM stops it cleanly, also when it was started in the background (`mem serve ... &`).
    """
    import zmq

    from app.live.model_slot import WARM_UP_THREAD
    from app.live.server import serve_live
    from recorders.base import RecorderError
    from recorders.publish import bind_problem

    for flag, endpoint in (("--pub", config.pub), ("--control", config.control)):
        if endpoint is not None and (problem := bind_problem(endpoint)) is not None:  # before a model or source opens
            raise fail(f"{flag} {endpoint!r}: {problem}")

    try:
        serve_live(config)
    except (RecorderError, zmq.ZMQError) as exc:  # no camera, a source that failed, an endpoint in use
        raise fail(str(exc)) from None
    if any(t.name == WARM_UP_THREAD and t.is_alive() for t in threading.enumerate()):
        # stopped while a model's first window ran: everything is closed, but ending the interpreter under a torch
        # op still running aborts it ("terminate called without an active exception")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@with_options()
def view(config: ViewConfig) -> None:
    """The live viewer: histogram, token grid, predictions, controls. Starts before or after the server.

    Keys: 1-9 capture the window on screen as the label panel's class 1-9 (into mem serve's --labels corpus);
    Ctrl+Z takes the last capture back; Space pauses and plays a replay or the simulated camera (to look at or label
    a picture).
    """
    from app.qt_platform import window_problem
    from mem_core.protocol import endpoint_problem

    problem = endpoint_problem(config.connect)
    if problem is not None:  # checked before Qt starts: a bad endpoint is one line, not a traceback
        raise fail(f"--connect {config.connect!r}: {problem}")
    problem = window_problem()
    if problem is not None:  # Qt itself would abort the process (exit 134) with a raw message
        raise fail(f"mem view cannot open a window: {problem}")
    import zmq

    from app.viewer.window import open_viewer

    try:
        status = open_viewer(config)
    except zmq.ZMQError as exc:  # an endpoint ZMQ still refuses
        raise fail(f"--connect {config.connect!r}: {exc}") from None
    raise typer.Exit(status)
