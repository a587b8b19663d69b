"""Can Qt open a window here? Checked before Qt starts, so a missing system library or display is one clear line.

Without them Qt does not raise: it prints "could not load the Qt platform plugin xcb" and aborts the process
(exit 134). On Linux the xcb platform plugin links a handful of X libraries that PySide6's wheel does not ship; which
ones are missing is read from ``ldd`` of the plugin, plus ``libxcb-cursor`` that Qt >= 6.5 loads at run time.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The Debian/Ubuntu package of each library the xcb plugin needs (the README lists them for other systems too).
DEBIAN_PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libdbus-1.so.3": "libdbus-1-3",
}


def missing_from_ldd(ldd_output: str) -> list[str]:
    """The libraries ``ldd`` reports as ``not found``, each once, in order."""
    found = re.findall(r"^\s*(\S+) => not found", ldd_output, flags=re.MULTILINE)
    return list(dict.fromkeys(found))


def xcb_plugin_files() -> list[Path]:
    spec = importlib.util.find_spec("PySide6")  # found without importing Qt
    if spec is None or spec.origin is None:
        return []
    qt = Path(spec.origin).parent / "Qt"
    return [p for p in (qt / "plugins/platforms/libqxcb.so", qt / "lib/libQt6XcbQpa.so.6") if p.is_file()]


def missing_xcb_libraries() -> list[str]:
    """The system libraries Qt's xcb platform plugin needs and cannot find (empty when all are there or unknown)."""
    ldd = shutil.which("ldd")
    missing: list[str] = []
    for path in xcb_plugin_files() if ldd else []:
        result = subprocess.run([ldd, str(path)], capture_output=True, text=True, timeout=10, check=False)
        missing += missing_from_ldd(result.stdout)
    if xcb_plugin_files() and ctypes.util.find_library("xcb-cursor") is None:
        missing.append("libxcb-cursor.so.0")
    return list(dict.fromkeys(missing))


def x_display_reachable(display: str) -> bool:
    """Whether a local X display ``:N`` has its socket; remote displays (host:N) are assumed reachable."""
    match = re.fullmatch(r":(\d+)(\.\d+)?", display)
    return match is None or Path(f"/tmp/.X11-unix/X{match.group(1)}").exists()


def window_problem() -> str | None:
    """Why Qt could not open a window here, with what to do about it; None when it should work."""
    if not sys.platform.startswith("linux"):
        return None
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if platform and not platform.startswith("xcb"):
        return None  # offscreen, wayland, vnc...: Qt's own checks apply
    if not platform and os.environ.get("WAYLAND_DISPLAY"):
        return None
    display = os.environ.get("DISPLAY", "")
    if not display:
        return "no display (DISPLAY is not set): run it on a desktop, under xvfb-run, or with QT_QPA_PLATFORM=offscreen"
    if not x_display_reachable(display):
        return f"the X display {display} is not running (DISPLAY={display}); is the X server or Xvfb up?"
    missing = missing_xcb_libraries()
    if missing:
        packages = " ".join(DEBIAN_PACKAGES.get(lib, lib) for lib in missing)
        return (
            f"Qt's xcb platform plugin needs system libraries that are missing: {', '.join(missing)}. "
            f"On Debian/Ubuntu: sudo apt-get install {packages}"
        )
    return None
