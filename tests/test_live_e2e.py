"""End to end: ``mem serve`` replaying real files and a corpus as users start it, and ``mem view`` as a process or
in-process (pytest-qt) driving the server from its controls; what the server publishes is checked at a separate
subscriber."""

from __future__ import annotations

import contextlib
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
import zmq
from conftest import synthetic_events
from PySide6 import QtGui

from app.live.sensor_view import sensor_view
from app.viewer.client import LiveClient
from app.viewer.window import ViewerWindow
from mem_core.corpus import CorpusWriter
from mem_core.events import SensorSize
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.protocol import decode
from mem_core.representation import InputSpec
from mem_core.runs.export import export_random

pytestmark = pytest.mark.slow  # a server and the viewer on real sockets with a model

START_S = 90.0  # the server imports torch and loads the model: slow on a loaded machine
CLI = [sys.executable, "-m", "app.cli"]
ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}


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


def wait_for_prediction(endpoint: str, timeout: float = START_S) -> None:
    """Return once the server at ``endpoint`` publishes its first prediction (its model has loaded)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"pred")
    sub.connect(endpoint)
    try:
        if not sub.poll(int(timeout * 1000)):
            raise AssertionError(f"no prediction from {endpoint} within {timeout} s")
    finally:
        sub.close(0)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A tiny random classifier (32 x 32 input, 3000-event windows) with a 64-token tokenizer."""
    return export_random(
        tmp_path_factory.mktemp("export"),
        architecture=ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0),
        input_spec=InputSpec(n_max=3000, size=(32, 32)),
        tokenizer=TokenizerConfig(img_size=32, num_layers=3, num_tokens=64, hidden_dim=16),
    )


