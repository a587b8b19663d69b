"""Replay control for ``mem serve`` on a source that can be steered in time: play, pause, speed, seek and step, and
where in the replayed events the stream is. A source that can pause but has no timeline to seek in (the simulated
camera, ``Pausable``) takes the same commands but ``seek``: a live picture held still to look at or label.

A command is carried out by the reader thread between two batches, so the first batch after a seek is known and a
window never mixes events from before and after it; the control thread waits until it was done, so its reply shows
the effect. A seek while paused has the source deliver the served window that ends at the new position (a fresh
frame there; the replay stays paused), and ``step`` pauses and delivers the next window, so a paused replay can be
looked through window by window.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

import numpy as np

from app.live.control import Command, ControlError

REPLAY_COMMANDS = ("play", "pause", "speed", "seek", "step")
REPLAY_COMMAND_WAIT_S = 5.0  # the reader thread carries a replay command out within ~50 ms; a reply waits this long


@runtime_checkable
class Pausable(Protocol):
    """A source that can pause (``recorders.simulated.SimulatorSource``): ``speed`` (x real time), pausing, and
    ``step``, delivering the next window while paused (returns where its last event lies, in us after the stream's
    start). Its batches keep coming while paused (empty ones), so commands are carried out between them."""

    speed: float
    metadata: dict[str, Any]

    @property
    def paused(self) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def step(self, events: int, span_us: int | None) -> int | None: ...


@runtime_checkable
class Replayable(Pausable, Protocol):
    """A pausable source with a timeline (``recorders.replay.Replay``: a file or a corpus): the stream times of its
    first and last events, ``seek`` to microseconds after its first event, and ``preview``, delivering the window
    that ends at the position."""

    t_first: int
    t_last: int

    def seek(self, t_us: int) -> None: ...

    def preview(self, events: int, span_us: int | None) -> int: ...


class ReplayController:
    """Play, pause, speed, seek and step over ``source``, and the position of the stream in its events (from its first
    event; a source without a timeline has no seek and no duration).

    Args:
        source: the replayed or paused source.
        forget: drops the events held so far (a window from before a seek would mix two moments).
        window: the served window, as (events, ms or None): what a seek while paused and a step deliver.
    """

    def __init__(
        self, source: Pausable, forget: Callable[[], None], window: Callable[[], tuple[int, float | None]]
    ) -> None:
        self.source = source
        self._forget = forget
        self._window = window
        self._pending: queue.SimpleQueue[tuple[str, dict[str, Any], Future]] = queue.SimpleQueue()
        self._base_us: int | None = 0  # the position of the next batch's first event (set at the start, by a seek)
        self._ref_us = 0  # the stream time of the source's first event, as the stream continues after loops and seeks
        self.position_us = 0  # where the newest batch ends, from the source's first event (reader thread writes)
        self.reading = False  # a reader thread carries the commands out between batches
        self.seekable = isinstance(source, Replayable)

    @property
    def commands(self) -> dict[str, Command]:
        """The control commands this controller carries out."""
        return dict.fromkeys(REPLAY_COMMANDS, self.request)

    def request(self, command: str, args: dict[str, Any]) -> None:
        """Have the reader thread carry out ``command`` and wait until it did (raising what it raised); with no
        reader (the source ended) carry it out here."""
        done: Future = Future()
        self._pending.put((command, args, done))
        deadline = time.monotonic() + REPLAY_COMMAND_WAIT_S
        while True:
            if not self.reading:
                self.apply_pending()
            try:
                return done.result(timeout=0.05)  # raises what the command raised
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise ControlError(
                        f"{command}: the replay did not respond within {REPLAY_COMMAND_WAIT_S:g} s"
                    ) from None

    def apply_pending(self) -> None:
        """Carry out the commands that came (the reader thread, between two batches)."""
        while True:
            try:
                command, args, done = self._pending.get_nowait()
            except queue.Empty:
                return
            try:
                self._apply(command, args)
            except Exception as exc:  # handed to the control thread, which answers with it
                done.set_exception(exc)
            else:
                done.set_result(None)

    def track(self, batch: np.ndarray) -> None:
        """Follow the position with a batch about to be held (the reader thread, before the ring sees it)."""
        if self._base_us is not None:  # first batch after the start or a seek
            self._ref_us = int(batch["t"][0]) - self._base_us
            self._base_us = None
        self.position_us = self.file_position_us(int(batch["t"][-1]))

    def file_position_us(self, t_us: int) -> int:
        """Where in the replayed events the event at stream time ``t_us`` lies (loops continue 1 us after the end);
        without a timeline, how long after the first event."""
        if not self.seekable:
            return max(t_us - self._ref_us, 0)
        return (t_us - self._ref_us) % (self._duration_us() + 1)

    def state(self) -> dict[str, Any]:
        """The ``replay`` entry of the source state: playing, speed, position and duration in seconds (no duration:
        the source cannot seek)."""
        state = {"playing": not self.source.paused, "speed": self.source.speed, "position_s": self.position_us / 1e6}
        if self.seekable:
            state["duration_s"] = self._duration_us() / 1e6
        return state

    def _apply(self, command: str, args: dict[str, Any]) -> None:
        source = self.source
        if command == "play":
            source.resume()
        elif command == "pause":
            source.pause()
        elif command == "speed":
            source.speed = args["value"]
        elif command == "step":
            source.pause()
            end = source.step(*self._window_span())
            if end is not None:  # the reply shows where the stepped window ends, before the reader delivers it
                self.position_us = end
        elif not self.seekable:
            raise ControlError(f"{command}: the source ({self.source.metadata.get('kind')}) has no timeline to seek in")
        else:
            position = min(int(args["position_s"] * 1e6), self._duration_us())
            source.seek(position)
            self.position_us = position
            self._base_us = source.preview(*self._window_span()) if source.paused else position
            self._forget()

    def _window_span(self) -> tuple[int, int | None]:
        """The served window as (events, span in us or None)."""
        events, ms = self._window()
        return events, None if ms is None else max(round(ms * 1000), 1)

    def _duration_us(self) -> int:
        return int(self.source.t_last) - int(self.source.t_first)
