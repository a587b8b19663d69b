"""The viewer's look: the dark palette, text colours, and the colours of classes, masks and tokens."""

from __future__ import annotations

import numpy as np
from PySide6 import QtGui

from mem_core.visualize import label_palette

ACCENT = "#e8eaf0"
ERROR = "#ff7b72"  # errors a user must read: contrast 6.5:1 on the window background


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
