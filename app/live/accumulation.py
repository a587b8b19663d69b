"""What a prediction of ``mem serve`` sees: the newest ``events`` events, none older than ``ms`` before the newest.

The window comes from ``mem serve``'s options, what they leave open from the model's training window (``mem
export`` records it), and a viewer's ``window`` command overrides both until the server ends.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from app.config import ServeConfig
from app.live.ring import EventRing
from mem_core.fields import DEFAULT_WINDOW_EVENTS
from mem_core.limits import MAX_WINDOW_EVENTS

LOADING_WINDOW_EVENTS = DEFAULT_WINDOW_EVENTS  # the window until the model tells its own (the paper's n_max)
NO_MODEL_WINDOW = (
    DEFAULT_WINDOW_EVENTS,
    50.0,
)  # the window without a model: the sim dataset's 50 ms samples, crisp to label


class Window(NamedTuple):
    """What a prediction sees: the newest ``events`` events, none older than ``ms`` before the newest (None: no
    time limit)."""

    events: int
    ms: float | None


def configured_window(config: ServeConfig, model: tuple[int, float | None] | None) -> Window:
    """The window ``config`` asks for; what it leaves open comes from the model's training window (``model``,
    None while loading). ``window_ms`` 0 means no time limit."""
    if model is None and config.model is None:  # no model coming: a window to label with
        model = NO_MODEL_WINDOW
    events = config.window_events or min(model[0] if model else LOADING_WINDOW_EVENTS, MAX_WINDOW_EVENTS)
    ms = config.window_ms if config.window_ms is not None else (model[1] if model else None)
    return Window(events, ms or None)


def newest_span(events: np.ndarray, ms: float | None) -> np.ndarray:
    """The suffix of time-sorted ``events`` no older than ``ms`` before the newest (all of them for None)."""
    if ms is None:
        return events
    t = events["t"]  # live sources keep time monotonic, so the newest span is a suffix
    return events[np.searchsorted(t, t[-1] - round(ms * 1000), side="right") :]


def describe_window(window: Window) -> str:
    """``30000 events of at most 100 ms`` (for messages)."""
    return f"{window.events} events" + ("" if window.ms is None else f" of at most {window.ms:g} ms")


class Accumulation:
    """The window being served and the ring that holds it: the configured window, then each new model's training
    window, until a viewer chooses one (which then stays, over model changes too). Any thread may change it."""

    def __init__(self, config: ServeConfig) -> None:
        self._config = config
        self.default = configured_window(config, None)
        self.window = self.default
        self.chosen = False  # a window command came: a model's training window no longer applies
        self.ring = EventRing(self.window.events)

    def choose(self, window: Window) -> None:
        """A viewer's window: served from now on, whatever model comes."""
        self.chosen = True
        self._set(window)

    def follow_model(self, training_window: tuple[int, float | None] | None, keep: bool) -> None:
        """A new model's training window becomes the default, and the window unless one was chosen; ``keep``
        keeps the current window (a model trained on captures is served on windows like the captured ones)."""
        self.default = configured_window(self._config, training_window)
        self.chosen = self.chosen or keep
        if not self.chosen:
            self._set(self.default)

    def state(self) -> dict[str, Any]:
        """The ``accumulation`` entry of the server's state: the window and the default one."""
        window, default = self.window, self.default
        return {"events": window.events, "ms": window.ms, "default_events": default.events, "default_ms": default.ms}

    def _set(self, window: Window) -> None:
        self.ring.resize(window.events)
        self.window = window
