"""``mem view``: the main window that draws the live server's messages, and the entry point that runs it."""

from __future__ import annotations

import signal
import sys
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from app.config import ServeConfig, ViewConfig
from app.units import event_rate
from app.viewer.charts import ConfidenceTimeline, SegmentLegend, TopKPanel
from app.viewer.client import LiveClient
from app.viewer.controls import AccumulationControls, RecordControls, ReplayControls
from app.viewer.event_view import EventView, FlashFrame
from app.viewer.label_panel import HOTKEY_CLASSES, LabelPanel
from app.viewer.snapshot import Snapshots
from app.viewer.theme import class_colors, dark_palette
from mem_core.protocol import (
    VIEW_DECODERS,
    Message,
    Prediction,
    ProtocolError,
    SensorView,
)

STALE_S = 2.0  # no message (or no new picture) for this long: the picture is marked stale
NO_SERVER_S = 3.0  # no message this long after the start: the window says which server to start
STATUS_MS = 250
NOTICE_MS = 5000  # how long a passing notice stays in the status bar
ERROR_NOTICE_MS = 10_000  # a refused command's error: long enough to read
CHECKS = VIEW_DECODERS  # in drawing order
LOADING = "loading model..."
NO_MODEL = "no model yet"
BLANK = "\u2013"  # a rate of a stream that stopped: not known, rather than its last value
TIPS = {  # why a control cannot act (by the server's model_state; None: not heard yet), what it does when it can
    "input": {
        "ready": "Draw the model's input (resized, hot pixels removed, normalised) instead of the sensor",
        "loading": "The model is loading: its input shows once it is ready",
        "none": "No model: the server streams the sensor only (start mem serve with --model RUN)",
        None: "No model input yet: the server has not said it serves a model",
    },
    "reset": {
        "ready": "Go back to the window the model was trained on",
        "loading": "The model is loading: its window is known once it is ready",
        "none": "No model: there is no model's window to go back to (start mem serve with --model RUN)",
        None: "No model yet: its window is known once the server serves one",
    },
}


