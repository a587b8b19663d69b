"""What the inference loop of ``mem serve`` counts, and the rates and latencies its ``stats`` messages report."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

LATENCY_HISTORY = 100_000  # (time, latency) pairs kept for benchmarks
LATENCY_SPAN_S = 2.0  # the latency percentiles of a stats message cover this many seconds


class LoopStats:
    """Counters of the inference loop (its thread writes them; other threads only read).

    ``frames`` counts predictions, ``windows`` published windows (the ``frame`` id; sensor views while the model
    loads included), ``skipped_windows`` windows that came and went while the loop was busy; ``latencies`` holds
    (publish time, latency) in monotonic seconds (read it with ``list()``: atomic under the GIL); ``last_window``
    and ``last_stages`` describe the newest window and what each stage of it cost.
    """

    def __init__(self) -> None:
        self.frames = 0
        self.windows = 0
        self.skipped_windows = 0
        self.latencies: deque[tuple[float, float]] = deque(maxlen=LATENCY_HISTORY)
        self.last_window: dict[str, Any] = {}
        self.last_stages: dict[str, float] = {}
        self._unseen_events = 0
        self._mark = (time.monotonic(), 0, 0)  # (time, events, frames) at the last report

    def count_unseen(self, new_events: int, held: int, window_events: int) -> None:
        """Of ``new_events`` since the last window only the ``held`` newest were seen: the others, in whole windows
        of ``window_events``, are skipped."""
        self._unseen_events += max(0, new_events - held)
        self.skipped_windows = self._unseen_events // window_events

    def report(self, events_total: int) -> dict[str, Any]:
        """The counting part of a ``stats`` message; rates are over the time since the previous report, and
        ``events_total`` counts every event received."""
        now, frames = time.monotonic(), self.frames
        t0, total0, frames0 = self._mark
        self._mark = (now, events_total, frames)
        dt = max(now - t0, 1e-9)
        window = self.last_window
        return {
            "events_per_s": (events_total - total0) / dt,
            "predictions_per_s": (frames - frames0) / dt,
            "predictions": frames,
            "window_events": window.get("events", 0),
            "window_ms": (window["t_last_us"] - window["t_first_us"]) / 1e3 if window else 0.0,
            "latency_ms": self._latency_ms(now),
            "stages_ms": self.last_stages,
            "skipped_windows": self.skipped_windows,
        }

    def _latency_ms(self, now: float) -> dict[str, float]:
        """The newest latency and the percentiles of the last ``LATENCY_SPAN_S`` (empty without any)."""
        recent = []  # newest first
        for t, lat in reversed(self.latencies):
            if t < now - LATENCY_SPAN_S:
                break
            recent.append(lat)
        if not recent:
            return {}
        p50, p95 = np.percentile(recent, [50, 95]) * 1e3
        return {"last": recent[0] * 1e3, "p50": float(p50), "p95": float(p95)}
