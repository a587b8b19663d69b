"""What every live source is: an iterable of event batches on one sensor, plus the pacing helper they share.

A source (``LiveSource``) is iterated for event batches: ``EVENT_DTYPE`` arrays sorted by ``t``, and ``t`` never goes
back from one batch to the next (loops and seeks shift time forward instead). It carries ``sensor`` and
``metadata`` (JSON-serialisable: kind, model, serial, ...). An empty batch is a heartbeat: nothing new yet, but the
consumer gets the chance to check its own stop conditions, so a waiting source never blocks a recorder for long.
Batches may be views into the source's memory: copy them before modifying them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, Self

import numpy as np

from mem_core.errors import MemError
from mem_core.events import EVENT_DTYPE, SensorSize
from mem_core.fields import Speed, check_value

HEARTBEAT_S = 0.05  # longest a paused or waiting source stays silent


class RecorderError(MemError):
    """A source, recording or ingest problem to show the user as one line (names what is wrong)."""


class Closing:
    """``with obj:`` calls ``obj.close()`` at the end (sources, publishers, capture corpora)."""

    def close(self) -> None:
        """Release what the object holds (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


class LiveSource(Closing, ABC):
    """An endless or finite stream of event batches on one sensor; use as a context manager or call ``close``."""

    sensor: SensorSize
    metadata: dict[str, Any]

    @abstractmethod
    def __iter__(self) -> Iterator[np.ndarray]:
        """Event batches (``EVENT_DTYPE``, time-sorted across batches); empty batches are heartbeats."""


class Pacer:
    """Sleeps so that event time advances at ``speed`` times wall-clock time (``fields.Speed``: a ``FieldError``
    outside it); ``speed`` 0 means no waiting."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._anchor: tuple[int, float] | None = None  # (event time, wall time) that pacing counts from

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        self._speed = check_value("speed", value, Speed)

    def reset(self) -> None:
        """Forget the anchor (after a pause, seek or speed change): the next ``wait`` starts a new timeline."""
        self._anchor = None

    def delay(self, t_us: int) -> float:
        """Seconds until event time ``t_us`` is due (<= 0: due now); the first call anchors the timeline."""
        if self.speed == 0:
            return 0.0
        now = time.monotonic()
        if self._anchor is None:
            self._anchor = (t_us, now)
        t0, wall0 = self._anchor
        return wall0 + (t_us - t0) / (self.speed * 1e6) - now

    def wait(self, t_us: int) -> None:
        """Return when event time ``t_us`` is due."""
        delay = self.delay(t_us)
        if delay > 0:
            time.sleep(delay)


class PausableSource(LiveSource):
    """A source that paces its batches at ``speed`` times real time and can pause (a replay, the simulator):
    ``pause()``, ``resume()`` and ``speed`` are for the thread iterating, between two batches
    (``app.live.replay_control.ReplayController`` hands them to it); subclasses read ``_paused`` and pace with
    ``_pacer``, and deliver heartbeats while paused."""

    def __init__(self, speed: float) -> None:
        self._pacer = Pacer(speed)
        self._paused = False

    @property
    def speed(self) -> float:
        return self._pacer.speed

    @speed.setter
    def speed(self, value: float) -> None:
        self._pacer.speed = value  # checked there
        self._pacer.reset()

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._pacer.reset()


def empty_batch() -> np.ndarray:
    """A heartbeat batch (no events)."""
    return np.empty(0, dtype=EVENT_DTYPE)
