"""End to end: ``mem serve`` replaying a real N-Cars file and ``mem view`` as separate processes."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from PySide6 import QtGui

from mem_core.export import export_random
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.representation import InputSpec

START_S = 90.0  # the server imports torch and loads the model: slow on a loaded machine


def lines_of(process: subprocess.Popen) -> queue.Queue:
    """The process's stdout lines, read in a thread so that waiting for one never blocks the test."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue, pattern: str, timeout: float) -> re.Match:
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        if match := re.search(pattern, line):
            return match
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; got {seen}")


@pytest.mark.slow
def test_view_shows_the_histogram_and_prediction_of_a_served_file(tmp_path, data_dir):
    export = export_random(
        tmp_path / "export",
        architecture=ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0),
        input_spec=InputSpec(n_max=3000, size=(32, 32)),
        tokenizer=TokenizerConfig(img_size=32, num_layers=3, num_tokens=64, hidden_dim=16),
    )
    recording = sorted((data_dir / "ncars-dev" / "val" / "cars").glob("*.dat"))[0]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    cli = [sys.executable, "-m", "app.cli"]
    serve = subprocess.Popen(
        [
            *cli,
            "serve",
            "--model",
            str(export),
            "--source",
            str(recording),
            "--pub",
            "tcp://127.0.0.1:*",
            "--duration",
            "120",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    view = None
    try:
        endpoint = wait_for_line(lines_of(serve), r"publishing on (tcp://\S+),", START_S).group(1)
        snapshot = tmp_path / "view.png"
        view = subprocess.run(
            [*cli, "view", "--connect", endpoint, "--snapshot", str(snapshot), "--quit-after", "6"],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_S,
        )
    finally:
        serve.kill()
        serve.wait(10)
    assert view.returncode == 0, view.stderr
    state = json.loads(snapshot.with_suffix(".json").read_text())
    assert state["link"] == "connected" and state["frames_shown"] > 0
    assert state["prediction"]["task"] == "classification"
    assert state["prediction"]["top_k"][0]["name"] in ("background", "car")
    assert state["histogram"]["shape"] == [32, 32] and state["histogram"]["lit_fraction"] > 0.05
    assert state["tokens"]["grid"] == [4, 4]

    image = QtGui.QImage(str(snapshot))
    x, y, w, h = state["histogram"]["rect"]
    assert w > 100 and h > 100, "the histogram fills a good part of the window"
    region = image.copy(x, y, w, h).convertToFormat(QtGui.QImage.Format.Format_RGB888)
    pixels = np.frombuffer(region.constBits(), np.uint8).reshape(h, region.bytesPerLine())[:, : 3 * w]
    pixels = pixels.reshape(h, w, 3).astype(int)
    red = (pixels[..., 0] > pixels[..., 2] + 60).mean()  # ON events
    blue = (pixels[..., 2] > pixels[..., 0] + 60).mean()  # OFF events
    assert red > 0.01 and blue > 0.01, f"the snapshot shows too few events: {red:.3f} red, {blue:.3f} blue"


def test_view_refuses_a_bad_endpoint_in_one_line():
    view = subprocess.run(
        [sys.executable, "-m", "app.cli", "view", "--connect", "garbage", "--quit-after", "1"],
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        capture_output=True,
        text=True,
        timeout=START_S,
    )
    assert view.returncode == 2
    assert view.stderr.strip() == "error: --connect 'garbage': expected tcp://HOST:PORT or ipc://PATH"
