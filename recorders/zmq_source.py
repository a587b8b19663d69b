"""A live source that subscribes to event batches published over ZMQ (``mem record --publish``)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import zmq

from mem_core.events import SensorSize
from mem_core.limits import MAX_EVENT_QUEUE_BYTES, MAX_EVENTS_BYTES, MAX_EVENTS_FRAMES
from mem_core.protocol import ProtocolError, decode, decode_events
from recorders.base import LiveSource, RecorderError, empty_batch
from recorders.zmq_receive import recv_bounded

POLL_MS = 50  # longest wait before a heartbeat (empty batch), so the consumer can check its stop flag
MAX_QUEUED_BYTES = MAX_EVENT_QUEUE_BYTES
RCVHWM = 16  # messages ZMQ itself may hold: a thread of this source drains them into the queue as they come


class ZmqEventSource(LiveSource):
    """SUB to the ``events`` topic at ``endpoint``; batches as they come, malformed messages dropped and counted.

    A thread receives and checks the messages while the consumer works, holding at most ``MAX_QUEUED_BYTES`` of
    events for it; batches beyond that are dropped and counted (``dropped``), as a full ZMQ queue would drop them.
    ``sensor`` is None until the first batch arrives and follows the publisher (a restarted publisher may bring
    another sensor). ``close`` may be called from any thread.
    """

    def __init__(self, endpoint: str, context: zmq.Context | None = None) -> None:
        self.endpoint = endpoint
        self.sensor = None
        self.metadata = {"kind": "tcp", "model": "zmq", "serial": endpoint, "endpoint": endpoint}
        self.malformed = 0
        self.dropped = 0
        self._context = context or zmq.Context.instance()
        self._closed = threading.Event()
        self._queue: collections.deque[tuple[np.ndarray, SensorSize]] = collections.deque()
        self._queued_bytes = 0
        self._arrived = threading.Condition()
        self._failure: zmq.ZMQError | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, RCVHWM)
        socket.setsockopt(zmq.SUBSCRIBE, b"events")
        try:
            socket.connect(self.endpoint)
        except zmq.ZMQError:
            socket.close(0)
            raise
        stop = threading.Event()  # the socket belongs to the receiving thread from here on
        receiver = threading.Thread(target=self._receive, args=(socket, stop), name="zmq-source", daemon=True)
        receiver.start()
        try:
            while not self._closed.is_set():
                if not receiver.is_alive():
                    raise RecorderError(f"{self.endpoint}: receiving stopped ({self._failure})")
                with self._arrived:
                    if not self._queue:
                        self._arrived.wait(POLL_MS / 1000)
                    if not self._queue:
                        item = None
                    else:
                        item = self._queue.popleft()
                        self._queued_bytes -= item[0].nbytes
                if item is None:
                    yield empty_batch()
                    continue
                events, self.sensor = item
                self.metadata.update(height=self.sensor.height, width=self.sensor.width)
                yield events
        finally:
            stop.set()
            receiver.join()

    def _receive(self, socket: zmq.Socket, stop: threading.Event) -> None:
        """Receive, check and queue batches until ``stop`` or ``close``, then close the socket."""
        try:
            while not (stop.is_set() or self._closed.is_set()):
                if socket.poll(POLL_MS, zmq.POLLIN):
                    frames = recv_bounded(socket, MAX_EVENTS_FRAMES, MAX_EVENTS_BYTES)
                    if frames is None:  # dropped as it was read: larger than any batch the queue could take
                        self.malformed += 1
                    else:
                        self._put(self._decode([f.buffer for f in frames]))
        except zmq.ZMQError as e:  # the context was terminated: the iterating thread reports it
            self._failure = e
        finally:
            socket.close(0)

    def _put(self, item: tuple[np.ndarray, SensorSize] | None) -> None:
        if item is None:
            return
        with self._arrived:
            if self._queued_bytes + item[0].nbytes > MAX_QUEUED_BYTES:
                self.dropped += 1
                return
            self._queue.append(item)
            self._queued_bytes += item[0].nbytes
            self._arrived.notify()

    def accept(self, frames: Sequence[bytes] | Sequence[memoryview]) -> np.ndarray | None:
        """The checked batch of one received message, or None when it is malformed (then counted, never raised)."""
        item = self._decode(frames)
        if item is None:
            return None
        events, self.sensor = item
        self.metadata.update(height=self.sensor.height, width=self.sensor.width)
        return events

    def _decode(self, frames: Sequence[bytes] | Sequence[memoryview]) -> tuple[np.ndarray, SensorSize] | None:
        try:
            return decode_events(decode(frames, expect=("events",)))
        except ProtocolError:
            self.malformed += 1
            return None

    def close(self) -> None:
        self._closed.set()
