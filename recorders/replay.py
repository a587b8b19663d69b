"""Replay as a live source: events replayed at real time or faster, looping, with pause, seek, speed changes and
window-sized steps. ``ReplaySource`` replays an event file; ``recorders.corpus_replay.CorpusReplaySource`` the
recordings of a corpus.

``Replay`` holds what both share: a sequence of *segments* (a file is one; a corpus replays one recording or several
in order) laid on one timeline, each segment beginning 1 us after the previous one ends (the segments of one recorded
session keep the time between them), so a position (``seek``) addresses the whole sequence and time never goes back
from one segment to the next.
"""

from __future__ import annotations

import bisect
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mem_core.events import EVENT_DTYPE, MAX_ABS_TIME_US, SensorSize
from mem_core.io import read_events
from recorders.base import HEARTBEAT_S, PausableSource, RecorderError, empty_batch


class Segment(NamedTuple):
    """A stretch of replayed events: its sensor, event count and first and last event times (us); ``continues``: it
    continues the previous segment's clock (the next segment of a recorded session), the time between them is kept."""

    sensor: SensorSize
    n_events: int
    t_min: int
    t_max: int
    continues: bool = False


class Replay(PausableSource):
    """``segments`` replayed one after another at ``speed`` times real time (0 = as fast as possible), over and over
    with ``loop``, in batches spanning ``batch_us``. Subclasses say where the events are (``_read``, ``_block``,
    ``_index``) and may follow the segment being replayed (``_entered``).

    ``pause()``, ``resume()``, ``seek(t_us)``, ``preview``, ``step`` and ``speed`` are for the thread iterating, between
    two batches (``app.live.replay_control.ReplayController`` hands them to it). Time stays monotonic: each new loop
    and each backward seek continues just after the last delivered event, so a recorder can store the replay as one
    recording.
    """

    def __init__(self, segments: list[Segment], where: str, *, speed: float, loop: bool, batch_us: int) -> None:
        if batch_us <= 0:
            raise ValueError(f"batch_us must be > 0, got {batch_us}")
        self.segments, self.loop, self.batch_us = segments, loop, batch_us
        self._where = where  # names the replayed events in errors
        super().__init__(speed)
        # a segment's event at time t is at position t + shift - t_first on the timeline (positions are us after the
        # first event); the stream time is the timeline time plus the offset loops and backward seeks add
        self.t_first = segments[0].t_min
        self._starts, self._shifts, position = [], [], 0
        for k, s in enumerate(segments):
            if k:
                gap = s.t_min - segments[k - 1].t_max
                position += gap if s.continues and gap > 0 else 1
            self._starts.append(position)
            self._shifts.append(self.t_first + position - s.t_min)
            position += s.t_max - s.t_min
        self.t_last = self.t_first + position
        self._offset, self._last_out = 0, None
        self._shots: deque[tuple[int, np.ndarray]] = deque()  # (segment, events) to deliver next, paused or not
        self._enter(0, 0)

    # ---- where the events are (subclasses) ------------------------------------------------------------------

    @abstractmethod
    def _read(self, k: int, lo: int, hi: int) -> np.ndarray:
        """Events ``[lo, hi)`` of segment ``k`` (clipped to it), at their own times."""

    @abstractmethod
    def _block(self, k: int, lo: int) -> tuple[int, np.ndarray, np.ndarray]:
        """A stretch of segment ``k``'s events that holds event ``lo``: (the index of its first event, the events,
        their times as a contiguous array)."""

    @abstractmethod
    def _index(self, k: int, t: int) -> int:
        """Index in segment ``k`` of its first event with time >= ``t``."""

    def _entered(self, k: int) -> None:
        """Segment ``k`` is the one replayed from now on."""

    # ---- controls ------------------------------------------------------------------------------------------

    def seek(self, t_us: int) -> None:
        """Continue from ``t_us`` microseconds after the first event (clipped to the timeline)."""
        position = min(max(int(t_us), 0), self.t_last - self.t_first)
        k = bisect.bisect_right(self._starts, position) - 1
        self._shots.clear()
        self._enter(k, self._index(k, position - self._shifts[k] + self.t_first))
        self._pacer.reset()

    def preview(self, events: int, span_us: int | None) -> int:
        """Deliver next, paused or not, the window of up to ``events`` events spanning less than ``span_us`` (None: any
        span) that ends at the position, or starts there at the start of a segment; the replay goes on after it.

        Returns the position (us after the first event) of the window's first event.
        """
        k, i = self._k, self._next
        if i > 0:
            window = self._read(k, max(i - events, 0), i)
            if span_us is not None:
                window = window[np.searchsorted(window["t"], window["t"][-1] - span_us, side="right") :]
        else:
            window = self._first(k, 0, events, span_us)
            self._next = window.size
        self._shots.append((k, window))
        return int(window["t"][0]) + self._shifts[k] - self.t_first

    def step(self, events: int, span_us: int | None) -> int | None:
        """Deliver next, paused or not, the window of up to ``events`` events spanning less than ``span_us`` (None: any
        span) that starts at the position; the replay goes on after it. Nothing at the end of a replay that does not
        loop.

        Returns the position (us after the first event) of the window's last event, or None when there is none.
        """
        if self._next >= self.segments[self._k].n_events and not self._advance():
            return None
        window = self._first(self._k, self._next, events, span_us)
        self._shots.append((self._k, window))
        self._next += window.size
        return int(window["t"][-1]) + self._shifts[self._k] - self.t_first

    # ---- the stream ----------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[np.ndarray]:
        self._pacer.reset()
        while True:
            if self._shots:
                k, events = self._shots.popleft()
                self._continue(k, int(events["t"][0]))
                yield self._shifted(events, self._stream_time(k, int(events["t"][-1])))
                self._pacer.reset()
                continue
            if self._paused:
                time.sleep(HEARTBEAT_S)
                yield empty_batch()
                continue
            if self._next >= self.segments[self._k].n_events and not self._advance():
                return
            k, lo = self._k, self._next
            start, events, t = self._block(k, lo)
            i = lo - start
            end = int(np.searchsorted(t, t[i] + self.batch_us, side="left"))
            self._continue(k, int(t[i]))
            t_end = self._stream_time(k, int(t[end - 1]))
            delay = self._pacer.delay(t_end)
            if delay > HEARTBEAT_S:  # a quiet stretch: stay responsive to pause, seek and the consumer
                time.sleep(HEARTBEAT_S)
                yield empty_batch()
                continue
            if delay > 0:
                time.sleep(delay)
            self._next = start + end
            yield self._shifted(events[i:end], t_end)

    def _enter(self, k: int, i: int) -> None:
        self._k, self._next = k, i
        self.sensor = self.segments[k].sensor
        self._entered(k)

    def _advance(self) -> bool:
        """Go on to the next segment, or back to the first when looping; False at the end."""
        if self._k + 1 < len(self.segments):
            self._enter(self._k + 1, 0)
        elif self.loop:
            self._enter(0, 0)
        else:
            return False
        return True

    def _first(self, k: int, lo: int, events: int, span_us: int | None) -> np.ndarray:
        """Up to ``events`` events of segment ``k`` from ``lo`` on, spanning less than ``span_us``."""
        window = self._read(k, lo, lo + events)
        if span_us is not None:
            window = window[: np.searchsorted(window["t"], window["t"][0] + span_us, side="left")]
        return window

    def _stream_time(self, k: int, t: int) -> int:
        return t + self._shifts[k] + self._offset

    def _continue(self, k: int, t: int) -> None:
        """Move the stream on so that segment ``k``'s event at time ``t`` comes after the last delivered event."""
        if self._last_out is not None and self._stream_time(k, t) <= self._last_out:
            self._offset = self._last_out + 1 - t - self._shifts[k]

    def _shifted(self, events: np.ndarray, t_end: int) -> np.ndarray:
        """``events`` at stream time (``t_end`` is the last one's), ready to deliver."""
        if t_end > MAX_ABS_TIME_US:  # loops and backward seeks shift time forward, without end
            raise RecorderError(
                f"{self._where}: replayed time would reach {t_end} us, beyond the +-2^61 us events may hold"
            )
        self._last_out = t_end
        delta = t_end - int(events["t"][-1])
        if delta:
            events = events.view(np.uint8).copy().view(EVENT_DTYPE)  # a raw copy: 3x faster than field by field
            events["t"] += delta
        return events


