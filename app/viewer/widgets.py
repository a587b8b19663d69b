"""The viewer's widgets: the event image with overlays, top-k bars, confidence timeline, legend, controls.

Controls emit ``command(name, args)`` with ``args`` a dict declared ``object``: PySide drops a ``dict`` argument
of a signal declared ``Signal(str, dict)`` on its way to a slot, so the server would get the command alone.
"""

from __future__ import annotations

import time
import unicodedata
from collections import deque
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets

from mem_core.limits import MAX_WINDOW_EVENTS, MAX_WINDOW_MS
from mem_core.protocol import SensorView
from mem_core.visualize import POLARITY_RGBX, label_palette, polarity_index

pg.setConfigOptions(imageAxisOrder="row-major", antialias=True, background="#16181d", foreground="#c8ccd4")

DEFAULT_LEVEL = 0.25  # model input value drawn at full brightness (the peak pixel is 1.0)
MASK_ALPHA = 100  # of 255
TOKEN_ALPHA = 40
TIMELINE_S = 20.0
TIMELINE_REDRAW_S = 0.1  # the timeline is redrawn at most 10 times a second
TIMELINE_CLASSES = 5
ACCENT = "#e8eaf0"
ERROR = "#ff7b72"  # errors a user must read: contrast 6.5:1 on the window background
ACCUMULATION_RANGES = {"time": (1.0, MAX_WINDOW_MS), "events": (100.0, float(MAX_WINDOW_EVENTS))}  # log sliders
PENDING_S = 2.0  # a control keeps the user's choice on screen this long while the server has not confirmed it
FLASH_MS = 350  # how long a capture lights the picture's frame (a time, not a frame: at 3 fps one frame is 330 ms)
FLASH_PX = 4  # the frame's width
FLASH_COLOR = "#7cfc00"
STALE_OPACITY = 0.35  # a picture that is no longer live is drawn this dim
HOTKEY_CLASSES = 9  # classes with a number key (1-9)
Region = tuple[float, float, float, float]  # (top, left, height, width) in image px


def class_colors(n: int) -> np.ndarray:
    """(n, 3) uint8 colours for classification classes (the palette without its dark background grey)."""
    return label_palette(n + 1)[1:]


def mask_colors(n: int) -> np.ndarray:
    """(n, 3) uint8 segmentation colours: ``label_palette`` without its red, blue and purple, which would vanish
    among the ON (red) and OFF (blue) events under the mask."""
    colors = label_palette(n + 3)
    keep = np.ones(len(colors), bool)
    keep[[i for i in (1, 4, 6) if i < len(colors)]] = False
    return colors[keep][:n]


def token_colors(num_tokens: int) -> np.ndarray:
    """(num_tokens, 3) uint8 tints, a fixed colour per token id."""
    return np.random.default_rng(num_tokens).integers(40, 256, size=(num_tokens, 3)).astype(np.uint8)


def _packed_tints(colors: np.ndarray) -> np.ndarray:
    """(N,) uint32: RGBX colours premultiplied by the token overlay's opacity, X = 0 (added to ``_DIMMED_RGBX``)."""
    tints = np.zeros((len(colors), 4), np.uint8)
    tints[:, :3] = np.floor(colors.astype(np.float32) * (TOKEN_ALPHA / 255))
    return tints.view(np.uint32).ravel()


def _dimmed_table() -> np.ndarray:
    """``POLARITY_RGBX`` with the colour channels times (1 - the token overlay's opacity), X = 255."""
    table = POLARITY_RGBX.view(np.uint8).reshape(-1, 4).copy()
    table[:, :3] = np.floor(table[:, :3].astype(np.float32) * (1 - TOKEN_ALPHA / 255))
    return table.view(np.uint32).ravel()


_DIMMED_RGBX = _dimmed_table()


