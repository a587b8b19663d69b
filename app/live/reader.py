"""The reader thread of ``mem serve``: the live source's batches into the ring of newest events, each stamped with
its arrival time, and into the recording while one runs; between batches, the replay's commands."""

from __future__ import annotations

import threading
import time

import numpy as np

from app.live.replay_control import ReplayController
from app.live.ring import EventRing
from mem_core.events import SensorSize
from recorders.base import LiveSource
from recorders.live_recorder import LiveRecorder


class SourceReader:
    """Reads ``source`` into ``ring`` (``run``, in its own thread); ``sensor`` is the geometry of the held events,
    ``done`` says the source ended (or failed), and ``wake`` is set whenever either changes or events arrive."""

    def __init__(
        self,
        source: LiveSource,
        ring: EventRing,
        wake: threading.Event,
        *,
        recorder: LiveRecorder | None = None,
        replay: ReplayController | None = None,
    ) -> None:
        self.source, self.ring, self._wake = source, ring, wake
        self.recorder, self.replay = recorder, replay
        self.sensor: SensorSize | None = None
        self.done = False

    def run(self, stop: threading.Event) -> None:
        """Read until the source ends or ``stop`` is set; raises what the source raised."""
        last_t: int | None = None
        if self.replay is not None:
            self.replay.reading = True
        try:
            for batch in self.source:
                if stop.is_set():
                    break
                if len(batch):
                    last_t = self._take(batch, last_t)
                if self.replay is not None:
                    self.replay.apply_pending()  # between batches: the next batch is the first after a seek
        finally:
            if self.replay is not None:
                self.replay.reading = False
            self.done = True
            self._wake.set()

    def _take(self, batch: np.ndarray, last_t: int | None) -> int:
        """Put a batch into the ring (and the recording); returns its newest time."""
        arrival = time.monotonic()
        sensor = SensorSize(*self.source.sensor)
        if sensor != self.sensor or (last_t is not None and int(batch["t"][0]) < last_t):
            self.ring.clear()  # a new stream (another sensor or a restarted publisher)
            self.sensor = sensor
        if self.replay is not None:
            self.replay.track(batch)  # before the push: a window never holds events of an unknown position
        self.ring.push(batch, arrival)
        if self.recorder is not None:
            self.recorder.append(batch, sensor, self.source.metadata)
        self._wake.set()
        return int(batch["t"][-1])
