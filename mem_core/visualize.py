"""Pictures of event data as numpy RGB arrays (no Qt, no torch): histograms, token maps, masks, grids."""

from __future__ import annotations

import functools

import numpy as np

OFF_RGB = np.array([40, 120, 255], dtype=np.float32)  # blue
ON_RGB = np.array([255, 70, 40], dtype=np.float32)  # red


def _polarity_table() -> np.ndarray:
    """(65536,) uint32: the RGBX colour (alpha 255) of every (OFF, ON) pair of 8-bit levels, indexed ``off << 8 | on``."""
    a = np.arange(256, dtype=np.float32) / 255
    rgb = np.clip(a[:, None, None] * OFF_RGB + a[None, :, None] * ON_RGB, 0, 255).astype(np.uint8).reshape(-1, 3)
    rgbx = np.concatenate([rgb, np.full((len(rgb), 1), 255, np.uint8)], axis=1)
    return rgbx.view(np.uint32).ravel()


POLARITY_RGBX = _polarity_table()


@functools.lru_cache(maxsize=8)
def _float16_levels(level: float) -> np.ndarray:
    """(65536,) uint8: the 8-bit level of every float16 bit pattern (NaN and negative values: 0)."""
    values = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    values = np.nan_to_num(values, nan=0.0, posinf=np.inf, neginf=0.0)
    return np.clip(values * (255.0 / level), 0, 255).astype(np.uint8)


def polarity_index(hist: np.ndarray, level: float) -> np.ndarray:
    """(2, H, W) OFF / ON values -> (H, W) uint16 index into ``POLARITY_RGBX``: each shown in 256 steps up to
    ``level`` (full brightness). float16 input, what the live server sends, goes through a table: 10x faster."""
    if hist.dtype == np.float16:
        levels = _float16_levels(float(level))[hist[:2].view(np.uint16)]
    else:
        levels = np.clip(np.asarray(hist[:2], dtype=np.float32) * (255.0 / level), 0, 255).astype(np.uint8)
    index = levels[0].astype(np.uint16) << 8
    index |= levels[1]
    return index


def histogram_rgbx(hist: np.ndarray, level: float | None = None) -> np.ndarray:
    """(2, H, W) counts or [0, 1] values -> (H, W, 4) uint8 RGBX (X = 255) on black: OFF blue, ON red, both
    magenta-ish. ``level`` is the value shown at full brightness (default: the 99th percentile of non-zero
    values)."""
    hist = np.asarray(hist)
    if hist.ndim != 3 or hist.shape[0] < 2:
        raise ValueError(f"expected a (C>=2, H, W) histogram, got shape {hist.shape}")
    if level is None:
        off, on = hist[0].astype(np.float32), hist[1].astype(np.float32)
        nz = np.concatenate([off[off > 0], on[on > 0]])
        level = float(np.percentile(nz, 99)) if nz.size else 1.0
    index = polarity_index(hist, max(level, 1e-12))
    return POLARITY_RGBX[index].view(np.uint8).reshape(*index.shape, 4)


def histogram_rgb(hist: np.ndarray, level: float | None = None) -> np.ndarray:
    """``histogram_rgbx`` as (H, W, 3) uint8 RGB."""
    return np.ascontiguousarray(histogram_rgbx(hist, level)[..., :3])


def label_palette(n: int) -> np.ndarray:
    """(n, 3) uint8 distinct colours; index 0 (background) is dark grey."""
    rng = np.random.default_rng(12345)
    colors = rng.integers(60, 256, size=(max(n, 1), 3)).astype(np.uint8)
    hexes = [
        "282828",
        "e6194b",
        "3cb44b",
        "ffe119",
        "0082c8",
        "f58230",
        "911eb4",
        "46f0f0",
        "f032e6",
        "d2f53c",
        "fabed4",
        "008080",
    ]
    base = np.array([[int(h[i : i + 2], 16) for i in (0, 2, 4)] for h in hexes], dtype=np.uint8)
    k = min(n, len(base))
    colors[:k] = base[:k]
    return colors[:n]


def tile(images: list[np.ndarray], columns: int, pad: int = 2) -> np.ndarray:
    """Arrange equally sized (H, W, 3) images in a grid with ``pad`` pixels of grey between them."""
    if not images:
        raise ValueError("nothing to tile")
    h, w, _ = images[0].shape
    rows = (len(images) + columns - 1) // columns
    out = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, 3), 64, dtype=np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, columns)
        out[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = img
    return out


def upscale(img: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour enlargement of an (H, W, 3) image, for small sensors in PNGs."""
    return np.repeat(np.repeat(img, factor, axis=0), factor, axis=1)


def save_png(path, img: np.ndarray) -> None:
    """Write an (H, W, 3) uint8 image as PNG (matplotlib's writer, no extra dependency)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image

    matplotlib.image.imsave(str(path), np.ascontiguousarray(img))


def save_labelled_png(path, grid: np.ndarray, rows: list[str], caption: str) -> None:
    """Write the tiled (H, W, 3) uint8 ``grid`` as PNG at its own resolution, each of its ``rows`` named on the left
    and ``caption`` above: a picture that says what it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h, w, _ = grid.shape
    left, top, dpi = 150, 36, 100
    width, height = max(w + left + 8, 8 * len(caption)), h + top + 4  # room for the caption over a narrow grid
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    ax = fig.add_axes((left / width, 4 / height, w / width, h / height))
    ax.imshow(grid, interpolation="nearest")
    ax.set_yticks([h / len(rows) * (k + 0.5) for k in range(len(rows))], rows, fontsize=9)
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.text(0.5, 1 - 6 / height, caption, ha="center", va="top", fontsize=9)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