class EventView(pg.GraphicsLayoutWidget):
    """The window's events with a token grid and a segmentation mask over them, drawn at sensor resolution in the
    sensor's aspect ratio (the ``sensor`` message) or as the model input (``hist``, toggled by ``show_input``).

    OFF blue, ON red, fixed levels. The token grid and the mask cover the part of the picture the model input
    shows (the whole sensor unless the model crops it; a crop is outlined). The layers are blended into one RGB
    image in numpy and drawn as a single ``ImageItem`` (each extra image layer would cost the GUI thread a full
    scaled draw per frame). Setters store a layer; ``render`` draws.
    """

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        self.notice = QtWidgets.QLabel()  # over the picture: no server yet, a stream that stopped
        self.stale = False
        super().__init__(parent)  # (resizes: places the notice)
        self.notice.setParent(self)
        self.notice.setWordWrap(True)
        self.notice.setStyleSheet(f"background-color: rgba(0, 0, 0, 200); color: {ACCENT}; padding: 8px;")
        self.notice.setVisible(False)
        self.level = DEFAULT_LEVEL
        self.view = self.addViewBox(lockAspect=True, invertY=True, enableMenu=False)
        self.view.setMouseEnabled(False, False)
        self.image = pg.ImageItem()
        self.grid = pg.PlotCurveItem(connect="pairs", pen=pg.mkPen(255, 255, 255, 50, width=1), antialias=False)
        self.crop = QtWidgets.QGraphicsRectItem()
        self.crop.setPen(pg.mkPen(255, 255, 255, 140, width=1, style=QtCore.Qt.PenStyle.DashLine, cosmetic=True))
        self.hover = pg.TextItem(color=ACCENT, fill=pg.mkBrush(0, 0, 0, 170), anchor=(0, 1))
        for z, item in enumerate((self.image, self.grid, self.crop, self.hover)):
            item.setZValue(z)
            self.view.addItem(item)
        for item in (self.hover, self.grid, self.crop):
            item.setVisible(False)
        self.shape: tuple[int, int] | None = None  # (H, W) of the image shown
        self.hist: np.ndarray | None = None  # (2, H, W) model input
        self.sensor: SensorView | None = None
        self.tokens: np.ndarray | None = None
        self.mask: np.ndarray | None = None
        self.show_tokens = True
        self.show_mask = True
        self.show_input = False  # the model input instead of the sensor view
        self._set_token_colors(1)
        self._mask_colors = mask_colors(1)
        self._clear_ids: list[int] = []  # mask classes left untinted (named "background")
        self._grid_key: tuple | None = None  # (token grid shape, region) the grid lines were drawn for
        self.scene().sigMouseMoved.connect(self._mouse_moved)

    def set_notice(self, text: str, stale: bool = False) -> None:
        """A line over the picture ("" for none); ``stale`` dims the picture: what it shows is no longer live."""
        if text != self.notice.text():
            self.notice.setText(text)
            self.notice.setVisible(bool(text))
            self._place_notice()
        if stale != self.stale:
            self.stale = stale
            self.image.setOpacity(STALE_OPACITY if stale else 1.0)

    def _place_notice(self) -> None:
        width = max(self.width() - 16, 50)
        self.notice.setFixedWidth(width)
        self.notice.setFixedHeight(max(self.notice.heightForWidth(width), 0))
        self.notice.move(8, 8)

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place_notice()

    def _set_token_colors(self, num_tokens: int) -> None:
        self._token_colors = token_colors(num_tokens)
        self._token_tints = _packed_tints(self._token_colors)  # (num_tokens,) RGBX of the colours times TOKEN_ALPHA

    def set_histogram(self, hist: np.ndarray) -> None:
        """The (2, H, W) OFF / ON model input in [0, 1]; ``ValueError`` for another shape."""
        if hist.ndim != 3 or hist.shape[0] != 2 or hist.dtype.kind != "f":
            raise ValueError(f"a histogram must be float (2, H, W), got {hist.dtype} {hist.shape}")
        self.hist = hist

    def set_sensor(self, view: SensorView | None) -> None:
        """The window at sensor resolution (a checked ``sensor`` message), or None to forget it."""
        self.sensor = view

    def set_tokens(self, tokens: np.ndarray | None, num_tokens: int) -> None:
        """Token ids (h, w) for the overlay (None: no overlay); ``ValueError`` for another shape."""
        if tokens is not None and (tokens.ndim != 2 or tokens.dtype.kind not in "iu" or num_tokens < 1):
            raise ValueError(f"token ids must be integer (h, w), got {tokens.dtype} {tokens.shape}")
        self.tokens = tokens
        if len(self._token_colors) != num_tokens:
            self._set_token_colors(num_tokens)

    def set_mask(self, mask: np.ndarray | None, classes: list[str]) -> None:
        """Class ids (H, W) drawn over the histogram (None: no overlay); ``ValueError`` for another shape."""
        if mask is not None and (mask.ndim != 2 or mask.dtype.kind not in "u"):
            raise ValueError(f"a mask must be unsigned integer (H, W), got {mask.dtype} {mask.shape}")
        self.mask = mask
        self._clear_ids = [i for i, name in enumerate(classes) if name == "background"]
        if mask is not None and len(self._mask_colors) < max(len(classes), int(mask.max()) + 1):
            self._mask_colors = mask_colors(max(len(classes), int(mask.max()) + 1))

    def forget_layers(self) -> None:
        """Forget every layer (the image on screen stays until the next ``render`` with a histogram). Not named
        ``clear``: pyqtgraph sets its layout's ``clear`` on the instance, which would hide such a method."""
        self.hist = self.sensor = self.tokens = self.mask = None

    def set_overlays(self, tokens: bool, mask: bool) -> None:
        """Toggle the token and mask overlays."""
        self.show_tokens, self.show_mask = tokens, mask
        if not tokens:
            self.hover.setVisible(False)
        self.render()

    def set_show_input(self, show_input: bool) -> None:
        """Show the model input instead of the sensor view."""
        self.show_input = show_input
        self.render()

    @property
    def showing_sensor(self) -> bool:
        """Whether the sensor view is drawn (without one, the model input is)."""
        return self.sensor is not None and not (self.show_input and self.hist is not None)

    def picture(self) -> tuple[np.ndarray, Region] | None:
        """The (2, H, W) picture to draw and the region of it the model input covers (None before any frame)."""
        if self.showing_sensor:
            return self.sensor.image, self.sensor.input_region
        if self.hist is None:
            return None
        return self.hist, (0.0, 0.0, *map(float, self.hist.shape[1:]))

    def composite(self) -> np.ndarray | None:
        """(H, W, 3) uint8: the picture with the visible overlays blended in (None before the first frame)."""
        rgbx = self.composite_rgbx()
        return None if rgbx is None else rgbx[..., :3]

    def composite_rgbx(self) -> np.ndarray | None:
        """``composite`` as (H, W, 4) RGBX, what is drawn. Colours come from tables (``POLARITY_RGBX``): a 320 x 240
        sensor picture with the token overlay costs 0.5 ms, a tenth of blending it in floats."""
        picture = self.picture()
        if picture is None:
            return None
        image, region = picture
        index = polarity_index(image, max(self.level, 1e-12))  # (H, W)
        shape = index.shape
        show_mask = self.show_mask and self.mask is not None
        show_tokens = self.show_tokens and self.tokens is not None
        if show_tokens:
            token_ids, token_inside = spread(self.tokens, shape, region)
            token_ids = np.clip(token_ids, 0, len(self._token_colors) - 1)
            if not show_mask:  # a constant opacity: the picture dimmed plus the premultiplied tint, no overflow
                packed = np.where(
                    token_inside, _DIMMED_RGBX[index] + self._token_tints[token_ids], POLARITY_RGBX[index]
                )
                return packed.view(np.uint8).reshape(*shape, 4)
        rgbx = POLARITY_RGBX[index].view(np.uint8).reshape(*shape, 4)
        if not show_mask:
            return rgbx
        rgb = rgbx[..., :3].astype(np.float32)
        ids, inside = spread(self.mask, shape, region)
        rgb += self._mask_alpha(ids, inside) * (self._mask_colors[ids] - rgb)
        if show_tokens:
            rgb += (TOKEN_ALPHA / 255 * token_inside)[..., None] * (self._token_colors[token_ids] - rgb)
        rgbx[..., :3] = rgb
        return rgbx

    def _mask_alpha(self, ids: np.ndarray, inside: np.ndarray) -> np.ndarray:
        """(H, W, 1) opacity of the mask: a light fill, solid class borders, no tint on "background" or outside
        the model's region."""
        edge = np.zeros(ids.shape, bool)
        edge[:, 1:] |= ids[:, 1:] != ids[:, :-1]
        edge[1:, :] |= ids[1:, :] != ids[:-1, :]
        alpha = np.where(edge, 1.0, MASK_ALPHA / 255).astype(np.float32)
        alpha[np.isin(ids, self._clear_ids) & ~edge] = 0.0
        alpha[~inside] = 0.0
        return alpha[..., None]

    def render(self) -> None:
        """Draw the current layers."""
        rgbx = self.composite_rgbx()
        if rgbx is None:
            return
        # RGBX bytes with no levels pass straight to a QImage: the fastest draw pyqtgraph offers (the levels are
        # fixed by the colour tables already)
        self.image.setImage(rgbx, autoLevels=False)
        shape = rgbx.shape[:2]
        if shape != self.shape:
            self.shape = shape
            self.image.setRect(QtCore.QRectF(0, 0, shape[1], shape[0]))  # after the first setImage
            self.view.setRange(QtCore.QRectF(0, 0, shape[1], shape[0]), padding=0)
        self._draw_region()

    def _draw_region(self) -> None:
        """The grid lines over the model's region, and its outline when it is a crop of the sensor."""
        top, left, height, width = self.picture()[1]
        cropped = self.showing_sensor and (height, width) != tuple(map(float, self.shape))
        self.crop.setVisible(cropped)
        if cropped:
            self.crop.setRect(QtCore.QRectF(left, top, width, height))
        visible = self.show_tokens and self.tokens is not None
        self.grid.setVisible(visible)
        key = (self.tokens.shape, (top, left, height, width)) if visible else None
        if not visible or self._grid_key == key:
            return
        self._grid_key = key
        rows, cols = self.tokens.shape
        xs, ys = np.linspace(left, left + width, cols + 1), np.linspace(top, top + height, rows + 1)
        x = np.concatenate([np.repeat(xs, 2), np.tile([left, left + width], rows + 1)])  # vertical, horizontal
        y = np.concatenate([np.tile([top, top + height], cols + 1), np.repeat(ys, 2)])
        self.grid.setData(x, y)

    def token_at(self, x: float, y: float) -> tuple[int, int, int] | None:
        """(row, col, token id) under image coordinates (x, y), or None outside the grid."""
        picture = self.picture()
        if self.tokens is None or picture is None:
            return None
        top, left, height, width = picture[1]
        rows, cols = self.tokens.shape
        if not (left <= x < left + width and top <= y < top + height):
            return None
        r, c = int((y - top) * rows / height), int((x - left) * cols / width)
        return r, c, int(self.tokens[min(r, rows - 1), min(c, cols - 1)])

    def _mouse_moved(self, pos: QtCore.QPointF) -> None:
        point = self.view.mapSceneToView(pos)
        hit = self.token_at(point.x(), point.y()) if self.show_tokens else None
        if hit is None:
            self.hover.setVisible(False)
            return
        r, c, token = hit
        self.hover.setText(f"token {token}  (row {r}, col {c})")
        self.hover.setPos(point)
        self.hover.setVisible(True)


