"""The controls that steer the server: replay (play, pause, step, speed, seek), the window it accumulates, and
recording. Each emits ``command(name, args)`` with ``args`` a dict declared ``object``: PySide drops a ``dict``
argument of a signal declared ``Signal(str, dict)`` on its way to a slot, so the server would get the command
alone."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from mem_core.fields import DEFAULT_WINDOW_EVENTS
from mem_core.limits import MAX_WINDOW_EVENTS, MAX_WINDOW_MS

ACCUMULATION_RANGES = {"time": (1.0, MAX_WINDOW_MS), "events": (100.0, float(MAX_WINDOW_EVENTS))}  # log sliders
PENDING_S = 2.0  # a control keeps the user's choice on screen this long while the server has not confirmed it


def control_grid(
    parent: QtWidgets.QWidget, top: tuple[QtWidgets.QWidget, ...], bottom: QtWidgets.QWidget
) -> QtWidgets.QGridLayout:
    """``top`` side by side in a row, and ``bottom`` (a slider) under them across the whole width."""
    layout = QtWidgets.QGridLayout(parent)
    for column, widget in enumerate(top):
        layout.addWidget(widget, 0, column)
    layout.addWidget(bottom, 1, 0, 1, len(top))
    return layout


class SeekSlider(QtWidgets.QSlider):
    """A horizontal slider whose groove, clicked, puts the handle under the mouse and goes on as a drag of it from
    there (``sliderReleased`` on release), as a video player's does; a QSlider steps a page towards the click, which
    is no place the user chose."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(QtCore.Qt.Orientation.Horizontal, parent)

    def mousePressEvent(self, event: QtGui.QMouseEvent) -> None:
        if event.button() == QtCore.Qt.MouseButton.LeftButton:
            option = QtWidgets.QStyleOptionSlider()
            self.initStyleOption(option)
            style, control = self.style(), QtWidgets.QStyle.ComplexControl.CC_Slider
            handle = style.subControlRect(control, option, QtWidgets.QStyle.SubControl.SC_SliderHandle, self)
            if not handle.contains(event.position().toPoint()):
                groove = style.subControlRect(control, option, QtWidgets.QStyle.SubControl.SC_SliderGroove, self)
                x = round(event.position().x()) - groove.x() - handle.width() // 2
                span = groove.width() - handle.width()
                self.setSliderPosition(
                    QtWidgets.QStyle.sliderValueFromPosition(self.minimum(), self.maximum(), x, span, option.upsideDown)
                )
        super().mousePressEvent(event)  # the press is now on the handle: Qt starts dragging it


class ReplayControls(QtWidgets.QGroupBox):
    """Play / pause, one window forward, speed and seek for a replayed file or corpus; the same but seek for a source
    that can pause without a timeline (the simulated camera). Emits ``command(name, args)``."""

    command = QtCore.Signal(str, object)
    SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Replay", parent)
        self.play = QtWidgets.QPushButton("Pause")
        self.play.setToolTip("Pause or play (Space)")
        self.step = QtWidgets.QPushButton("Step")
        self.step.setToolTip("Pause and show the next window")
        self.speed = QtWidgets.QComboBox()
        self.speed.addItems([f"{s:g}x" for s in self.SPEEDS])
        self.speed.setCurrentIndex(self.SPEEDS.index(1.0))
        self.seek = SeekSlider()
        self.seek.setRange(0, 1000)
        self.position = QtWidgets.QLabel("0.00 / 0.00 s")
        control_grid(self, (self.play, self.step, self.speed, self.position), self.seek)
        self.playing = True
        self.duration_s = 0.0
        self._seeking_until = 0.0  # monotonic: until then the slider shows where the user dropped it
        self.play.clicked.connect(self._toggle)
        self.step.clicked.connect(lambda: self.command.emit("step", {}))
        self.speed.activated.connect(lambda i: self.command.emit("speed", {"value": self.SPEEDS[i]}))
        self.seek.sliderReleased.connect(self._seek)

    def _toggle(self) -> None:
        self.command.emit("pause" if self.playing else "play", {})

    def _seek(self) -> None:
        # stats sent before the seek still carry the old position: the slider must not jump back to it
        self._seeking_until = time.monotonic() + PENDING_S
        position = self.seek.value() / 1000 * self.duration_s
        self.position.setText(f"{position:.2f} / {self.duration_s:.2f} s")  # where the replay goes, not where it was
        self.command.emit("seek", {"position_s": position})

    def set_state(self, replay: dict, confirmed: bool = False) -> None:
        """Follow the server's replay state (``playing``, ``speed``, ``position_s``, ``duration_s``); ``confirmed``
        for the state in a reply to a command (it shows the command's effect)."""
        if confirmed:
            self._seeking_until = 0.0
        self.playing = bool(replay.get("playing", True))
        self.play.setText("Pause" if self.playing else "Play")
        seekable = replay.get("duration_s") is not None
        self.setTitle("Replay" if seekable else "Camera (simulated)")
        self.seek.setVisible(seekable)
        self.duration_s = float(replay.get("duration_s") or 0.0)
        speed = float(replay.get("speed", 1.0))
        if speed in self.SPEEDS and not self.speed.view().isVisible():
            self.speed.setCurrentIndex(self.SPEEDS.index(speed))
        if self.seek.isSliderDown() or time.monotonic() < self._seeking_until:
            return
        position = float(replay.get("position_s", 0.0))
        self.position.setText(f"{position:.2f} / {self.duration_s:.2f} s" if seekable else f"{position:.2f} s")
        if self.duration_s > 0:
            self.seek.setValue(round(1000 * min(position / self.duration_s, 1.0)))  # (a huge ratio is inf)


