"""The control socket of ``mem serve``: a viewer's JSON request in, one reply out (docs/protocol.md).

Requests are checked by ``mem_core.protocol.decode_control`` and carried out by the command their name maps to
(replay, window, labelling, recording); ``state`` only answers. Every request gets a reply, a bad one an error
reply: a REP socket that does not answer never hears again, so the control thread never dies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import zmq

from app.live.labelling import LabelError
from mem_core.errors import RunError
from mem_core.limits import MAX_CONTROL_BYTES, MAX_CONTROL_FRAMES, MAX_TEXT
from mem_core.protocol import ProtocolError, decode, decode_control, encode_control
from recorders.base import RecorderError
from recorders.zmq_receive import recv_bounded

Command = Callable[[str, dict[str, Any]], None]  # (command, its checked arguments); raises to refuse


class ControlError(Exception):
    """A control request that cannot be carried out (the reply's ``error``)."""


REFUSALS = (ControlError, LabelError, RecorderError, RunError, ValueError, OSError)  # answered with their message


class ControlHandler:
    """Answers control requests with ``commands`` (every command of the protocol but ``state``) and ``state``
    (what a client needs to draw its controls, sent with every reply).

    ``malformed`` counts requests that failed their check, ``carried_out`` the commands done (stats carry it: a
    client tells stats older than a reply).
    """

    def __init__(self, commands: dict[str, Command], state: Callable[[], dict[str, Any]]) -> None:
        self._commands = commands
        self._state = state
        self.malformed = 0
        self.carried_out = 0

    def serve(self, socket: zmq.Socket, stop: threading.Event) -> None:
        """Answer the requests on the REP ``socket`` until ``stop`` is set (the control thread); a request beyond
        ``MAX_CONTROL_FRAMES`` frames or ``MAX_CONTROL_BYTES`` is dropped as it is read, and answered as malformed."""
        seq = 0
        while not stop.is_set():
            if not socket.poll(100, zmq.POLLIN):
                continue
            frames = recv_bounded(socket, MAX_CONTROL_FRAMES, MAX_CONTROL_BYTES)
            socket.send_multipart(self.reply_frames([f.buffer for f in frames] if frames is not None else None, seq))
            seq += 1

    def reply_frames(self, frames: list[bytes] | None, seq: int) -> list[bytes]:
        """The encoded reply to one request (None: one dropped for its size). Never raises."""
        try:
            return encode_control(seq, **self.handle(frames))
        except Exception as exc:  # a bug in a command must not end the control thread
            error = f"{type(exc).__name__}: {exc}"[:MAX_TEXT]
            return encode_control(seq, "error", ok=False, error=error, state=None)

    def handle(self, frames: list[bytes] | None) -> dict[str, Any]:
        """The reply fields for one request (None: one dropped for its size): ``command``, ``ok``, ``error`` (or
        None) and ``state``."""
        try:
            if frames is None:
                raise ProtocolError(
                    "control", f"more than {MAX_CONTROL_FRAMES} frames or {MAX_CONTROL_BYTES} bytes, dropped unread"
                )
            command, args = decode_control(decode(frames, expect=("control",)))
        except ProtocolError as exc:
            self.malformed += 1
            return {"command": "error", "ok": False, "error": str(exc)[:MAX_TEXT], "state": None}
        if command != "state":
            try:
                self._commands[command](command, args)
            except REFUSALS as exc:
                return {"command": command, "ok": False, "error": str(exc)[:MAX_TEXT], "state": self._state()}
            self.carried_out += 1
        return {"command": command, "ok": True, "error": None, "state": self._state()}
