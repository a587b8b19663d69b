"""The picture: the window's events with a token grid and a segmentation mask over them (``EventView``), and the
frame a capture lights around it (``FlashFrame``)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets

from app.viewer.theme import ACCENT, mask_colors, token_colors
from mem_core.protocol import SensorView
from mem_core.visualize import POLARITY_RGBX, polarity_index

DEFAULT_LEVEL = 0.25  # model input value drawn at full brightness (the peak pixel is 1.0)
MASK_ALPHA = 100  # of 255
TOKEN_ALPHA = 40
FLASH_MS = 350  # how long a capture lights the picture's frame (a time, not a frame: at 3 fps one frame is 330 ms)
FLASH_PX = 4  # the frame's width
FLASH_COLOR = "#7cfc00"
STALE_OPACITY = 0.35  # a picture that is no longer live is drawn this dim
Region = tuple[float, float, float, float]  # (top, left, height, width) in image px


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
