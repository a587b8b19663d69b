"""A live source that subscribes to event batches published over ZMQ (``mem record --publish``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import zmq

from mem_core.protocol import ProtocolError, decode, decode_events
from recorders.base import LiveSource, empty_batch

POLL_MS = 50  # longest wait before a heartbeat (empty batch), so the consumer can check its stop flag


class ZmqEventSource(LiveSource):
    """SUB to the ``events`` topic at ``endpoint``; batches as they come, malformed messages dropped and counted.

    ``sensor`` is None until the first batch arrives and follows the publisher (a restarted publisher may bring
    another sensor). The socket lives in the iterating thread; ``close`` may be called from any thread.
    """

    def __init__(self, endpoint: str, context: zmq.Context | None = None) -> None:
        self.endpoint = endpoint
        self.sensor = None
        self.metadata = {"kind": "tcp", "model": "zmq", "serial": endpoint, "endpoint": endpoint}
        self.malformed = 0
        self._context = context or zmq.Context.instance()
        self._closed = False

    def __iter__(self) -> Iterator[np.ndarray]:
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, 1000)
        socket.setsockopt(zmq.SUBSCRIBE, b"events")
        socket.connect(self.endpoint)
        try:
            while not self._closed:
                if not socket.poll(POLL_MS, zmq.POLLIN):
                    yield empty_batch()
                    continue
                frames = socket.recv_multipart(copy=False)
                events = self.accept([f.buffer for f in frames])
                if events is not None:
                    yield events
        finally:
            socket.close(0)

    def accept(self, frames: Sequence[bytes] | Sequence[memoryview]) -> np.ndarray | None:
        """The checked batch of one received message, or None when it is malformed (then counted, never raised)."""
        try:
            events, sensor = decode_events(decode(frames, expect=("events",)))
        except ProtocolError:
            self.malformed += 1
            return None
        self.sensor = sensor
        self.metadata.update(height=sensor.height, width=sensor.width)
        return events

    def close(self) -> None:
        self._closed = True
