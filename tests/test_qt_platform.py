"""``mem view`` says what is missing for a window (display, system libraries) instead of Qt aborting the process."""

from __future__ import annotations

import subprocess
import sys

import pytest

import app.qt_platform as qt_platform

LDD_OUTPUT = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibxcb-icccm.so.4 => not found
\tlibQt6Gui.so.6 => /site-packages/PySide6/Qt/lib/libQt6Gui.so.6 (0x00007f)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
"""


def test_missing_libraries_are_read_from_ldd():
    assert qt_platform.missing_from_ldd(LDD_OUTPUT) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]


@pytest.mark.slow  # runs the ldd it is given
def test_missing_xcb_libraries_are_named_with_the_packages_to_install(monkeypatch, tmp_path):
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    fake_ldd = tmp_path / "ldd"
    fake_ldd.write_text(f"#!/bin/sh\ncat <<'EOF'\n{LDD_OUTPUT}EOF\n")
    fake_ldd.chmod(0o755)
    monkeypatch.setattr(qt_platform, "xcb_plugin_files", lambda: [plugin])
    monkeypatch.setattr(qt_platform.shutil, "which", lambda name: str(fake_ldd))
    monkeypatch.setattr(qt_platform, "x_display_reachable", lambda display: True)
    monkeypatch.setattr(qt_platform.sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    problem = qt_platform.window_problem()
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1" in problem
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in problem
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # needs none of them
    assert qt_platform.window_problem() is None


def test_mem_view_without_a_running_display_is_one_line_not_an_abort():
    env = {"PATH": "/usr/bin:/bin", "DISPLAY": ":987", "HOME": "/tmp"}
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "view", "--connect", "tcp://127.0.0.1:5557", "--quit-after", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2, r.stderr[-2000:]  # Qt's own failure is SIGABRT (134)
    assert "the X display :987 is not running" in r.stderr and "Traceback" not in r.stderr
