"""Uniform random events at a fixed rate, in real time: a load-test source for ``mem serve`` and its benchmark."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mem_core.events import SensorSize, make_events
from recorders.base import LiveSource, Pacer

SENSOR = SensorSize(240, 320)
BATCH_US = 2000


class SyntheticSource(LiveSource):
    """Uniform random events at ``rate`` events/s on ``sensor``, delivered in real time in batches of ``batch_us``.

    Every batch is the same random template shifted in time (a memcpy, so very high rates cost the source little);
    ``delivered`` counts the events handed out.
    """

    def __init__(self, rate: float, sensor: SensorSize = SENSOR, batch_us: int = BATCH_US, seed: int = 0) -> None:
        if not rate > 0 or batch_us <= 0:
            raise ValueError(f"rate and batch_us must be positive, got {rate} events/s, {batch_us} us")
        self.sensor, self.rate, self.batch_us = sensor, rate, batch_us
        self.metadata = {
            "kind": "synthetic",
            "model": "uniform random events",
            "serial": f"{rate / 1e6:g}Mev/s",
            "height": sensor.height,
            "width": sensor.width,
        }
        n = round(rate * batch_us / 1e6)
        rng = np.random.default_rng(seed)
        t = np.sort(rng.integers(0, batch_us, n))
        self._template = make_events(
            t, rng.integers(0, sensor.width, n), rng.integers(0, sensor.height, n), rng.integers(0, 2, n)
        )
        self._closed = False
        self.delivered = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        pacer = Pacer(1.0)
        t0 = 0
        while not self._closed:
            pacer.wait(t0 + self.batch_us)
            batch = self._template.view(np.uint8).copy().view(self._template.dtype)  # raw bytes: a plain memcpy
            batch["t"] += t0
            t0 += self.batch_us
            self.delivered += len(batch)
            yield batch

    def close(self) -> None:
        self._closed = True