class ReplaySource(Replay):
    """An event file replayed at ``speed`` times real time (0 = as fast as possible), optionally looping."""

    def __init__(self, path: str | Path, *, speed: float = 1.0, loop: bool = False, batch_us: int = 10_000) -> None:
        self.path = Path(path)
        events, sensor = read_events(self.path)
        self.events = np.ascontiguousarray(events)  # batches are raw-copied when time is shifted
        if self.events.size == 0:
            raise RecorderError(f"{self.path}: holds no events, nothing to replay")
        self._t = np.ascontiguousarray(self.events["t"])  # searchsorted copies a strided field on every call
        segment = Segment(sensor, self.events.size, int(self._t[0]), int(self._t[-1]))
        super().__init__([segment], str(self.path), speed=speed, loop=loop, batch_us=batch_us)
        self.metadata = {
            "kind": "file",
            "model": "replay",
            "serial": self.path.name,
            "path": str(self.path.resolve()),
            "height": sensor.height,
            "width": sensor.width,
        }

    def _read(self, k: int, lo: int, hi: int) -> np.ndarray:
        return self.events[lo:hi]

    def _block(self, k: int, lo: int) -> tuple[int, np.ndarray, np.ndarray]:
        return 0, self.events, self._t

    def _index(self, k: int, t: int) -> int:
        return int(np.searchsorted(self._t, t, side="left"))
