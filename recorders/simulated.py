"""The simulated event camera (``mem_core.simulator``) as a live source, in real time or faster, that can pause."""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Iterator
from dataclasses import asdict

import numpy as np

from mem_core.simulator import EventSimulator, SimulatorConfig
from mem_core.simulator.camera import concatenate
from recorders.base import HEARTBEAT_S, PausableSource, empty_batch

STEP_LIMIT_US = 10_000_000  # a step without a time span simulates at most this long for its events (an empty scene)


class SimulatorSource(PausableSource):
    """The simulated event camera (``mem_core.simulator``) as a live source, in real time or faster.

    ``speed`` 1.0 delivers each ``batch_us`` batch when its end time is due, like a camera; 0 delivers as fast as
    the simulator computes. ``duration_us`` ends the stream (endless by default). ``classes_at(t)`` names the
    objects in view at a recent time ``t``: the ground truth of a live window.

    Unlike a camera it can pause, so a picture can be looked at or labelled: ``pause()``, ``resume()``, ``step`` (the
    next window, simulated while paused) and ``speed`` are for the thread iterating, between two batches
    (``app.live.replay_control.ReplayController`` hands them to it). Simulated time stands still while paused.
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        *,
        object_classes: list[int] | None = None,
        batch_us: int = 10_000,
        speed: float = 1.0,
        duration_us: int | None = None,
    ) -> None:
        self.simulator = EventSimulator(config, object_classes=object_classes)
        self.sensor = self.simulator.sensor
        self.batch_us, self.duration_us = batch_us, duration_us
        super().__init__(speed)
        self._shots: collections.deque[np.ndarray] = collections.deque()  # stepped windows to deliver next
        self._ahead: np.ndarray | None = None  # the next batch, simulated before it is due
        cfg = self.simulator.config
        self.metadata = {
            "kind": "sim",
            "model": "MEM simulator",
            "serial": f"sim-seed{cfg.seed}",
            "height": self.sensor.height,
            "width": self.sensor.width,
            "simulator": asdict(cfg),
            "object_classes": self.simulator.object_classes,
        }
        # (end time, class names in view) of the last batches: ~10 s at the default batch_us
        self._scenes: collections.deque[tuple[int, list[str]]] = collections.deque(maxlen=1000)

    def classes_at(self, t_us: int) -> list[str] | None:
        """Class names of the objects in view at time ``t_us`` (None: no longer or not yet known)."""
        scenes = list(self._scenes)  # (a copy: the reader thread appends)
        i = bisect.bisect_right([end for end, _ in scenes], t_us)
        if i == len(scenes) or (i == 0 and len(scenes) == self._scenes.maxlen):
            return None
        return scenes[i][1]

    # ---- controls ------------------------------------------------------------------------------------------

    def step(self, events: int, span_us: int | None) -> int | None:
        """Simulate the next window at once, paused or not: ``span_us`` of time (None: until it holds ``events``
        events, at most ``STEP_LIMIT_US``), delivered next. Returns the time of its end (None: the stream ended)."""
        parts = [self._ahead] if self._ahead is not None else []  # computed, not yet delivered: it comes first
        self._ahead, count, start = None, 0, self.simulator.time_us
        limit = span_us if span_us is not None else STEP_LIMIT_US
        while self.simulator.time_us - start < limit and (span_us is not None or count < events) and not self._ended():
            parts.append(self._simulate(min(self.batch_us, limit - (self.simulator.time_us - start))))
            count += len(parts[-1])
        if not parts:
            return None
        self._shots.append(concatenate(parts))
        return self.simulator.time_us

    # ---- the stream ----------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[np.ndarray]:
        self._pacer.reset()
        while True:
            if self._shots:
                yield self._shots.popleft()
                self._pacer.reset()
                continue
            if self._paused:
                time.sleep(HEARTBEAT_S)
                yield empty_batch()
                continue
            if self._ahead is None:
                if self._ended():
                    return
                self._ahead = self._simulate(self.batch_us)  # computed ahead, delivered when its end is due
            delay = self._pacer.delay(self.simulator.time_us)
            if delay > HEARTBEAT_S:  # stay responsive to pause and the consumer
                time.sleep(HEARTBEAT_S)
                yield empty_batch()
                continue
            if delay > 0:
                time.sleep(delay)
            batch, self._ahead = self._ahead, None
            yield batch

    def _ended(self) -> bool:
        return self.duration_us is not None and self.simulator.time_us >= self.duration_us

    def _simulate(self, duration_us: int) -> np.ndarray:
        """The next ``duration_us`` of events (clipped to the stream's end), noting the objects in view."""
        if self.duration_us is not None:
            duration_us = min(duration_us, self.duration_us - self.simulator.time_us)
        batch = self.simulator.simulate(duration_us)
        names = self.simulator.classes
        self._scenes.append((self.simulator.time_us, [names[c] for c in self.simulator.object_classes]))
        return batch