@contextlib.contextmanager
def mem_serve(export, source):
    """``mem serve`` replaying ``source`` in a loop, as a user starts it; yields its PUB endpoint."""
    command = [*CLI, "serve", "--model", str(export), "--source", str(source), "--loop", "--pub", "tcp://127.0.0.1:*"]
    serve = subprocess.Popen(
        [*command, "--stop-after", "150"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield wait_for_line(lines_of(serve), r"publishing on (tcp://\S+),", START_S).group(1)
    finally:
        serve.kill()
        serve.wait(10)


@pytest.mark.slow
def test_view_shows_the_sensor_picture_and_prediction_of_a_served_file(tmp_path, data_dir, export):
    recording = sorted((data_dir / "ncars-dev" / "val" / "cars").glob("*.dat"))[0]
    snapshot = tmp_path / "view.png"
    with mem_serve(export, recording) as endpoint:
        wait_for_prediction(endpoint)  # the model loads while the server already streams pictures (slow when loaded)
        view = subprocess.run(
            [*CLI, "view", "--connect", endpoint, "--snapshot", str(snapshot), "--quit-after", "6"],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=START_S,
        )
    assert view.returncode == 0, view.stderr
    state = json.loads(snapshot.with_suffix(".json").read_text())
    assert state["link"] == "connected" and state["frames_shown"] > 0
    assert state["prediction"]["task"] == "classification"
    assert state["prediction"]["top_k"][0]["name"] in ("background", "car")
    picture = state["histogram"]  # N-Cars at sensor resolution: 120 wide, 100 high, not the 32 x 32 model input
    assert picture["view"] == "sensor" and picture["shape"] == picture["sensor"] == [100, 120]
    assert picture["lit_fraction"] > 0.02 and state["input"] == [32, 32]
    assert state["tokens"]["grid"] == [4, 4]

    image = QtGui.QImage(str(snapshot))
    x, y, w, h = picture["rect"]
    assert w > 100 and h > 100, "the picture fills a good part of the window"
    assert abs(w / h - 1.2) < 0.03, "in the sensor's aspect ratio"
    region = image.copy(x, y, w, h).convertToFormat(QtGui.QImage.Format.Format_RGB888)
    pixels = np.frombuffer(region.constBits(), np.uint8).reshape(h, region.bytesPerLine())[:, : 3 * w]
    pixels = pixels.reshape(h, w, 3).astype(int)
    red = (pixels[..., 0] > pixels[..., 2] + 60).mean()  # ON events
    blue = (pixels[..., 2] > pixels[..., 0] + 60).mean()  # OFF events
    assert red > 0.01 and blue > 0.01, f"the snapshot shows too few events: {red:.3f} red, {blue:.3f} blue"


def rate_of(preds) -> float:
    """Seconds of the stream per second of wall time over ``pred`` messages (newest event time vs arrival)."""
    first, last = preds[0].header, preds[-1].header
    return (last["window"]["t_last_us"] - first["window"]["t_last_us"]) / 1e6 / (last["t_arrival"] - first["t_arrival"])


def preds_after(tap, since: float, seconds: float) -> list:
    """``pred`` messages whose newest event arrived after wall time ``since``, until they span ``seconds``."""
    preds, deadline = [], time.monotonic() + START_S
    while len(preds) < 2 or preds[-1].header["t_arrival"] - since < seconds:
        assert time.monotonic() < deadline, f"{len(preds)} predictions after the command"
        if tap.poll(100) and (message := decode(tap.recv_multipart())).header["t_arrival"] > since:
            preds.append(message)
    return preds


def view(qtbot, endpoint: str) -> tuple[LiveClient, ViewerWindow, list[dict]]:
    """A shown viewer on ``endpoint``, its client, and the control replies it receives (as they come)."""
    client = LiveClient(endpoint)
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    window.show()
    replies: list[dict] = []
    client.control_reply.connect(replies.append)
    return client, window, replies


@pytest.mark.slow
def test_speed_pause_seek_and_accumulation_set_in_the_viewer_change_what_the_server_publishes(qtbot, data_dir, export):
    """Viewer -> control socket -> ``mem serve`` -> published frames, checked at a separate subscriber."""
    recording = data_dir / "fixtures" / "nmnist_sample.bin"  # 310 ms, replayed in a loop
    with mem_serve(export, recording) as endpoint, contextlib.closing(zmq.Context.instance().socket(zmq.SUB)) as tap:
        tap.setsockopt(zmq.SUBSCRIBE, b"pred")
        tap.connect(endpoint)
        client, window, replies = view(qtbot, endpoint)
        qtbot.waitUntil(lambda: window.replay.isVisible() and window.frames_shown > 0, timeout=START_S * 1000)
        qtbot.waitUntil(lambda: client.send_control("state"), timeout=START_S * 1000)  # the control link is up
        qtbot.waitUntil(lambda: bool(replies), timeout=START_S * 1000)
        preds_after(tap, 0.0, 0.0)  # the model serves (the viewer shows sensor views while it loads)

        def reply_to(action, command: str) -> dict:
            """Do ``action`` in the viewer; the server's (successful) reply to it."""
            count = len(replies)
            action()
            qtbot.waitUntil(lambda: len(replies) > count, timeout=START_S * 1000)
            reply = replies[-1]
            assert reply["command"] == command and reply["ok"], reply
            return reply["state"]

        replay = window.replay
        for speed, lo, hi in ((4.0, 2.5, 6.0), (0.25, 0.15, 0.4)):
            reply_to(lambda speed=speed: replay.speed.activated.emit(replay.SPEEDS.index(speed)), "speed")
            rate = rate_of(preds_after(tap, time.time(), 1.5))
            assert lo < rate < hi, f"at {speed}x the published frames advance {rate:.2f} s per second"

        paused = reply_to(replay.play.click, "pause")["source"]["replay"]
        paused_at = time.time()
        qtbot.wait(1000)
        while tap.poll(0):
            assert decode(tap.recv_multipart()).header["t_arrival"] <= paused_at, "events arrived while paused"
        target = 0.2 if paused["position_s"] < 0.15 else 0.02  # far from where it paused
        replay.seek.setValue(round(1000 * target / paused["duration_s"]))
        position = reply_to(replay.seek.sliderReleased.emit, "seek")["source"]["replay"]["position_s"]
        assert abs(position - target) < 0.002 and replay.seek.value() == round(1000 * position / paused["duration_s"])
        while tap.poll(300):  # the window the seek drew
            tap.recv_multipart()
        stepped = reply_to(replay.step.click, "step")["source"]["replay"]  # one window on, still paused
        assert not stepped["playing"] and stepped["position_s"] > position
        assert tap.poll(START_S * 1000), "no prediction for the stepped window"
        shown = decode(tap.recv_multipart()).header["window"]["position_s"]
        assert position < shown <= stepped["position_s"] + 1e-6, (position, shown, stepped)
        position = stepped["position_s"]
        played_at = time.time()
        reply_to(replay.play.click, "play")
        first = preds_after(tap, played_at, 0.0)[0].header["window"]["position_s"]
        ahead = (first - position) % (paused["duration_s"] + 1e-6)  # the replay loops: past the end is the start
        assert ahead < 0.08, f"stepped to {position:.3f} s, the next frame shows {first:.3f} s"

        accumulation = window.accumulation  # the export records no time span: windows of 3000 events
        assert accumulation.mode.currentText() == "events" and accumulation.value.text() == "3,000 events"
        step = accumulation.STEPS // 4  # 100 * 10^(4 / 4) = 1000 events
        events = reply_to(lambda: accumulation.slider.setValue(step), "window")["accumulation"]["events"]
        assert events == 1000
        sizes = [p.header["window"]["events"] for p in preds_after(tap, time.time(), 1.0)]
        assert max(sizes) == 1000, f"window sizes {sizes}"  # (the ring refills after the seek)
        accumulation.mode.setCurrentText("time")
        reply_to(lambda: accumulation.mode.activated.emit(0), "window")  # 50 ms: the model has no time span
        step = accumulation.STEPS // 3  # 10^(4 / 3) = 22 ms
        ms = reply_to(lambda: accumulation.slider.setValue(step), "window")["accumulation"]["ms"]
        assert ms == 22.0 and accumulation.value.text().startswith("22 ms")
        windows = [p.header["window"] for p in preds_after(tap, time.time(), 0.5)]
        assert max((w["t_last_us"] - w["t_first_us"]) / 1e3 for w in windows) <= ms
        client.close()


@pytest.mark.slow
def test_view_names_the_corpus_recording_it_replays_and_redraws_a_seek_while_paused(qtbot, tmp_path, export):
    """``mem serve --source CORPUS`` as a user starts it, and the viewer: its header names the recording playing, and
    a seek while paused draws the window ending at the new position (the server's model sees 3000 events)."""
    sensor, half = SensorSize(32, 48), SensorSize(32, 24)
    left, right = synthetic_events(6000, half, seed=1), synthetic_events(6000, half, seed=2)  # 0.6 s each
    right["x"] += half.width
    root = tmp_path / "lab"
    with CorpusWriter(root) as writer:
        writer.add_recording("left", left, sensor)
        writer.add_recording("right", right, sensor)
    with mem_serve(export, root) as endpoint:
        client, window, replies = view(qtbot, endpoint)
        for recording in ("left", "right"):
            qtbot.waitUntil(lambda r=recording: f"source corpus (lab/{r}, 48 x 32)" in window.header.text(),
                            timeout=START_S * 1000)  # fmt: skip
        qtbot.waitUntil(lambda: window.replay.isVisible() and window.view.sensor is not None, timeout=START_S * 1000)
        wait_for_prediction(endpoint)

        def reply_to(action, command: str) -> dict:
            count = len(replies)
            action()
            qtbot.waitUntil(lambda: len(replies) > count, timeout=START_S * 1000)
            assert replies[-1]["command"] == command and replies[-1]["ok"], replies[-1]
            return replies[-1]["state"]

        replay = window.replay
        reply_to(replay.play.click, "pause")
        qtbot.wait(1000)  # the windows in flight at the pause are drawn
        shown = window.view.sensor.frame
        right_starts = int(left["t"][-1]) - int(left["t"][0]) + 1  # us: where ``right`` begins on the timeline
        replay.seek.setValue(round(1000 * (right_starts / 1e6 + 0.4) / replay.duration_s))
        position_us = int(replay.seek.value() / 1000 * replay.duration_s * 1e6)  # what the viewer asks for
        reply_to(replay.seek.sliderReleased.emit, "seek")
        qtbot.waitUntil(lambda: window.view.sensor.frame > shown, timeout=START_S * 1000)
        end = int(np.searchsorted(right["t"], int(right["t"][0]) + position_us - right_starts))
        np.testing.assert_array_equal(window.view.sensor.image, sensor_view(right[end - 3000 : end], sensor)[0])
        qtbot.waitUntil(lambda: "source corpus (lab/right" in window.header.text(), timeout=START_S * 1000)
        assert not replay.playing
        client.close()


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
