"""A preallocated ring of the newest events, filled by the reader thread and read by the inference loop."""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from mem_core.events import EVENT_DTYPE

_ITEMSIZE = EVENT_DTYPE.itemsize


class RingSnapshot(NamedTuple):
    events: np.ndarray  # the newest events, oldest first (a copy)
    total: int  # events pushed since the ring was created (never decreases)
    arrival: float  # time.monotonic() when the newest event arrived (nan when empty)


class EventRing:
    """The newest ``capacity`` events. ``push``, ``snapshot`` and ``resize`` may run in different threads.

    A push copies at most ``capacity`` events (the newest of the batch), so a source delivering far more events
    than a window holds costs little here: everything older than the newest window is never copied.
    """

    def __init__(self, capacity: int) -> None:
        _check_capacity(capacity)
        self.capacity = capacity
        self._bytes = np.empty(capacity * _ITEMSIZE, dtype=np.uint8)  # the events' raw bytes
        self._lock = threading.Lock()
        self._head = 0  # where the next event goes
        self._size = 0
        self._total = 0
        self._arrival = float("nan")

    def push(self, events: np.ndarray, arrival: float) -> None:
        """Append a time-sorted batch that arrived at ``arrival`` (monotonic seconds)."""
        n = len(events)
        if n == 0:
            return
        with self._lock:  # (the capacity may change between pushes)
            # Copy raw bytes: numpy copies the packed 15-byte EVENT_DTYPE element by element, ~20x slower.
            keep = np.ascontiguousarray(events[-self.capacity :]).view(np.uint8)
            k = len(keep) // _ITEMSIZE
            first = min(k, self.capacity - self._head)
            self._bytes[self._head * _ITEMSIZE : (self._head + first) * _ITEMSIZE] = keep[: first * _ITEMSIZE]
            self._bytes[: (k - first) * _ITEMSIZE] = keep[first * _ITEMSIZE :]
            self._head = (self._head + k) % self.capacity
            self._size = min(self._size + k, self.capacity)
            self._total += n
            self._arrival = arrival

    def snapshot(self, n: int | None = None) -> RingSnapshot:
        """A copy of the newest ``min(n, capacity)`` events (all held events when ``n`` is None)."""
        with self._lock:
            raw = self._newest_bytes(self._size if n is None else min(n, self._size))
            return RingSnapshot(raw.view(EVENT_DTYPE), self._total, self._arrival)

    def resize(self, capacity: int) -> None:
        """Hold up to ``capacity`` events from now on, keeping the newest of those held."""
        _check_capacity(capacity)
        with self._lock:
            raw = self._newest_bytes(min(self._size, capacity))
            self._bytes = np.empty(capacity * _ITEMSIZE, dtype=np.uint8)
            self._bytes[: len(raw)] = raw
            self.capacity = capacity
            self._size = len(raw) // _ITEMSIZE
            self._head = self._size % capacity

    def _newest_bytes(self, k: int) -> np.ndarray:
        """A copy of the raw bytes of the newest ``k`` held events, oldest first (call with the lock held)."""
        start = (self._head - k) % self.capacity
        if start + k <= self.capacity:
            return self._bytes[start * _ITEMSIZE : (start + k) * _ITEMSIZE].copy()
        return np.concatenate([self._bytes[start * _ITEMSIZE :], self._bytes[: self._head * _ITEMSIZE]])

    @property
    def total(self) -> int:
        """Events pushed so far (a cheap change check for the inference loop)."""
        return self._total

    def clear(self) -> None:
        """Forget the held events (a new sensor, a seek); ``total`` keeps counting."""
        with self._lock:
            self._head = self._size = 0
            self._arrival = float("nan")


def _check_capacity(capacity: int) -> None:
    if capacity <= 0:
        raise ValueError(f"ring capacity must be positive, got {capacity}")
