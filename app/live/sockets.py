"""The sockets of ``mem serve``: the PUB socket its messages go out on and the REP socket of its control."""

from __future__ import annotations

from typing import Any

import numpy as np
import zmq

from mem_core.configuration import ConfigError
from mem_core.limits import MAX_HEADER_BYTES
from mem_core.protocol import encode
from recorders.publish import CLOSE_LINGER_MS, bind_problem

TOPICS = ("sensor", "hist", "tokens", "pred", "stats")


def control_endpoint_for(pub: str) -> str:
    """The default control endpoint: same host, port + 1 (any port, ``*`` or ``0``, stays any port: port 1 is a
    privileged port, and every server given port 0 would want it); ``ipc://X`` -> ``ipc://X-control``."""
    if not pub.startswith("tcp://"):
        return pub + "-control"
    host, sep, port = pub.rpartition(":")
    if not sep or host == "tcp":
        raise ConfigError(f"endpoint {pub!r} has no port (expected tcp://HOST:PORT)")
    if port == "*" or set(port) == {"0"}:
        return pub
    if not port.isdigit():
        raise ConfigError(f"endpoint {pub!r} has a bad port {port!r}")
    if (problem := bind_problem(pub)) is not None:  # before int(): 5,000 digits are no port either
        raise ConfigError(f"endpoint {pub!r}: {problem}")
    return f"{host}:{int(port) + 1}"


def bind(context: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    """A socket of ``kind`` bound to ``endpoint``; ``zmq.ZMQError`` names the endpoint it could not bind."""
    socket = context.socket(kind)
    # a PUB socket with a zero linger can abort libzmq on close (see recorders.publish); the others need none
    socket.setsockopt(zmq.LINGER, CLOSE_LINGER_MS if kind == zmq.PUB else 0)
    if kind == zmq.PUB:
        socket.setsockopt(zmq.SNDHWM, 16)  # a slow subscriber loses old messages, the server never waits
    if kind == zmq.REP:  # a control request's largest frame is its header: a larger one is refused by ZMQ unread
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES)
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as exc:
        socket.close(0)
        raise zmq.ZMQError(exc.errno, f"cannot bind {endpoint}: {exc.strerror}") from None
    return socket


class Publisher:
    """Sends each topic's messages on a PUB socket, numbered per topic (a viewer counts the gaps)."""

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self._seq = dict.fromkeys(TOPICS, 0)

    def send(self, topic: str, arrays: dict[str, np.ndarray] | None = None, **fields: Any) -> None:
        """Encode and send one message; PUB drops it, never waits, when a subscriber lags."""
        frames = encode(topic, self._seq[topic], arrays, **fields)
        self._seq[topic] += 1
        self.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
