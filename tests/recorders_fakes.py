"""A fake event camera backend for the recorder tests: cameras that deliver batches, unplug and come back."""

from __future__ import annotations

import numpy as np

from mem_core.events import SensorSize
from recorders.camera import CameraInfo

SENSOR = SensorSize(32, 48)


class FakeCamera:
    """An opened fake camera delivering ``batches`` (its own clock), then unplugged if ``unplug`` is set."""

    def __init__(self, sensor: SensorSize, batches: list[np.ndarray], unplug: bool, rig: FakeRig) -> None:
        self.sensor, self._batches, self._unplug, self._rig = sensor, list(batches), unplug, rig
        self.closed = False

    def read(self) -> np.ndarray | None:
        if not self._batches:
            if self._unplug:
                self._rig.plugged = False
                raise RuntimeError("device disconnected")
            return None
        return self._batches.pop(0)

    def is_running(self) -> bool:
        return self._rig.plugged

    def close(self) -> None:
        self.closed = True


class FakeRig:
    """A fake ``CameraBackend``: cameras by serial, each a list of connections (batches per connection)."""

    def __init__(self, cameras: dict[str, list[list[np.ndarray]]], sensor=SENSOR, away_polls=0):
        self.cameras, self.sensor = cameras, sensor
        self.plugged = True
        self.away_polls = away_polls  # discover() calls that find nothing after an unplug
        self.opened: list[FakeCamera] = []

    def discover(self) -> list[CameraInfo]:
        if not self.plugged:
            if self.away_polls > 0:
                self.away_polls -= 1
                return []
            self.plugged = True
        return [CameraInfo("DVXPLORER", serial) for serial in self.cameras]

    def open(self, serial: str) -> FakeCamera:
        connections = self.cameras[serial]
        batches = connections[len(self.opened)] if len(self.opened) < len(connections) else []
        camera = FakeCamera(self.sensor, batches, unplug=len(self.opened) < len(connections) - 1, rig=self)
        self.opened.append(camera)
        return camera


def clock_batches(events_factory, seeds, t0=1_000_000) -> list[np.ndarray]:
    return [events_factory(500, seed=s, t0=t0 + 100_000 * k) for k, s in enumerate(seeds)]
