"""The label-a-few panel: the classes to capture (number keys), captures per class, undo, and Train with its
progress. Emits ``command(name, args)`` as the other controls do (``app.viewer.controls``)."""

from __future__ import annotations

import unicodedata
from typing import Any

from PySide6 import QtCore, QtWidgets

from app.viewer.theme import ERROR

HOTKEY_CLASSES = 9  # classes with a number key (1-9)


class LabelPanel(QtWidgets.QGroupBox):
    """Label the window on screen: a button per class (number keys 1-9 in the window), undo, captures per class,
    and Train with its progress. Emits ``command("capture", {"label", "frame"})``, ``command("undo_capture", {})``
    and ``command("train", {})``; the server stores and trains, this panel only shows its state.

    A command the server refused shows its reason in red (``show_error``) until the user's next action here."""

    command = QtCore.Signal(str, object)
    COMMANDS = ("capture", "undo_capture", "train")

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Label windows", parent)
        self.names = QtWidgets.QLineEdit()
        self.names.setPlaceholderText("class names, comma-separated (Enter)")
        self.names.editingFinished.connect(self._names_edited)
        self.names.returnPressed.connect(self.names.clearFocus)  # Enter: the number keys capture again
        self.buttons: list[QtWidgets.QPushButton] = []
        self._buttons_layout = QtWidgets.QGridLayout()
        self.undo = QtWidgets.QPushButton("Undo last (Ctrl+Z)")
        self.undo.clicked.connect(lambda: self._send("undo_capture", {}))
        self.train = QtWidgets.QPushButton("Train")
        # the classes on the buttons go with Train: the server refuses a run that would leave one out
        self.train.clicked.connect(lambda: self._send("train", {"classes": self.classes} if self.classes else {}))
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setTextVisible(True)
        self.status = QtWidgets.QLabel(
            "capture the window on screen with a class's button or number key "
            "(Space pauses a replay or a simulated camera)"
        )
        self.status.setWordWrap(True)
        self.result = QtWidgets.QLabel("")
        self.result.setWordWrap(True)
        self.result.setVisible(False)
        self.error = QtWidgets.QLabel("")
        self.error.setWordWrap(True)
        self.error.setStyleSheet(f"color: {ERROR};")
        self.error.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)  # to copy a path
        self.error.setVisible(False)
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(self.names)
        layout.addLayout(self._buttons_layout)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.undo)
        row.addWidget(self.train)
        layout.addLayout(row)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.result)
        layout.addWidget(self.error)
        self.classes: list[str] = []
        self.counts: dict[str, int] = {}
        self.frame: int | None = None  # the window on screen (what a capture names)
        self.captures: int | None = None  # the server's capture count (None: not heard yet); growth is a capture
        self.training: dict[str, Any] = {}
        self._typed = False  # class names typed in: the server's list no longer replaces them

    def set_classes(self, classes: list[str]) -> None:
        if classes == self.classes:
            return
        self.classes = list(classes)
        if not self.names.hasFocus():
            self.names.setText(", ".join(self.classes))
        for button in self.buttons:
            self._buttons_layout.removeWidget(button)
            button.deleteLater()
        self.buttons = []
        for i in range(len(self.classes)):
            button = QtWidgets.QPushButton()
            button.clicked.connect(lambda _=False, i=i: self.capture(i))
            self._buttons_layout.addWidget(button, i // 2, i % 2)
            self.buttons.append(button)
        self._label_buttons()

    def _label_buttons(self) -> None:
        for i, (name, button) in enumerate(zip(self.classes, self.buttons, strict=True)):
            key = f"{i + 1}  " if i < HOTKEY_CLASSES else ""
            button.setText(f"{key}{name}  ({self.counts.get(name, 0)})")

    def _names_edited(self) -> None:
        # in the one Unicode spelling the server stores (NFC): "é" typed either way is one button
        names = [unicodedata.normalize("NFC", n.strip()) for n in self.names.text().split(",") if n.strip()]
        names = list(dict.fromkeys(names))  # no duplicates, in the typed order
        if names and names != self.classes:
            self.show_error("")
            self._typed = True
            self.set_classes(names)

    def capture(self, index: int) -> None:
        """Capture the window on screen as class ``index`` (a button or number key)."""
        if not 0 <= index < len(self.classes):
            return
        args: dict[str, Any] = {"label": self.classes[index]}
        if self.frame is not None:
            args["frame"] = self.frame
        self._send("capture", args)

    def _send(self, command: str, args: dict[str, Any]) -> None:
        """Emit a command: a new action, so the previous one's error goes."""
        self.show_error("")
        self.command.emit(command, args)

    def show_error(self, text: str) -> None:
        """Show why the server refused a command of this panel ("" hides it); it stays until the next action."""
        self.error.setText(text)
        self.error.setVisible(bool(text))

    def set_state(self, labels: dict[str, Any] | None, training: dict[str, Any] | None) -> bool:
        """Follow the server's ``labels`` and ``training`` state; True when it holds a new capture."""
        new_capture = False
        if labels:
            if not self._typed and labels.get("classes"):
                self.set_classes(labels["classes"])
            elif self._typed:  # keep the typed names, add any the server has counts for
                extra = [n for n in labels.get("counts", {}) if n not in self.classes]
                if extra:
                    self.set_classes(self.classes + extra)
            self.counts = dict(labels.get("counts") or {})
            self._label_buttons()
            captures = int(labels.get("captures", 0))
            new_capture = self.captures is not None and captures > self.captures
            self.captures = captures
            total = sum(self.counts.values())
            if labels.get("error"):
                self.status.setText(f"error: {labels['error']}")
            elif labels.get("last"):  # the newest capture of this session (after an undo: none)
                self.status.setText(f"✓ captured {labels['last']!r} · {total} captures in {labels['root']}")
            elif total:
                self.status.setText(f"{total} captures in {labels['root']}")
        if training:
            self._show_training(training)
        return new_capture

    def _show_training(self, training: dict[str, Any]) -> None:
        self.training = training
        state = training.get("state", "idle")
        running = state in ("running", "exporting")
        self.train.setEnabled(not running)
        self.train.setText("Training..." if running else "Train")
        epochs = max(int(training.get("epochs") or 1), 1)
        self.progress.setRange(0, epochs)
        self.progress.setValue(min(int(training.get("epoch") or 0), epochs) if state != "done" else epochs)
        self.progress.setFormat(f"{state} · epoch %v/%m" if state != "idle" else "not trained yet")
        message = training.get("message") or ""
        style = f"color: {ERROR};" if state == "failed" else ""
        if self.result.styleSheet() != style:  # (parsing a style sheet costs more than the rest of a stats message)
            self.result.setStyleSheet(style)
        # (idle: a server started again says what it serves, or nothing: the last server's result is stale)
        self.result.setText(f"training failed: {message}" if state == "failed" else message)
        self.result.setVisible(bool(self.result.text()))