class AccumulationControls(QtWidgets.QGroupBox):
    """How much a window holds, like DV's and Metavision Studio's accumulation: a time span (at most the default
    event count, the model's n_max) or an event count, on a logarithmic slider. Emits
    ``command("window", {"events", "ms"})``; "Model's window" goes back to the server's default."""

    command = QtCore.Signal(str, object)
    STEPS = 240

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Accumulation", parent)
        self.mode = QtWidgets.QComboBox()
        self.mode.addItems(list(ACCUMULATION_RANGES))
        self.slider = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
        self.slider.setRange(0, self.STEPS)
        self.value = QtWidgets.QLabel()
        self.reset = QtWidgets.QPushButton("Model's window")
        control_grid(self, (self.mode, self.value, self.reset), self.slider).setColumnStretch(1, 1)
        self.state: dict[str, Any] = {
            "events": DEFAULT_WINDOW_EVENTS,
            "ms": None,
            "default_events": DEFAULT_WINDOW_EVENTS,
            "default_ms": None,
        }
        self._pending_until = 0.0  # monotonic: until then the controls show the user's choice, not the stats
        self.mode.activated.connect(self._mode_changed)
        self.slider.valueChanged.connect(self._slider_moved)
        self.slider.sliderReleased.connect(self._send)
        self.reset.clicked.connect(self._reset)
        self._show(self.state)

    def window(self) -> dict[str, Any]:
        """The window the controls show: ``{"events", "ms"}`` as the ``window`` command takes it."""
        lo, hi = ACCUMULATION_RANGES[self.mode.currentText()]
        value = lo * (hi / lo) ** (self.slider.value() / self.STEPS)
        if self.mode.currentText() == "time":
            return {"events": self.state["default_events"], "ms": float(f"{value:.2g}")}
        return {"events": int(float(f"{value:.2g}")), "ms": None}

    def set_state(self, accumulation: dict[str, Any], confirmed: bool = False) -> None:
        """Follow the server's window (``events``, ``ms``, ``default_events``, ``default_ms``); ``confirmed`` for
        the state in a reply to a command."""
        if confirmed:
            self._pending_until = 0.0
        self.state = {**self.state, **accumulation}
        if time.monotonic() >= self._pending_until and not self.slider.isSliderDown():
            self._show(self.state)

    def _show(self, window: dict[str, Any]) -> None:
        mode = "time" if window.get("ms") is not None else "events"
        value = window["ms"] if mode == "time" else window["events"]
        lo, hi = ACCUMULATION_RANGES[mode]
        step = round(self.STEPS * np.log(min(max(value, lo), hi) / lo) / np.log(hi / lo))
        blocked = self.slider.blockSignals(True)  # showing the server's state sends nothing back
        self.mode.setCurrentText(mode)
        self.slider.setValue(step)
        self.slider.blockSignals(blocked)
        self._label(window)

    def _label(self, window: dict[str, Any]) -> None:
        if window["ms"] is None:
            self.value.setText(f"{window['events']:,} events")
        else:
            self.value.setText(f"{window['ms']:g} ms (\u2264 {window['events']:,} events)")

    def _mode_changed(self) -> None:
        """A mode starts from the default window (by time: its span, or 50 ms where the model has none)."""
        time_mode = self.mode.currentText() == "time"
        self._show(
            {"events": self.state["default_events"], "ms": (self.state["default_ms"] or 50.0) if time_mode else None}
        )
        self._send()

    def _slider_moved(self) -> None:
        self._label(self.window())
        if not self.slider.isSliderDown():  # keys and clicks; a drag sends on release
            self._send()

    def _send(self) -> None:
        self._pending_until = time.monotonic() + PENDING_S
        self.command.emit("window", self.window())

    def _reset(self) -> None:
        self._pending_until = time.monotonic() + PENDING_S
        default = {"events": self.state["default_events"], "ms": self.state["default_ms"]}
        self._show(default)
        self.command.emit("window", default)


class RecordControls(QtWidgets.QGroupBox):
    """Start / stop recording the live source into a corpus on the server side. Emits ``command(name, args)``."""

    command = QtCore.Signal(str, object)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Recording", parent)
        self.button = QtWidgets.QPushButton("Record")
        self.status = QtWidgets.QLabel("not recording")
        self.status.setWordWrap(True)
        layout = QtWidgets.QHBoxLayout(self)
        layout.addWidget(self.button)
        layout.addWidget(self.status, 1)
        self.active = False
        self.button.clicked.connect(lambda: self.command.emit("record_stop" if self.active else "record_start", {}))

    def set_state(self, recording: dict) -> None:
        """Follow the server's recording state (``active``, ``name``, ``events``, ``root``, ``error``)."""
        self.active = bool(recording.get("active"))
        self.button.setText("Stop" if self.active else "Record")
        if recording.get("error"):
            self.status.setText(f"error: {recording['error']}")
        elif self.active:
            self.status.setText(f"recording {recording.get('name')}: {recording.get('events', 0):,} events")
        elif recording.get("name"):
            self.status.setText(
                f"saved {recording['name']} ({recording.get('events', 0):,} events) in {recording.get('root')}"
            )
        else:
            self.status.setText("not recording")
