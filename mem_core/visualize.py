"""Pictures of event data as numpy RGB arrays (no Qt, no torch): histograms, token maps, masks, grids."""

from __future__ import annotations

import numpy as np

OFF_RGB = np.array([40, 120, 255], dtype=np.float32)  # blue
ON_RGB = np.array([255, 70, 40], dtype=np.float32)  # red


def histogram_rgb(hist: np.ndarray, level: float | None = None) -> np.ndarray:
    """(2, H, W) counts or [0, 1] values -> (H, W, 3) uint8 on black: OFF blue, ON red, both magenta-ish.

    ``level`` is the value shown at full brightness (default: the 99th percentile of non-zero values).
    """
    hist = np.asarray(hist, dtype=np.float32)
    if hist.ndim != 3 or hist.shape[0] < 2:
        raise ValueError(f"expected a (C>=2, H, W) histogram, got shape {hist.shape}")
    off, on = hist[0], hist[1]
    if level is None:
        nz = np.concatenate([off[off > 0], on[on > 0]])
        level = float(np.percentile(nz, 99)) if nz.size else 1.0
    level = max(level, 1e-12)
    a_off = np.clip(off / level, 0, 1)[..., None]
    a_on = np.clip(on / level, 0, 1)[..., None]
    rgb = a_off * OFF_RGB + a_on * ON_RGB
    return np.clip(rgb, 0, 255).astype(np.uint8)


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


def mask_rgb(mask: np.ndarray, num_classes: int) -> np.ndarray:
    """(H, W) class ids -> (H, W, 3) uint8 colours."""
    palette = label_palette(max(num_classes, int(mask.max()) + 1))
    return palette[np.asarray(mask, dtype=np.int64)]


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