class FlashFrame(QtWidgets.QWidget):
    """A thin frame around ``child`` (the picture) that ``flash`` lights for ``FLASH_MS``: painted at once, not with
    the next frame, and held by the clock, so a capture shows at a few frames per second too. Lighting it changes a
    colour, not the layout: the picture does not move."""

    def __init__(self, child: QtWidgets.QWidget, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(FLASH_PX, FLASH_PX, FLASH_PX, FLASH_PX)
        layout.addWidget(child)
        self.child = child
        palette = self.palette()
        palette.setColor(QtGui.QPalette.ColorRole.Window, QtGui.QColor(FLASH_COLOR))
        self.setPalette(palette)
        self._timer = QtCore.QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(lambda: self._light(False))

    def flash(self) -> None:
        """Light the frame for ``FLASH_MS`` (again from now when it is lit)."""
        self._light(True)
        self._timer.start(FLASH_MS)

    def _light(self, on: bool) -> None:
        self.setAutoFillBackground(on)  # unlit: the window's background shows through
        self.repaint(QtGui.QRegion(self.rect()).subtracted(QtGui.QRegion(self.child.geometry())))  # the frame only


def spread(cells: np.ndarray, shape: tuple[int, int], region: Region) -> tuple[np.ndarray, np.ndarray]:
    """A (rows, cols) grid of values (token ids, mask classes) laid over ``region`` of an image of ``shape``:
    the value under each pixel centre (H, W) and whether the pixel lies in the region (H, W)."""
    top, left, height, width = region
    rows, inside_rows = _cells_along(shape[0], top, height, cells.shape[0])
    cols, inside_cols = _cells_along(shape[1], left, width, cells.shape[1])
    return cells[rows][:, cols], inside_rows[:, None] & inside_cols[None, :]


def _cells_along(size: int, start: float, length: float, cells: int) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``size`` pixels along a side: the cell its centre falls in (clipped), and whether it is inside."""
    index = np.floor((np.arange(size) + 0.5 - start) * cells / length).astype(np.intp)
    inside = (index >= 0) & (index < cells)
    return np.clip(index, 0, cells - 1), inside


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


def control_grid(
    parent: QtWidgets.QWidget, top: tuple[QtWidgets.QWidget, ...], bottom: QtWidgets.QWidget
) -> QtWidgets.QGridLayout:
    """``top`` side by side in a row, and ``bottom`` (a slider) under them across the whole width."""
    layout = QtWidgets.QGridLayout(parent)
    for column, widget in enumerate(top):
        layout.addWidget(widget, 0, column)
    layout.addWidget(bottom, 1, 0, 1, len(top))
    return layout


class ReplayControls(QtWidgets.QGroupBox):
    """Play / pause, one window forward, speed and seek for a replayed file or corpus. Emits
    ``command(name, args)``."""

    command = QtCore.Signal(str, object)
    SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Replay", parent)
        self.play = QtWidgets.QPushButton("Pause")
        self.step = QtWidgets.QPushButton("Step")
        self.step.setToolTip("Pause and show the next window of the replay")
        self.speed = QtWidgets.QComboBox()
        self.speed.addItems([f"{s:g}x" for s in self.SPEEDS])
        self.speed.setCurrentIndex(self.SPEEDS.index(1.0))
        self.seek = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
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
        self.command.emit("seek", {"position_s": self.seek.value() / 1000 * self.duration_s})

    def set_state(self, replay: dict, confirmed: bool = False) -> None:
        """Follow the server's replay state (``playing``, ``speed``, ``position_s``, ``duration_s``); ``confirmed``
        for the state in a reply to a command (it shows the command's effect)."""
        if confirmed:
            self._seeking_until = 0.0
        self.playing = bool(replay.get("playing", True))
        self.play.setText("Pause" if self.playing else "Play")
        self.duration_s = float(replay.get("duration_s", 0.0))
        speed = float(replay.get("speed", 1.0))
        if speed in self.SPEEDS and not self.speed.view().isVisible():
            self.speed.setCurrentIndex(self.SPEEDS.index(speed))
        if self.seek.isSliderDown() or time.monotonic() < self._seeking_until:
            return
        position = float(replay.get("position_s", 0.0))
        self.position.setText(f"{position:.2f} / {self.duration_s:.2f} s")
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
        self.state: dict[str, Any] = {"events": 30_000, "ms": None, "default_events": 30_000, "default_ms": None}
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
        self.status = QtWidgets.QLabel("capture the window on screen with a class's button or number key")
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


def dark_palette() -> QtGui.QPalette:
    """A dark Fusion palette that matches the plots: placeholder text readable on the fields (QPalette's default is
    half-transparent black), disabled controls greyed out (by default they look like enabled ones)."""
    palette = QtGui.QPalette()
    roles = QtGui.QPalette.ColorRole
    for role, color in (
        (roles.Window, "#1e2026"),
        (roles.WindowText, "#d8dbe2"),
        (roles.Base, "#16181d"),
        (roles.AlternateBase, "#23262d"),
        (roles.Text, "#d8dbe2"),
        (roles.PlaceholderText, "#8f96a3"),
        (roles.Button, "#2a2d35"),
        (roles.ButtonText, "#d8dbe2"),
        (roles.Highlight, "#3d7eff"),
        (roles.HighlightedText, "#ffffff"),
        (roles.ToolTipBase, "#2a2d35"),
        (roles.ToolTipText, "#d8dbe2"),
    ):
        palette.setColor(role, QtGui.QColor(color))
    disabled = QtGui.QPalette.ColorGroup.Disabled
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        palette.setColor(disabled, role, QtGui.QColor("#6c727e"))
    palette.setColor(disabled, roles.Button, QtGui.QColor("#23262d"))
    return palette
