"""Publish event batches over ZMQ (topic ``events``, ``mem_core.protocol`` wire format) without ever blocking.

A recorder must not slow down because a subscriber is slow: the PUB socket has a small send high-water mark, and a
message that does not fit is dropped (and counted) instead of waited for. A subscriber at its high-water mark holds
the message back from every subscriber (``XPUB_NODROP``), which is what makes drops countable. ``seq`` still advances for a dropped
message, so subscribers see the gap.

Closing lingers briefly (``CLOSE_LINGER_MS``) instead of not at all: with a zero linger, libzmq 4.3 aborts the whole
process (``session_base.cpp:233``) when a subscriber whose connection is stalled mid-message dies just after the
publisher closed - the session then looks for the rest of a multipart message in a pipe that was already dropped.
"""

from __future__ import annotations

import re

import numpy as np
import zmq

from mem_core.events import SensorSize
from mem_core.protocol import encode_events, endpoint_problem
from recorders.base import Closing, RecorderError

DEFAULT_HOST = "127.0.0.1"
CLOSE_LINGER_MS = 200  # see the module docstring; bounds how long a context term waits for a stalled peer


def normalize_address(address: str) -> str:
    """``PORT``, ``HOST:PORT`` or ``tcp://HOST:PORT`` as a ZMQ endpoint; the host defaults to 127.0.0.1."""
    address = address.strip()
    if "://" in address:
        endpoint = address
    else:
        host, _, port = address.rpartition(":")
        endpoint = f"tcp://{host or DEFAULT_HOST}:{port}"
    if (problem := bind_problem(endpoint)) is not None:
        raise RecorderError(f"publish address {address!r}: {problem} (PORT, HOST:PORT, tcp://HOST:PORT or ipc://PATH)")
    return endpoint


def bind_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` cannot be bound, or None: checked as a client's endpoint (``protocol.endpoint_problem``),
    with ``*`` taken for a host (every interface) and ``*`` or 0 for a port (any free one). ZMQ took a port of
    5,000 digits."""
    return endpoint_problem(re.sub(r":(\*|0)$", ":1", endpoint.replace("tcp://*:", "tcp://0.0.0.0:", 1)))


class EventPublisher(Closing):
    """A bound PUB socket sending ``events`` messages; ``sent`` and ``dropped`` count messages."""

    def __init__(self, address: str, *, sndhwm: int = 8, context: zmq.Context | None = None) -> None:
        self.address = normalize_address(address)
        self._socket = (context or zmq.Context.instance()).socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, sndhwm)
        # A plain PUB drops silently at the high-water mark; with NODROP it says so (EAGAIN) and the drop is counted.
        self._socket.setsockopt(zmq.XPUB_NODROP, 1)
        self._socket.setsockopt(zmq.LINGER, CLOSE_LINGER_MS)
        try:
            self._socket.bind(self.address)
        except zmq.ZMQError as e:
            self._socket.close()
            raise RecorderError(f"cannot publish on {self.address}: {e}") from e
        self.seq = 0
        self.sent = 0
        self.dropped = 0

    def publish(self, events: np.ndarray, sensor: SensorSize) -> bool:
        """Send one batch; False (and counted as dropped) when the socket's queue is full."""
        frames = encode_events(self.seq, events, sensor)
        self.seq += 1
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self._socket.close()