class ViewerWindow(Snapshots, QtWidgets.QMainWindow):
    """The events at sensor resolution (or the model input) with token / mask overlays, prediction panel,
    controls and a status bar.

    ``apply(messages)`` draws a drain's newest messages (topic -> ``Message``); with a ``client`` the window is
    wired to it (messages in, control commands out: ``control_command(name, args)`` reaches
    ``client.send_control(name, **args)``). ``view_state()`` describes what is on screen (``Snapshots``).
    """

    control_command = QtCore.Signal(str, object)  # (name, args dict): see app.viewer.controls on why object

    def __init__(
        self,
        client: LiveClient | None = None,
        parent: QtWidgets.QWidget | None = None,
        snapshot_dir: Path = Path("mem-view-snapshots"),
    ) -> None:
        super().__init__(parent)
        self.client = client
        self.snapshot_dir = snapshot_dir  # where Save snapshot writes: a folder of its own, not wherever mem view ran
        self.setWindowTitle(f"MEM live viewer - {client.endpoint if client else 'offline'}")
        self.resize(1240, 880)
        self.session: str | None = None
        self.task: str | None = None
        self.classes: list[str] = []
        self.last_stats: dict[str, Any] = {}
        self.last_pred: dict[str, Any] = {}
        self.frames_shown = 0
        self.commands_confirmed = 0  # the server's command count in its latest reply: older stats are stale
        self.bad_messages = 0  # decodable messages whose content does not fit their topic (dropped)
        self._frame_times: deque[float] = deque(maxlen=1000)
        self.first_message: tuple[float, float] | None = None  # (monotonic, GUI thread CPU s) at the 1st message
        self.model_version: int | None = None  # of the newest prediction
        self.model_switches = 0  # newer models seen taking over (marked on the timeline)
        self._served_without_model = False  # the server said it had no model (its first one is a switch too)
        self.flashes = 0  # captures confirmed by the server (each lit the picture's frame)
        self.last_message = float("nan")  # time.monotonic() of the newest message drawn
        self._opened = time.monotonic()
        self._build()
        if client is not None:
            client.messages.connect(self.apply)
            client.control_reply.connect(self.apply_reply)
            self.control_command.connect(self._send_command)
        self._status_timer = QtCore.QTimer(self)
        self._status_timer.timeout.connect(self.update_status)
        self._status_timer.start(STATUS_MS)
        self.update_status()

    def _build(self) -> None:
        self.view = EventView()
        self.header = QtWidgets.QLabel("waiting for the server")
        self.header.setWordWrap(True)  # model and source names can be long
        self.header.setStyleSheet("color: #9aa1ad;")
        self.top_k = TopKPanel()
        self.legend = SegmentLegend()
        self.timeline = ConfidenceTimeline()
        self.timeline.setMinimumHeight(180)
        self.tokens_box = QtWidgets.QCheckBox("token grid (hover for ids)")
        self.mask_box = QtWidgets.QCheckBox("segmentation mask")
        for box in (self.tokens_box, self.mask_box):
            box.setChecked(True)
            box.toggled.connect(
                lambda _: self.view.set_overlays(self.tokens_box.isChecked(), self.mask_box.isChecked())
            )
        self.brightness = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
        self.brightness.setRange(1, 100)
        self.brightness.setValue(round(1 / self.view.level))
        self.brightness.valueChanged.connect(self._set_brightness)
        self.input_box = QtWidgets.QCheckBox("show the model input instead of the sensor")
        self.input_box.toggled.connect(self.view.set_show_input)
        self.accumulation = AccumulationControls()
        self._set_model_state(None)
        self.replay = ReplayControls()
        self.record = RecordControls()
        self.labels = LabelPanel()
        for controls in (self.accumulation, self.replay, self.record, self.labels):
            controls.command.connect(self.control_command)
            controls.setVisible(False)
        for i in range(HOTKEY_CLASSES):  # number keys capture (a text field being edited keeps its digits)
            shortcut = QtGui.QShortcut(QtGui.QKeySequence(str(i + 1)), self)
            shortcut.activated.connect(lambda i=i: self.labels.capture(i))
        undo = QtGui.QShortcut(QtGui.QKeySequence.StandardKey.Undo, self)
        undo.activated.connect(self.labels.undo.click)
        pause = QtGui.QShortcut(QtGui.QKeySequence(QtCore.Qt.Key.Key_Space), self)  # hold a picture to label it
        pause.activated.connect(lambda: self.replay.isVisibleTo(self) and self.replay.play.click())
        snapshot = QtWidgets.QPushButton("Save snapshot")
        snapshot.clicked.connect(self._snapshot_clicked)

        overlays = QtWidgets.QGroupBox("Display")
        form = QtWidgets.QFormLayout(overlays)
        form.addRow(self.input_box)
        form.addRow(self.tokens_box)
        form.addRow(self.mask_box)
        form.addRow("brightness", self.brightness)

        panel = QtWidgets.QWidget()
        side = QtWidgets.QVBoxLayout(panel)
        side.addWidget(self.header)
        side.addWidget(self.top_k)
        side.addWidget(self.legend)
        side.addWidget(self.timeline, 100)
        side.addWidget(overlays)
        side.addWidget(self.accumulation)
        side.addWidget(self.replay)
        side.addWidget(self.record)
        side.addWidget(self.labels)
        side.addWidget(snapshot)
        side.addStretch(1)  # takes the room of the timeline when it is hidden (segmentation)
        self.legend.setVisible(False)
        panel.setMinimumWidth(360)
        # controls that appear (replay, recording, labels, an error) scroll in a short window rather than squeeze
        # the timeline's axes and the buttons
        self.side = QtWidgets.QScrollArea()
        self.side.setWidget(panel)
        self.side.setWidgetResizable(True)
        self.side.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        self.side.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scrollbar = self.style().pixelMetric(QtWidgets.QStyle.PixelMetric.PM_ScrollBarExtent)
        self.side.setMinimumWidth(panel.minimumWidth() + scrollbar)

        self.picture = FlashFrame(self.view)
        splitter = QtWidgets.QSplitter()
        splitter.addWidget(self.picture)
        splitter.addWidget(self.side)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([3 * self.width() // 5, 2 * self.width() // 5])
        self.setCentralWidget(splitter)

        self.status_labels = {
            name: QtWidgets.QLabel()
            for name in ("link", "view", "fps", "events", "window", "latency", "skipped", "dropped")
        }
        for label in self.status_labels.values():
            label.setStyleSheet("padding: 0 6px; color: #b8bdc8;")
            self.statusBar().addPermanentWidget(label)
        self.tokens_box.setVisible(False)
        self.mask_box.setVisible(False)

    # ---- incoming -----------------------------------------------------------------------------------------

    def apply(self, messages: dict[str, Message]) -> None:
        """Draw the newest message of each topic (one drain of the client). A message whose content does not fit
        its topic is dropped and counted, and changes nothing on screen (its session included)."""
        if self.first_message is None:
            self.first_message = (time.monotonic(), time.thread_time())
        self.last_message = time.monotonic()
        checked = {}
        for topic, check in CHECKS.items():
            if topic in messages:
                try:
                    checked[topic] = check(messages[topic])
                except ProtocolError as exc:
                    self._drop(str(exc))
        session = next((s for t in checked if isinstance(s := messages[t].header.get("session"), str) and s), None)
        if session is not None and session != self.session:
            self._new_session(session)
        draw = {
            "sensor": self._apply_sensor,
            "hist": self._apply_hist,
            "tokens": self._apply_tokens,
            "pred": self._apply_pred,
            "stats": self._apply_stats,
        }
        for topic, content in checked.items():
            draw[topic](content)
        layers = checked.keys() & {"sensor", "hist", "tokens", "pred"}
        if layers and self._render() and layers & {"sensor", "hist"}:
            # a frame is a new window on screen (its overlays may come in the next drain)
            self.frames_shown += 1
            self._frame_times.append(time.monotonic())

    def _drop(self, reason: str) -> None:
        self.bad_messages += 1
        self.notify(f"dropped {reason}")

    def _render(self) -> bool:
        """Draw the layers. A frame that cannot be drawn is dropped and counted, and its layers forgotten, so it
        cannot stop the drawing of the next ones (the messages were checked: this is the last line of defence)."""
        try:
            self.view.render()
        except (ValueError, TypeError, IndexError, MemoryError) as exc:
            self.view.forget_layers()
            self._drop(f"a frame that could not be drawn ({type(exc).__name__}: {exc})")
            return False
        return True

    def _apply_sensor(self, view: SensorView) -> None:
        self.view.set_sensor(view)
        self.labels.frame = view.frame  # a capture stores the window on screen

    def _apply_hist(self, hist: np.ndarray) -> None:
        self.view.set_histogram(hist)
        self._set_model_state("ready")  # a model input to show, whatever the last stats said

    def _apply_tokens(self, tokens: tuple[np.ndarray, int]) -> None:
        self.view.set_tokens(*tokens)
        self.tokens_box.setVisible(True)

    def _set_brightness(self, value: int) -> None:
        self.view.level = 1.0 / value
        self.view.render()

    def _new_session(self, session: str) -> None:
        """A (re)started server: forget the previous one's history."""
        self.session = session
        self.commands_confirmed = 0
        self.timeline.clear_history()
        self.view.set_tokens(None, 1)
        self.view.set_mask(None, [])
        self.view.hist = None  # the new server may serve no model
        self.tokens_box.setVisible(False)
        self.top_k.set_top_k([])
        self.model_version = None
        self._served_without_model = False
        self.labels.captures = None  # a restarted server counts its captures from 0

    def _apply_pred(self, pred: Prediction) -> None:
        self.task, self.classes = pred.task, pred.classes
        # a newer model took over: after another model, or after a stream without one
        before = self.model_version is not None or self._served_without_model
        switched = before and pred.model_version not in (None, self.model_version)
        self.model_version = pred.model_version if pred.model_version is not None else self.model_version
        if pred.probs is not None:
            colors = class_colors(len(self.classes))
            self.top_k.set_top_k(pred.top_k, colors)
            self.timeline.add(time.monotonic(), pred.probs, self.classes, colors)
            self.last_pred = {"task": self.task, "top_k": pred.top_k}
        else:
            self.view.set_mask(pred.mask, self.classes)
            self.legend.set_classes(np.unique(pred.mask).tolist(), self.classes)
            self.last_pred = {"task": self.task, "present": self.legend.labels}
        if switched:
            self.model_switches += 1
            self.timeline.mark(time.monotonic(), f"model v{self.model_version}")
            self.notify(f"model v{self.model_version} took over")
        segmentation = self.task == "segmentation"
        self.top_k.setVisible(not segmentation)
        self.timeline.setVisible(not segmentation)
        self.legend.setVisible(segmentation)
        self.mask_box.setVisible(segmentation)

    def _apply_stats(self, stats: dict[str, Any]) -> None:
        self.last_stats = stats
        loading = stats.get("model_state") == "loading"
        no_model = stats.get("model_state") == "none"
        self._served_without_model |= no_model
        self._set_model_state(stats.get("model_state"))
        if loading or no_model:
            self.top_k.best.setText(LOADING if loading else NO_MODEL)
        # stats sent before the server carried out a command the viewer saw the reply to would undo its effect
        current = stats.get("commands", 0) >= self.commands_confirmed
        accumulation = stats.get("accumulation")
        self.accumulation.setVisible(accumulation is not None)
        if accumulation is not None and current:
            self.accumulation.set_state(accumulation)
        source = stats.get("source") or {}
        replay = source.get("replay")
        self.replay.setVisible(replay is not None)
        if replay is not None and current:
            self.replay.set_state(replay)
        recording = stats.get("recording")
        self.record.setVisible(bool(source.get("recordable")) and recording is not None)
        if recording is not None and current:
            self.record.set_state(recording)
        self.labels.setVisible("labels" in stats)
        if current and self.labels.set_state(stats.get("labels"), stats.get("training")):
            self._flash()  # a capture, whether its reply or a newer stats message told first
        size = f"{source.get('width', '?')} x {source.get('height', '?')}"
        task = LOADING if loading else "no model" if no_model else stats.get("task", "")
        model = stats.get("model") or {}
        if model.get("version"):
            task += f" \u00b7 model {model.get('name')} v{model['version']}"
        if model.get("error"):
            self.notify(f"newer model not loaded: {model['error']}")
        self.header.setText(f"{task} \u00b7 source {source.get('kind', '?')} ({source.get('serial', '')}, {size})")

    def _set_model_state(self, model_state: str | None) -> None:
        """Enable the controls that need a model once it is served; a disabled one says why in its tooltip."""
        ready = model_state == "ready" or self.view.hist is not None
        state = "ready" if ready else model_state if model_state in TIPS["input"] else None
        for control, tips in ((self.input_box, TIPS["input"]), (self.accumulation.reset, TIPS["reset"])):
            if control.isEnabled() != ready or control.toolTip() != tips[state]:
                control.setEnabled(ready)
                control.setToolTip(tips[state])

    def apply_reply(self, reply: dict[str, Any]) -> None:
        """A control reply: show an error where the user acted (a labelling command's in the label panel, until the
        next action there; others in the status bar), follow the returned state."""
        if not reply.get("ok"):
            error = reply_error(reply)
            if reply.get("command") in LabelPanel.COMMANDS:
                self.labels.show_error(error)
                QtCore.QTimer.singleShot(0, lambda: self.side.ensureWidgetVisible(self.labels.error))  # laid out
            else:
                self.notify(error, ERROR_NOTICE_MS)
        state = reply.get("state") or {}
        self.commands_confirmed = max(self.commands_confirmed, state.get("commands", 0))
        if (state.get("source") or {}).get("replay"):
            self.replay.set_state(state["source"]["replay"], confirmed=True)
        if state.get("accumulation"):
            self.accumulation.set_state(state["accumulation"], confirmed=True)
        if state.get("recording"):
            self.record.set_state(state["recording"])
        if self.labels.set_state(state.get("labels"), state.get("training")):
            self._flash()

    def _flash(self) -> None:
        """Light the picture's frame: the capture was taken."""
        self.flashes += 1
        self.picture.flash()

    def notify(self, text: str, ms: int = NOTICE_MS) -> None:
        """Show ``text`` in the status bar for ``ms``."""
        self.statusBar().showMessage(text, ms)

    def _send_command(self, command: str, args: dict[str, Any]) -> None:
        """Send a control command to the server; its reply comes to ``apply_reply``."""
        if self.client is not None and not self.client.send_control(command, **args):
            self.notify(f"{command}: the server's control socket is not reachable yet")

    # ---- status -------------------------------------------------------------------------------------------

    @property
    def display_fps(self) -> float:
        """Histogram frames drawn during the last second."""
        now = time.monotonic()
        return float(sum(1 for t in self._frame_times if t >= now - 1.0))

    def update_status(self) -> None:
        """Refresh the status bar and the picture's notice (runs on a timer)."""
        stopped = self._update_notice()  # (may draw what waited: the stats read below are the newest)
        labels, stats = self.status_labels, self.last_stats
        labels["link"].setText(self.link_text())
        labels["view"].setText(self._view_text())
        labels["fps"].setText(f"{self.display_fps:.0f} fps")
        if stopped or not stats:  # the last stats describe a stream that is gone, or none came yet
            labels["events"].setText(f"{BLANK} ev/s")
            labels["window"].setText(f"window {BLANK}")
            labels["latency"].setText(f"latency {BLANK}")
        else:
            labels["events"].setText(event_rate(stats.get("events_per_s", 0)))
            labels["window"].setText(
                f"window {stats.get('window_events', 0):,} ev / {stats.get('window_ms', 0):.1f} ms"
            )
            latency = stats.get("latency_ms") or {}
            labels["latency"].setText(f"latency {latency.get('p50', 0):.1f} ms (p95 {latency.get('p95', 0):.1f})")
        labels["skipped"].setText(f"skipped {stats.get('skipped_windows', 0):,}")
        dropped = (self.client.dropped if self.client else 0) + self.bad_messages + int(stats.get("malformed", 0))
        labels["dropped"].setText(f"dropped {dropped:,}")

    def _update_notice(self) -> bool:
        """Say over the picture when there is no server yet, when the server stopped sending (the picture is stale:
        True) and when the pictures stopped while the server runs (no events, not paused)."""
        if self.client is None:
            return False
        if not time.monotonic() - self.last_message < STALE_S:  # (nan: none yet)
            self.client.drain()  # messages waiting while the GUI thread was busy are not a stream that stopped
        now = time.monotonic()
        if not np.isfinite(self.last_message):
            if now - self._opened >= NO_SERVER_S:
                text = no_server_text(self.client.endpoint)
                self.header.setText(text)
                self.view.set_notice(text)
            return False
        message_age = now - self.last_message
        frame_age = now - self._frame_times[-1] if self._frame_times else 0.0
        paused = self.replay.isVisibleTo(self) and not self.replay.playing
        if message_age >= STALE_S:
            self.view.set_notice(f"no data from the server for {message_age:.0f} s: the last picture, not live", True)
            return True
        if frame_age >= STALE_S and not paused:
            self.view.set_notice(f"no new events for {frame_age:.0f} s: the last picture", True)
        else:
            self.view.set_notice("")
        return False

    def _view_text(self) -> str:
        """What the picture is: ``sensor 120 x 100`` or ``model input 64 x 64 (sensor 120 x 100)``."""
        view = self.view
        sensor = f"sensor {view.sensor.sensor[1]} x {view.sensor.sensor[0]}" if view.sensor is not None else ""
        if view.showing_sensor:
            binned = f", shown {view.shape[1]} x {view.shape[0]}" if view.sensor.binning > 1 and view.shape else ""
            return sensor + binned
        if view.hist is None:
            return "no picture yet"
        text = f"model input {view.hist.shape[2]} x {view.hist.shape[1]}"
        return f"{text} ({sensor})" if sensor else text

    def link_text(self) -> str:
        """How the link to the server stands: connected, waiting, no data for a while."""
        if self.client is None:
            return "offline"
        age = time.monotonic() - self.client.last_message
        if not np.isfinite(age):
            waited = time.monotonic() - self._opened
            return (
                f"no server at {self.client.endpoint}"
                if waited >= NO_SERVER_S
                else f"waiting for {self.client.endpoint}"
            )
        return "connected" if age < STALE_S else f"no data for {age:.0f} s"

    def _snapshot_clicked(self) -> None:
        path = self.snapshot_dir / f"mem-view-{datetime.now():%Y%m%d-%H%M%S}.png"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.save_snapshot(path)
        except OSError as exc:
            self.notify(str(exc))
            return
        self.notify(f"saved {path}")


def reply_error(reply: dict[str, Any]) -> str:
    """A refused command's error, named by its command once: the server's errors mostly begin with it already."""
    command, error = str(reply.get("command")), str(reply.get("error"))
    return error if error.startswith(f"{command}:") else f"{command}: {error}"


def no_server_text(endpoint: str) -> str:
    """What a viewer that hears nothing at ``endpoint`` tells its user to start."""
    pub = "" if endpoint == ServeConfig.pub else f" --pub {endpoint}"
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    start = f"start one with `mem serve{pub}`"
    if endpoint.startswith("tcp://") and host not in ("127.0.0.1", "localhost", "[::1]"):
        start = f"start `mem serve --pub tcp://0.0.0.0:{port}` on {host}"
    return f"no server at {endpoint}: {start} (--source camera, sim or a file; --model RUN for predictions)"


def open_viewer(config: ViewConfig) -> int:
    """Open the viewer and run the Qt event loop; returns the exit status (0). Having heard no server, it says on
    stderr which to start."""
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([sys.argv[0]])
    app.setStyle("Fusion")
    app.setPalette(dark_palette())
    client = LiveClient(config.connect)
    window = ViewerWindow(client, snapshot_dir=config.snapshot_dir)
    window.show()
    window.activateWindow()  # the number keys capture from the start (where the window manager allows it)

    if config.quit_after_s is not None:
        QtCore.QTimer.singleShot(round(config.quit_after_s * 1000), app.quit)
    signal.signal(signal.SIGINT, lambda *_: app.quit())  # the client's poll timer lets Python see Ctrl-C
    app.exec()
    if not np.isfinite(window.last_message):  # the window said so too; a terminal or a script reads it here
        print(f"mem view: {no_server_text(config.connect)}", file=sys.stderr, flush=True)
    if config.snapshot is not None:
        window.save_snapshot(config.snapshot)
    window.close()
    client.close()
    return 0
