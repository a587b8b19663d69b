"""The viewer's ZMQ side: a SUB socket read from the Qt event loop without ever blocking it.

ZMQ's file descriptor is edge-triggered: a ``QSocketNotifier`` on it fires when the socket's state changes,
not while messages wait. So every activation drains the socket with ``NOBLOCK`` until ``zmq.Again`` (keeping
only the newest message per topic), the control socket is drained after each send, and a slow timer drains
as a fallback. One ``messages`` signal per drain carries the newest message of each topic that arrived.
"""

from __future__ import annotations

import time
from typing import Any

import zmq
from PySide6 import QtCore

from mem_core.protocol import (
    Message,
    ProtocolError,
    SeqTracker,
    decode,
    decode_reply,
    encode_control,
    endpoint_problem,
)

VIEW_TOPICS = ("sensor", "hist", "tokens", "pred", "stats")
MAX_DRAIN = 2000  # messages read per activation before yielding to the event loop
FALLBACK_POLL_MS = 100


def control_endpoint(connect: str, advertised: str) -> str:
    """Where to reach the control socket: the advertised port on the host the viewer connected to (TCP)."""
    if not (connect.startswith("tcp://") and advertised.startswith("tcp://")):
        return advertised
    host = connect.rpartition(":")[0]
    return f"{host}:{advertised.rpartition(':')[2]}"


class LiveClient(QtCore.QObject):
    """Subscribes to the live topics at ``endpoint``; connects before or after the server starts, and again
    after a server restart (ZMQ reconnects by itself).

    Signals: ``messages(dict)`` topic -> newest ``Message`` of one drain (its content is checked by the window);
    ``control_reply(dict)`` the checked fields of a reply to ``send_control`` (``decode_reply``).
    """

    messages = QtCore.Signal(dict)
    control_reply = QtCore.Signal(dict)

    def __init__(self, endpoint: str, context: zmq.Context | None = None, parent: QtCore.QObject | None = None):
        super().__init__(parent)
        self.endpoint = endpoint
        self.tracker = SeqTracker()
        self.malformed = 0
        self.last_message = float("nan")  # time.monotonic() of the newest message
        self._context = context or zmq.Context.instance()
        self._sub = self._context.socket(zmq.SUB)
        for option, value in (
            (zmq.LINGER, 0),
            (zmq.RCVHWM, 64),
            (zmq.RECONNECT_IVL, 100),
            (zmq.RECONNECT_IVL_MAX, 1000),
        ):
            self._sub.setsockopt(option, value)
        for topic in VIEW_TOPICS:
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(endpoint)
        self._sub_notifier = self._notifier(self._sub, self.drain)
        self._control: zmq.Socket | None = None
        self._control_endpoint: str | None = None
        self._control_notifier: QtCore.QSocketNotifier | None = None
        self._control_seq = 0
        self._timer = QtCore.QTimer(self)
        self._timer.timeout.connect(self.drain)
        self._timer.start(FALLBACK_POLL_MS)

    def _notifier(self, socket: zmq.Socket, slot) -> QtCore.QSocketNotifier:
        notifier = QtCore.QSocketNotifier(socket.getsockopt(zmq.FD), QtCore.QSocketNotifier.Type.Read, self)
        notifier.activated.connect(slot)
        return notifier

    @property
    def dropped(self) -> int:
        """Messages lost on the way (seq gaps) plus malformed messages thrown away."""
        return self.tracker.missed + self.malformed

    def drain(self) -> None:
        """Read every waiting message, keep the newest per topic, emit them once (nothing once closed)."""
        if self._sub.closed:
            return
        newest: dict[str, Message] = {}
        for _ in range(MAX_DRAIN):
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                message = decode(frames, expect=VIEW_TOPICS)
            except ProtocolError:
                self.malformed += 1
                continue
            self.tracker.update(message)
            newest[message.topic] = message
        else:  # more are waiting: continue after the event loop had its turn
            QtCore.QTimer.singleShot(0, self.drain)
        self._drain_control()
        if newest:
            self.last_message = time.monotonic()
            stats = newest.get("stats")
            if stats is not None:
                self._follow_control(stats.header.get("control"))
            self.messages.emit(newest)

    # ---- control channel -----------------------------------------------------------------------------------

    def _follow_control(self, advertised: Any) -> None:
        """Connect to the control endpoint a ``stats`` message advertises (a bad one is ignored here; the window
        drops and counts that message)."""
        if not isinstance(advertised, str) or endpoint_problem(advertised) is not None:
            return
        endpoint = control_endpoint(self.endpoint, advertised)
        if endpoint == self._control_endpoint:
            return
        self._close_control()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a server that is not there (no stale commands)
        try:
            socket.connect(endpoint)
        except zmq.ZMQError:  # e.g. a host name ZMQ refuses: no control, but the data keeps coming
            socket.close(0)
            return
        self._control, self._control_endpoint = socket, endpoint
        self._control_notifier = self._notifier(socket, self._drain_control)

    @property
    def control_endpoint(self) -> str | None:
        """The server's control endpoint this client is connected to (None until a valid one is advertised)."""
        return self._control_endpoint

    def send_control(self, command: str, **args: Any) -> bool:
        """Send a control request (``play``, ``pause``, ``speed``, ``seek``, ``record_start``, ...) without waiting;
        False when no server is reachable. The reply comes as ``control_reply``."""
        if self._control is None:
            return False
        try:
            self._control.send_multipart([b"", *encode_control(self._control_seq, command, **args)], zmq.NOBLOCK)
        except zmq.Again:
            return False
        finally:
            self._drain_control()
        self._control_seq += 1
        return True

    def _drain_control(self) -> None:
        while self._control is not None:
            try:
                frames = self._control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:  # DEALER sees the REP envelope's empty delimiter first
                reply = decode_reply(decode(frames[1:], expect=("control",)))
            except ProtocolError:
                self.malformed += 1
                continue
            self.control_reply.emit(reply)

    def _close_control(self) -> None:
        if self._control_notifier is not None:
            self._control_notifier.setEnabled(False)
            self._control_notifier.deleteLater()
        if self._control is not None:
            self._control.close(0)
        self._control = self._control_notifier = self._control_endpoint = None

    def close(self) -> None:
        """Stop reading and close the sockets."""
        self._timer.stop()
        self._sub_notifier.setEnabled(False)
        self._close_control()
        self._sub.close(0)
