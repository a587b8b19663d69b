"""The simulated event camera (``mem_core.simulator``) as a live source, in real time or faster."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

import numpy as np

from mem_core.simulator import EventSimulator, SimulatorConfig
from recorders.base import LiveSource, Pacer


class SimulatorSource(LiveSource):
    """The simulated event camera (``mem_core.simulator``) as a live source, in real time or faster.

    ``speed`` 1.0 delivers each ``batch_us`` batch when its end time is due, like a camera; 0 delivers as fast as
    the simulator computes. ``duration_us`` ends the stream (endless by default).
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

    def __iter__(self) -> Iterator[np.ndarray]:
        self._pacer.wait(self.simulator.time_us)
        for batch in self.simulator.stream(self.duration_us, self.batch_us):
            self._pacer.wait(self.simulator.time_us)  # a batch is delivered once its last microsecond has passed
            yield batch
