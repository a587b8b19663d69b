"""What the predictions say: the top-k bars, the confidence timeline and the legend of a segmentation mask."""

from __future__ import annotations

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.viewer.theme import ACCENT, mask_colors

TIMELINE_S = 20.0
TIMELINE_REDRAW_S = 0.1  # the timeline is redrawn at most 10 times a second
TIMELINE_CLASSES = 5


class TopKPanel(QtWidgets.QWidget):
    """The top-k classes of the newest prediction as labelled bars, the best one large."""

    def __init__(self, k: int = 5, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QtWidgets.QGridLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.best = QtWidgets.QLabel("waiting for predictions")
        self.best.setStyleSheet(f"font-size: 22px; font-weight: 600; color: {ACCENT};")
        layout.addWidget(self.best, 0, 0, 1, 3)
        self.names: list[QtWidgets.QLabel] = []
        self.bars: list[QtWidgets.QProgressBar] = []
        self.percents: list[QtWidgets.QLabel] = []  # beside the bar: on it, a light class colour hid the text
        for i in range(k):
            name = QtWidgets.QLabel("")
            bar = QtWidgets.QProgressBar()
            bar.setRange(0, 1000)
            bar.setTextVisible(False)
            bar.setFixedHeight(18)
            percent = QtWidgets.QLabel("")
            percent.setAlignment(QtCore.Qt.AlignmentFlag.AlignRight | QtCore.Qt.AlignmentFlag.AlignVCenter)
            percent.setMinimumWidth(percent.fontMetrics().horizontalAdvance("100.0 %") + 4)
            layout.addWidget(name, i + 1, 0)
            layout.addWidget(bar, i + 1, 1)
            layout.addWidget(percent, i + 1, 2)
            self.names.append(name)
            self.bars.append(bar)
            self.percents.append(percent)
        layout.setColumnStretch(1, 1)
        self.top_k: list[dict] = []
        self.set_top_k([])

    def set_top_k(self, top_k: list[dict], colors: np.ndarray | None = None) -> None:
        """``top_k``: [{"id", "name", "prob"}, ...] best first; ``colors``: (K, 3) per class id."""
        self.top_k = top_k
        if top_k:
            self.best.setText(f"{top_k[0]['name']}  {100 * top_k[0]['prob']:.0f} %")
        for i, (name, bar, percent) in enumerate(zip(self.names, self.bars, self.percents, strict=True)):
            visible = i < len(top_k)
            for widget in (name, bar, percent):
                widget.setVisible(visible)
            if not visible:
                continue
            entry = top_k[i]
            name.setText(entry["name"])
            bar.setValue(round(1000 * entry["prob"]))
            percent.setText(f"{100 * entry['prob']:.1f} %")
            if colors is not None and 0 <= entry["id"] < len(colors):
                r, g, b = (int(v) for v in colors[entry["id"]])
                style = f"QProgressBar::chunk {{ background-color: rgb({r}, {g}, {b}); }}"
                if bar.styleSheet() != style:  # parsing a style sheet costs more than the rest of the frame
                    bar.setStyleSheet(style)


class ConfidenceTimeline(pg.PlotWidget):
    """Probability of the leading classes over the last ``TIMELINE_S`` seconds."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        # room beyond the end ticks for half their label: pyqtgraph drops a label that reaches past the plot
        self.setYRange(0, 1, padding=0.08)
        self.setXRange(-TIMELINE_S, 0, padding=0.05)
        self.setMouseEnabled(False, False)
        self.hideButtons()
        self.setMenuEnabled(False)
        self.setLabel("left", "probability")
        self.setLabel("bottom", "seconds ago")
        self.showGrid(x=True, y=True, alpha=0.15)
        self.getAxis("bottom").setTicks([[(float(t), f"{t:g}") for t in np.arange(-TIMELINE_S, 0.1, 5)]])
        self.getAxis("left").setTicks([[(p, f"{p:g}") for p in (0.0, 0.25, 0.5, 0.75, 1.0)]])
        self.legend = self.addLegend(offset=(8, 8), labelTextSize="8pt")
        self.history: deque[tuple[float, np.ndarray]] = deque(maxlen=2000)  # (monotonic time, probs (K,))
        self.curves: dict[int, pg.PlotDataItem] = {}
        self.marks: list[tuple[float, pg.InfiniteLine]] = []  # (monotonic time, line): model switches
        self._drawn = -np.inf  # monotonic time of the last redraw

    def sizeHint(self) -> QtCore.QSize:
        """Its minimum: the side panel gives it the room its controls leave (pyqtgraph asks for 600 x 480)."""
        return self.minimumSize().expandedTo(QtCore.QSize(200, 180))

    def clear_history(self) -> None:
        """Forget everything (a new server session)."""
        self._clear_curves()
        for _, line in self.marks:
            self.removeItem(line)
        self.marks.clear()

    def _clear_curves(self) -> None:
        self.history.clear()
        for curve in self.curves.values():
            self.removeItem(curve)
        self.curves.clear()
        self.legend.clear()

    def mark(self, t: float, text: str) -> None:
        """A labelled vertical line at monotonic time ``t`` (a new model took over), moving left with the curves."""
        line = pg.InfiniteLine(
            pos=0.0,
            angle=90,
            pen=pg.mkPen(ACCENT, width=1, style=QtCore.Qt.PenStyle.DashLine),
            label=text,
            labelOpts={"position": 0.92, "color": ACCENT, "fill": pg.mkBrush(0, 0, 0, 160)},
        )
        self.addItem(line)
        self.marks.append((t, line))
        self._drawn = -np.inf  # show it at the next prediction

    def add(self, t: float, probs: np.ndarray, classes: list[str], colors: np.ndarray) -> None:
        """Append one prediction at monotonic time ``t``; redraw when the last redraw is old enough."""
        if self.history and len(self.history[-1][1]) != len(probs):
            self._clear_curves()  # another model's classes (the switch's mark stays)
        self.history.append((t, np.asarray(probs, np.float32)))
        while self.history and self.history[0][0] < t - TIMELINE_S:
            self.history.popleft()
        if t - self._drawn < TIMELINE_REDRAW_S:
            return
        self._drawn = t
        for mark_t, line in list(self.marks):
            if mark_t < t - TIMELINE_S:
                self.removeItem(line)
                self.marks.remove((mark_t, line))
            else:
                line.setPos(mark_t - t)
        times = np.array([s for s, _ in self.history]) - t
        probs_hist = np.stack([p for _, p in self.history])  # (T, K)
        leading = np.argsort(-probs_hist.mean(0))[:TIMELINE_CLASSES].tolist()
        for class_id in [c for c in self.curves if c not in leading]:
            self.removeItem(self.curves.pop(class_id))
            self.legend.removeItem(classes[class_id] if class_id < len(classes) else str(class_id))
        for class_id in leading:
            if class_id not in self.curves:
                r, g, b = (int(v) for v in colors[class_id % len(colors)])
                name = classes[class_id] if class_id < len(classes) else str(class_id)
                self.curves[class_id] = self.plot(pen=pg.mkPen(r, g, b, width=2), name=name)
            self.curves[class_id].setData(times, probs_hist[:, class_id])


class SegmentLegend(QtWidgets.QGroupBox):
    """Colour swatches and names of the classes present in the newest mask."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Classes in view", parent)
        self.grid = QtWidgets.QGridLayout(self)
        self.present: tuple[int, ...] = ()
        self.labels: list[str] = []

    def set_classes(self, present: list[int], classes: list[str]) -> None:
        """Show ``present`` class ids (rebuilt only when the set changes)."""
        key = tuple(present)
        if key == self.present and self.labels:
            return
        self.present = key
        while self.grid.count():
            self.grid.takeAt(0).widget().deleteLater()
        palette = mask_colors(max(len(classes), max(present, default=0) + 1))
        self.labels = []
        for row, class_id in enumerate(present):
            swatch = QtWidgets.QLabel()
            r, g, b = (int(v) for v in palette[class_id])
            swatch.setFixedSize(16, 16)
            swatch.setStyleSheet(f"background-color: rgb({r}, {g}, {b}); border: 1px solid #555;")
            name = classes[class_id] if class_id < len(classes) else f"class {class_id}"
            self.labels.append(name)
            self.grid.addWidget(swatch, row, 0)
            self.grid.addWidget(QtWidgets.QLabel(name), row, 1)
        self.grid.setColumnStretch(1, 1)
