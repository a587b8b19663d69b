"""The simulated event camera (``mem_core.simulator``) as a live source, in real time or faster."""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterator
from dataclasses import asdict

import numpy as np

from mem_core.simulator import EventSimulator, SimulatorConfig
from recorders.base import LiveSource, Pacer


class SimulatorSource(LiveSource):
    """The simulated event camera (``mem_core.simulator``) as a live source, in real time or faster.

    ``speed`` 1.0 delivers each ``batch_us`` batch when its end time is due, like a camera; 0 delivers as fast as
    the simulator computes. ``duration_us`` ends the stream (endless by default). ``classes_at(t)`` names the
    objects in view at a recent time ``t``: the ground truth of a live window.
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
        self._pacer = Pacer(speed)
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

    def __iter__(self) -> Iterator[np.ndarray]:
        self._pacer.wait(self.simulator.time_us)
        for batch in self.simulator.stream(self.duration_us, self.batch_us):
            self._pacer.wait(self.simulator.time_us)  # a batch is delivered once its last microsecond has passed
            names = self.simulator.classes
            self._scenes.append((self.simulator.time_us, [names[c] for c in self.simulator.object_classes]))
            yield batch
