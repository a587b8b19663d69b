"""The Qt viewer, offscreen: what it draws from the server's messages, its controls, and its ZMQ client."""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np
import pytest
import zmq
from PySide6 import QtCore, QtGui

from app.viewer.client import LiveClient, control_endpoint
from app.viewer.event_view import FLASH_COLOR, FLASH_MS, TOKEN_ALPHA
from app.viewer.theme import dark_palette, token_colors
from app.viewer.window import ViewerWindow
from mem_core.protocol import decode, decode_control, encode, encode_control
from mem_core.visualize import OFF_RGB, ON_RGB, histogram_rgb

WAIT_MS = 30_000
CLASSES = ["background", "car", "truck"]


def message(topic: str, seq: int = 0, arrays=None, session: str = "S1", **fields):
    return decode(encode(topic, seq, arrays, session=session, **fields))


def hist_with_on_and_off(size: int = 16) -> np.ndarray:
    """(2, size, size): ON events in the top-left quarter, OFF events in the bottom-right quarter."""
    hist = np.zeros((2, size, size), np.float16)
    half = size // 2
    hist[1, :half, :half] = 1.0
    hist[0, half:, half:] = 1.0
    return hist


def pred(probs, seq: int = 0, **fields):
    probs = np.asarray(probs, np.float32)
    order = np.argsort(-probs)
    top_k = [{"id": int(i), "name": CLASSES[i], "prob": float(probs[i])} for i in order]
    return message("pred", seq, {"probs": probs}, task="classification", classes=CLASSES, top_k=top_k, **fields)


@pytest.fixture
def window(qtbot):
    w = ViewerWindow()
    qtbot.addWidget(w)
    w.show()
    w.activateWindow()  # its shortcuts (the number keys) act in the active window only
    qtbot.waitUntil(w.isActiveWindow, timeout=10_000)
    return w


def test_histogram_is_drawn_on_black_in_polarity_colours(window):
    window.apply({"hist": message("hist", 0, {"hist": hist_with_on_and_off()})})
    rgb = window.view.composite()
    on, off, empty = rgb[2, 2].astype(int), rgb[12, 12].astype(int), rgb[2, 12]
    assert on[0] > on[2] + 100, "ON events are drawn red"
    assert off[2] > off[0] + 100, "OFF events are drawn blue"
    assert empty.tolist() == [0, 0, 0]
    assert window.view.shape == (16, 16) and window.frames_shown == 1


def test_messages_whose_content_does_not_fit_the_topic_are_dropped_and_counted(window):
    good = hist_with_on_and_off()
    window.apply({"hist": message("hist", 0, {"hist": good})})
    window.apply({"hist": message("hist", 1, {"hist": np.zeros(5, np.float32)})})
    window.apply({"tokens": message("tokens", 0, {"tokens": np.zeros((4, 4), np.int32)})})  # no num_tokens
    window.apply({"pred": message("pred", 0, {"probs": np.ones(2, np.float32)}, task="classification")})
    assert window.bad_messages == 3
    np.testing.assert_array_equal(window.view.hist, good)  # the last good frame stays on screen
    window.update_status()
    assert window.status_labels["dropped"].text() == "dropped 3"


def test_picture_colours_are_the_polarity_blend_whatever_the_input_type():
    """The colour tables (the viewer's fast path) draw what the blend formula says, for float16 and other input."""
    rng = np.random.default_rng(0)
    hist = rng.random((2, 24, 32)) * 1.5 * (rng.random((2, 24, 32)) < 0.5)
    level = 0.8
    a = np.clip(hist / level, 0, 1)[..., None]
    expected = np.clip(a[0] * OFF_RGB + a[1] * ON_RGB, 0, 255)
    for dtype in (np.float16, np.float32, np.float64):
        rgb = histogram_rgb(hist.astype(dtype), level=level).astype(np.float32)
        assert np.abs(rgb - expected).max() <= 3, dtype
    counts = np.zeros((2, 1, 3), np.int32)
    counts[0, 0, 0], counts[1, 0, 1] = 5, 1  # a default level: the 99th percentile of the counts
    off, on, empty = histogram_rgb(counts)[0].tolist()
    assert off == [40, 120, 255] and empty == [0, 0, 0]
    assert 40 < on[0] < 60 and on[0] > 3 * on[2], "one event against a peak of five: a dim red"


def test_levels_are_fixed_so_a_frame_does_not_rescale_to_its_own_peak(window):
    """A faint frame stays faint: the same value gives the same brightness in every frame."""
    hist = hist_with_on_and_off()
    window.apply({"hist": message("hist", 0, {"hist": hist})})
    bright = window.view.composite()[2, 2].copy()
    window.apply({"hist": message("hist", 1, {"hist": hist * np.float16(0.1)})})
    faint = window.view.composite()[2, 2]
    assert int(faint[0]) < int(bright[0])


def test_token_overlay_tints_cells_toggles_and_shows_the_id_under_the_mouse(window):
    hist = np.zeros((2, 16, 16), np.float16)
    tokens = np.arange(16, dtype=np.int32).reshape(4, 4)  # one token per 4 x 4 cell
    window.apply(
        {"hist": message("hist", 0, {"hist": hist}), "tokens": message("tokens", 0, {"tokens": tokens}, num_tokens=64)}
    )
    tinted = window.view.composite()
    expected = TOKEN_ALPHA / 255 * token_colors(64)[[0, 1]].astype(np.float32)  # cells (0, 0) and (0, 1) on black
    np.testing.assert_allclose(tinted[0, [0, 4]], expected, atol=1)
    assert not np.array_equal(tinted[0, 0], tinted[0, 4]), "neighbouring tokens get different tints"
    assert window.tokens_box.isVisibleTo(window)

    scene_pos = window.view.view.mapViewToScene(QtCore.QPointF(9.5, 5.0))  # x 9.5 -> col 2, y 5 -> row 1
    window.view.scene().sigMouseMoved.emit(scene_pos)
    assert window.view.hover.isVisible() and "token 6" in window.view.hover.textItem.toPlainText()

    window.tokens_box.setChecked(False)
    np.testing.assert_array_equal(window.view.composite(), histogram_rgb(hist, level=window.view.level))
    assert not window.view.hover.isVisible() and not window.view.grid.isVisible()


def test_classification_shows_top_k_and_a_confidence_timeline(window):
    for i in range(5):
        window.apply({"pred": pred([0.1, 0.7, 0.2], seq=i)})
        time.sleep(0.11)  # the timeline redraws at most every 0.1 s
    assert window.top_k.best.text().startswith("car")
    assert [n.text() for n in window.top_k.names] == ["car", "truck", "background", "", ""]
    assert window.top_k.bars[0].value() == 700
    assert [p.text() for p in window.top_k.percents[:3]] == ["70.0 %", "20.0 %", "10.0 %"]
    assert window.top_k.isVisibleTo(window) and not window.legend.isVisibleTo(window)
    curve = window.timeline.curves[1]
    xs, ys = curve.getData()
    assert len(xs) >= 2 and np.allclose(ys, 0.7) and xs.max() <= 0
    assert window.view_state()["prediction"]["top_k"][0]["name"] == "car"


def test_segmentation_shows_the_mask_over_the_histogram_and_a_legend_of_present_classes(window):
    mask = np.zeros((16, 16), np.uint8)
    mask[:8] = 2
    window.apply(
        {
            "hist": message("hist", 0, {"hist": np.zeros((2, 16, 16), np.float16)}),
            "pred": message("pred", 0, {"mask": mask}, task="segmentation", classes=CLASSES),
        }
    )
    rgb = window.view.composite()
    assert not np.array_equal(rgb[0, 0], rgb[15, 0]), "classes get different colours"
    assert window.legend.labels == ["background", "truck"]
    assert window.legend.isVisibleTo(window) and not window.timeline.isVisibleTo(window)
    window.mask_box.setChecked(False)
    assert window.view.composite().max() == 0


def stats(**fields):
    base = {
        "events_per_s": 2.5e6,
        "window_events": 30000,
        "window_ms": 12.0,
        "predictions_per_s": 40.0,
        "latency_ms": {"last": 9.0, "p50": 8.0, "p95": 15.0},
        "skipped_windows": 7,
        "malformed": 3,
        "task": "classification",
        "control": "tcp://127.0.0.1:9",
        "recording": None,
        "source": {"kind": "sim", "serial": "sim-seed0", "height": 128, "width": 128, "recordable": False},
    }
    return message("stats", 0, **{**base, **fields})


def test_status_bar_shows_rates_window_latency_skipped_and_dropped(window):
    window.apply({"stats": stats()})
    window.update_status()
    text = " | ".join(label.text() for label in window.status_labels.values())
    for part in ("2.50 Mev/s", "30,000 ev / 12.0 ms", "latency 8.0 ms (p95 15.0)", "skipped 7", "dropped 3", "0 fps"):
        assert part in text


REPLAY = {"playing": True, "speed": 1.0, "position_s": 0.5, "duration_s": 2.0}
FILE_SOURCE = {"kind": "file", "serial": "a.dat", "recordable": False, "replay": REPLAY}


def test_replay_controls_follow_the_server(window):
    window.apply({"stats": stats(source=FILE_SOURCE)})
    assert window.replay.isVisibleTo(window) and not window.record.isVisibleTo(window)
    assert window.replay.seek.value() == 250 and window.replay.play.text() == "Pause"
    assert window.replay.position.text() == "0.50 / 2.00 s"


def test_the_seek_slider_stays_where_it_was_dropped_until_the_server_confirms(window):
    window.apply({"stats": stats(source=FILE_SOURCE)})
    window.replay.seek.setValue(750)
    window.replay.seek.sliderReleased.emit()
    window.apply({"stats": stats(source=FILE_SOURCE)})  # sent before the server saw the seek: position 0.5 s
    assert window.replay.seek.value() == 750, "the slider snapped back"
    window.apply_reply({"command": "seek", "ok": True, "error": None, "state": {"source": {"replay": REPLAY}}})
    assert window.replay.seek.value() == 250  # the server's answer is the truth


def test_a_click_on_the_seek_slider_s_groove_seeks_to_the_place_clicked(window, qtbot):
    """Qt's slider stepped a page towards the click and sent nothing: the replay did not move."""
    window.apply({"stats": stats(source=FILE_SOURCE)})  # at 0.5 of 2.0 s
    seek, sent = window.replay.seek, []
    window.replay.command.connect(lambda name, args: sent.append((name, args)))
    groove = seek.rect().adjusted(8, 0, -8, 0)  # (the handle's half at each end)
    qtbot.mouseClick(
        seek,
        QtCore.Qt.MouseButton.LeftButton,
        pos=QtCore.QPoint(groove.left() + groove.width() * 4 // 5, seek.height() // 2),
    )
    assert [name for name, _ in sent] == ["seek"]
    assert sent[0][1]["position_s"] == pytest.approx(1.6, abs=0.1)  # 4/5 of the 2 s
    assert seek.value() == pytest.approx(800, abs=50)  # the slider stays where it was clicked
    assert window.replay.position.text() == f"{sent[0][1]['position_s']:.2f} / 2.00 s"


def sensor_message(image, sensor, seq: int = 0, binning: int = 1, **fields):
    return message("sensor", seq, {"sensor": image}, sensor=list(sensor), binning=binning, **fields)


def test_the_sensor_view_keeps_the_sensor_s_shape_and_the_model_input_is_a_toggle(window):
    image = np.zeros((2, 100, 120), np.float16)  # N-Cars: 120 wide, 100 high
    image[1, :50, :60] = 1.0
    tokens = np.arange(16, dtype=np.int32).reshape(4, 4)
    window.apply(
        {
            "sensor": sensor_message(image, (100, 120)),
            "hist": message("hist", 0, {"hist": hist_with_on_and_off(32)}),
            "tokens": message("tokens", 0, {"tokens": tokens}, num_tokens=64),
        }
    )
    state = window.view_state()
    assert state["histogram"]["view"] == "sensor" and state["histogram"]["shape"] == [100, 120]
    *_, w, h = state["histogram"]["rect"]
    assert abs(w / h - 1.2) < 0.02, "drawn in the sensor's aspect ratio"
    window.update_status()
    assert window.status_labels["view"].text() == "sensor 120 x 100"
    rgb = window.view.composite()  # the token grid covers the whole sensor: cell (3, 3) is the bottom-right
    corner = TOKEN_ALPHA / 255 * token_colors(64)[15].astype(np.float32)
    np.testing.assert_allclose(rgb[99, 119], corner, atol=1)
    assert window.view.token_at(119.0, 99.0) == (3, 3, 15)

    window.input_box.setChecked(True)
    assert window.view.shape == (32, 32) and window.view_state()["histogram"]["view"] == "input"
    window.update_status()
    assert window.status_labels["view"].text() == "model input 32 x 32 (sensor 120 x 100)"
    assert window.frames_shown == 1


def test_a_cropped_model_input_is_outlined_and_only_its_region_gets_overlays(window):
    tokens = np.zeros((2, 2), np.int32)
    window.apply(
        {
            "sensor": sensor_message(np.zeros((2, 60, 80), np.float16), (60, 80), input_region=[10, 20, 40, 40]),
            "tokens": message("tokens", 0, {"tokens": tokens}, num_tokens=8),
        }
    )
    rgb = window.view.composite()
    assert rgb[5, 5].max() == 0 and rgb[30, 40].max() > 0  # outside the region untinted, inside tinted
    assert window.view.crop.isVisible() and window.view.crop.rect() == QtCore.QRectF(20, 10, 40, 40)


def test_loading_model_is_shown_until_the_first_prediction(window):
    window.apply({"stats": stats(model_state="loading")})
    assert window.top_k.best.text() == "loading model..." and window.header.text().startswith("loading model...")
    window.apply({"pred": pred([0.1, 0.7, 0.2]), "stats": stats(model_state="ready")})
    assert window.top_k.best.text().startswith("car")


def test_accumulation_controls_follow_the_server_s_window(window):
    accumulation = {"events": 30000, "ms": 100.0, "default_events": 30000, "default_ms": 100.0}
    window.apply({"stats": stats(accumulation=accumulation, events_per_s=35_200.0)})
    controls = window.accumulation
    assert controls.isVisibleTo(window) and controls.mode.currentText() == "time"
    assert controls.value.text() == "100 ms (\u2264 30,000 events)" and controls.window()["ms"] == 100.0
    window.apply({"stats": stats(accumulation={**accumulation, "events": 5000, "ms": None}, events_per_s=35_200.0)})
    assert controls.mode.currentText() == "events" and controls.window() == {"events": 5000, "ms": None}
    window.update_status()
    assert window.status_labels["events"].text() == "35.2 kev/s"


def test_stats_sent_before_the_server_carried_out_a_command_do_not_undo_it_on_screen(window):
    """Stats and replies come on different sockets: stats published just before a command was carried out can
    arrive after its reply. The server counts the commands it carried out; older stats do not move the controls."""
    events = {"events": 3000, "ms": None, "default_events": 3000, "default_ms": None}
    timed = {**events, "ms": 22.0}
    window.apply({"stats": stats(accumulation=events, commands=0)})
    window.apply_reply(
        {"command": "window", "ok": True, "error": None, "state": {"commands": 1, "accumulation": timed}}
    )
    window.apply({"stats": stats(accumulation=events, commands=0)})  # published before the command
    assert window.accumulation.mode.currentText() == "time" and window.accumulation.window()["ms"] == 22.0
    window.apply({"stats": stats(accumulation=events, commands=2)})  # another viewer's command: followed
    assert window.accumulation.mode.currentText() == "events"


def test_record_controls_appear_for_live_sources_and_follow_the_recording(window, qtbot):
    recording = {"active": False, "root": "recordings", "name": None, "events": 0, "error": None}
    window.apply({"stats": stats(source={"kind": "camera", "recordable": True}, recording=recording)})
    assert window.record.isVisibleTo(window) and not window.replay.isVisibleTo(window)
    with qtbot.waitSignal(window.control_command) as sent:
        window.record.button.click()
    assert sent.args == ["record_start", {}]
    window.apply_reply(
        {
            "command": "record_start",
            "ok": True,
            "error": None,
            "state": {"recording": {**recording, "active": True, "name": "live-1", "events": 1234}},
        }
    )
    assert window.record.button.text() == "Stop" and "1,234 events" in window.record.status.text()
    window.apply_reply({"command": "pause", "ok": False, "error": "pause: not a file", "state": None})
    assert "not a file" in window.statusBar().currentMessage()


def test_a_new_server_session_clears_the_previous_history(window):
    window.apply({"pred": pred([0.1, 0.7, 0.2], session="A")})
    assert window.timeline.history
    window.apply({"pred": pred([0.6, 0.2, 0.2], session="B")})
    assert len(window.timeline.history) == 1 and window.session == "B"


def test_snapshot_saves_the_window_as_png_and_what_it_shows_as_json(window, tmp_path):
    window.apply({"hist": message("hist", 0, {"hist": hist_with_on_and_off()}), "pred": pred([0.2, 0.3, 0.5])})
    state = window.save_snapshot(tmp_path / "shot.png")
    image = QtGui.QImage(str(tmp_path / "shot.png"))
    assert image.width() == window.width() and image.height() == window.height()
    assert json.loads((tmp_path / "shot.json").read_text()) == json.loads(json.dumps(state))
    assert state["prediction"]["top_k"][0]["name"] == "truck"
    x, y, w, h = state["histogram"]["rect"]
    # the ON quarter (top left of the histogram) is red in the PNG
    pixel = image.pixelColor(round(x + w / 4), round(y + h / 4))
    assert pixel.red() > pixel.blue() + 100


def test_save_snapshot_writes_into_a_folder_of_its_own(qtbot, tmp_path, monkeypatch):
    """The button wrote into whatever folder mem view was started in."""
    monkeypatch.chdir(tmp_path)
    w = ViewerWindow(snapshot_dir=tmp_path / "shots")
    qtbot.addWidget(w)
    w._snapshot_clicked()
    [png] = (tmp_path / "shots").glob("mem-view-*.png")
    assert png.with_suffix(".json").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["shots"]


# ---- the ZMQ client --------------------------------------------------------------------------------------------


def bound_socket(kind: int):
    """A ZMQ socket of ``kind`` bound to a free port on 127.0.0.1, with its endpoint; closed at the end."""
    socket = zmq.Context.instance().socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    yield socket, f"tcp://127.0.0.1:{port}"
    socket.close(0)


@pytest.fixture
def publisher():
    yield from bound_socket(zmq.PUB)


@pytest.fixture
def client(qtbot, publisher):
    c = LiveClient(publisher[1])
    yield c
    c.close()


def wait_until_connected(qtbot, socket, client) -> None:
    """Publish probes until the client sees one (the SUB connects asynchronously: the slow joiner)."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while client.tracker.received == 0:
        assert time.monotonic() < deadline, "the client never connected"
        socket.send_multipart(encode("stats", 0, session="probe"))
        qtbot.wait(50)


def test_client_drains_to_the_newest_message_and_counts_gaps_and_malformed(qtbot, publisher, client):
    socket, _ = publisher
    wait_until_connected(qtbot, socket, client)
    received = []
    client.messages.connect(received.append)
    for seq in range(40):
        if seq not in (10, 11, 25):  # three messages lost on the way
            socket.send_multipart(encode("hist", seq, {"hist": np.zeros((2, 4, 4), np.float16)}, session="S"))
    socket.send_multipart([b"hist", b"{broken"])
    qtbot.waitUntil(lambda: bool(received) and received[-1]["hist"].seq == 39, timeout=WAIT_MS)
    assert len(received) < 37, "messages are drained in batches, only the newest is drawn"
    assert client.tracker.missed == 3 and client.malformed == 1 and client.dropped == 4


def bind_when_free(socket, endpoint: str) -> None:
    """Bind, retrying while the previous socket on the port is still being closed by ZMQ's I/O thread."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        try:
            socket.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_client_started_first_waits_and_picks_up_a_restarted_server(qtbot):
    context = zmq.Context.instance()
    probe = context.socket(zmq.PUB)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(0)
    endpoint = f"tcp://127.0.0.1:{port}"
    client = LiveClient(endpoint)  # no server yet
    sessions = []
    client.messages.connect(lambda ms: sessions.extend(m.header["session"] for m in ms.values()))
    try:
        for session in ("first", "second"):  # a server, then a restarted one on the same port
            server = context.socket(zmq.PUB)
            server.setsockopt(zmq.LINGER, 0)
            bind_when_free(server, endpoint)
            deadline, seq = time.monotonic() + WAIT_MS / 1000, 0
            while session not in sessions:
                assert time.monotonic() < deadline, f"the client never received the {session} server"
                server.send_multipart(encode("stats", seq, session=session))
                seq += 1
                qtbot.wait(50)
            server.close(0)
        assert client.tracker.restarts == 1
    finally:
        client.close()


@pytest.fixture
def control_socket():
    """A REP socket standing in for the server's control socket: what arrives there is what a server gets."""
    yield from bound_socket(zmq.REP)


def test_the_window_s_controls_reach_the_control_socket_with_their_arguments(qtbot, publisher, client, control_socket):
    """What the server receives, not what a signal emits: PySide drops the ``dict`` of a ``Signal(str, dict)`` on
    the way to a ``**kwargs`` slot, and the server would answer "speed: value must be a finite number, got None"."""
    socket, _ = publisher
    rep, endpoint = control_socket
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    accumulation = {"events": 30000, "ms": None, "default_events": 30000, "default_ms": 100.0}
    advert = {
        "session": "S",
        "control": endpoint,
        "source": FILE_SOURCE,
        "accumulation": accumulation,
        "model_state": "ready",  # "Model's window" acts with a model only
    }
    deadline = time.monotonic() + WAIT_MS / 1000
    while not window.accumulation.isVisibleTo(window):
        assert time.monotonic() < deadline, "the viewer never got the stats"
        socket.send_multipart(encode("stats", 0, **advert))
        qtbot.wait(50)
    qtbot.waitUntil(lambda: client.send_control("state"), timeout=WAIT_MS)  # connected
    assert rep.poll(WAIT_MS)
    rep.recv_multipart()
    rep.send_multipart(encode_control(0, "state", ok=True, error=None, state={}))

    def server_receives(action) -> tuple[str, dict]:
        action()
        assert rep.poll(WAIT_MS), "nothing reached the control socket"
        request = decode_control(decode(rep.recv_multipart()))  # a ProtocolError for a command without arguments
        rep.send_multipart(encode_control(0, request[0], ok=True, error=None, state={}))
        return request

    replay = window.replay
    assert server_receives(lambda: replay.speed.activated.emit(replay.SPEEDS.index(2.0))) == ("speed", {"value": 2.0})
    replay.seek.setValue(500)
    assert server_receives(replay.seek.sliderReleased.emit) == ("seek", {"position_s": 1.0})
    assert server_receives(replay.play.click) == ("pause", {})
    controls = window.accumulation
    controls.mode.setCurrentText("time")
    assert server_receives(lambda: controls.mode.activated.emit(0)) == ("window", {"events": 30000, "ms": 100.0})
    assert server_receives(lambda: controls.slider.setValue(controls.STEPS)) == (
        "window",
        {"events": 30000, "ms": 10000.0},
    )
    controls.mode.setCurrentText("events")
    assert server_receives(lambda: controls.mode.activated.emit(1)) == ("window", {"events": 30000, "ms": None})
    assert server_receives(controls.reset.click) == ("window", {"events": 30000, "ms": 100.0})


def test_client_sends_control_requests_to_the_advertised_endpoint(qtbot, publisher, client):
    socket, _ = publisher
    rep = zmq.Context.instance().socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    try:
        deadline = time.monotonic() + WAIT_MS / 1000
        while client.tracker.received == 0:  # stats advertise the control endpoint
            assert time.monotonic() < deadline
            socket.send_multipart(encode("stats", 0, session="S", control=f"tcp://0.0.0.0:{port}"))
            qtbot.wait(50)
        qtbot.waitUntil(lambda: client.send_control("seek", position_s=1.5), timeout=WAIT_MS)
        assert rep.poll(WAIT_MS)
        assert decode_control(decode(rep.recv_multipart())) == ("seek", {"position_s": 1.5})
        with qtbot.waitSignal(client.control_reply, timeout=WAIT_MS) as reply:
            rep.send_multipart(encode_control(0, "seek", ok=True, error=None, state={}))
        assert reply.args[0]["ok"] is True
    finally:
        rep.close(0)


def test_control_endpoint_uses_the_host_the_viewer_connected_to():
    assert control_endpoint("tcp://10.0.0.5:5557", "tcp://0.0.0.0:5558") == "tcp://10.0.0.5:5558"
    assert control_endpoint("ipc:///tmp/a", "ipc:///tmp/a-control") == "ipc:///tmp/a-control"


# ---- hostile messages: dropped, counted, shown; the next good frame is drawn ------------------------------------

BAD_MESSAGES = {
    # each of these must be dropped, not raise on every later frame (tokens, mask, stats) or take gigabytes (num_tokens)
    "empty token grid": lambda: message("tokens", 0, {"tokens": np.zeros((0, 4), np.int32)}, num_tokens=64),
    "mask id 2^62": lambda: message(
        "pred", 0, {"mask": np.full((16, 16), 2**62, np.uint64)}, task="segmentation", classes=CLASSES
    ),
    "stats of wrong types": lambda: stats(events_per_s="fast", latency_ms=[1], source=[1]),
    "stats with a garbage control endpoint": lambda: stats(control="garbage"),
    "empty histogram": lambda: message("hist", 0, {"hist": np.zeros((2, 0, 16), np.float16)}),
    "10^8 tokens": lambda: message("tokens", 0, {"tokens": np.zeros((4, 4), np.int32)}, num_tokens=10**8),
}


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
def test_a_bad_message_is_dropped_counted_shown_and_the_next_frame_drawn(window, case):
    bad = BAD_MESSAGES[case]()
    window.apply({"hist": message("hist", 0, {"hist": hist_with_on_and_off()}), "stats": stats()})
    window.apply({bad.topic: bad})
    assert window.bad_messages == 1
    assert window.statusBar().currentMessage().startswith(f"dropped {bad.topic} message: ")
    nxt = hist_with_on_and_off() * np.float16(0.5)
    window.apply({"hist": message("hist", 1, {"hist": nxt}), "stats": stats()})
    np.testing.assert_array_equal(window.view.hist, nxt)
    assert window.frames_shown == 2
    np.testing.assert_array_equal(window.view.composite(), histogram_rgb(nxt, level=window.view.level))
    window.update_status()
    assert window.status_labels["dropped"].text() == "dropped 4"  # 1 here + the 3 the server reports in stats


def test_a_bad_message_from_another_session_does_not_reset_the_history(window):
    window.apply({"pred": pred([0.1, 0.7, 0.2], session="A")})
    window.apply({"pred": message("pred", 1, {"probs": np.ones(2, np.float32)}, session="B", task="classification")})
    assert window.session == "A" and len(window.timeline.history) == 1 and window.bad_messages == 1


def test_an_extreme_but_finite_replay_position_puts_the_slider_at_the_end(window):
    window.apply({"stats": stats(source={"replay": {"position_s": 1e308, "duration_s": 1e-300}})})
    assert window.bad_messages == 0 and window.replay.seek.value() == 1000


def test_a_huge_declared_codebook_costs_the_viewer_no_memory(window):
    tracemalloc.start()
    try:
        window.apply({"tokens": BAD_MESSAGES["10^8 tokens"]()})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert window.bad_messages == 1 and peak < 10 * 2**20


def test_a_frame_that_cannot_be_drawn_is_dropped_and_the_next_one_drawn(window, monkeypatch):
    """The last line of defence behind the message checks: a drawing failure forgets that frame's layers."""
    window.apply({"hist": message("hist", 0, {"hist": hist_with_on_and_off()})})
    monkeypatch.setattr(window.view, "composite_rgbx", lambda: np.zeros((1, 1, 4), np.int64)[5])
    window.apply({"tokens": message("tokens", 0, {"tokens": np.zeros((4, 4), np.int32)}, num_tokens=64)})
    assert window.bad_messages == 1 and "could not be drawn" in window.statusBar().currentMessage()
    monkeypatch.undo()
    window.apply({"hist": message("hist", 1, {"hist": hist_with_on_and_off()})})
    assert window.frames_shown == 2 and window.view.tokens is None


def test_client_keeps_delivering_after_a_stats_message_with_a_garbage_control_endpoint(qtbot, publisher, client):
    """A bad advertised endpoint must not raise inside every drain, which would stop all drawing."""
    socket, _ = publisher
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    wait_until_connected(qtbot, socket, client)
    socket.send_multipart(encode("stats", 1, session="S", control="garbage"))
    for seq in range(3):
        socket.send_multipart(encode("hist", seq, {"hist": hist_with_on_and_off()}, session="S"))
        qtbot.wait(20)
    qtbot.waitUntil(lambda: window.frames_shown > 0, timeout=WAIT_MS)
    assert window.bad_messages == 1 and client.control_endpoint is None


def test_client_drops_and_counts_a_malformed_control_reply(qtbot, publisher, client):
    socket, _ = publisher
    rep = zmq.Context.instance().socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    replies = []
    client.control_reply.connect(replies.append)
    try:
        deadline = time.monotonic() + WAIT_MS / 1000
        while client.tracker.received == 0:
            assert time.monotonic() < deadline
            socket.send_multipart(encode("stats", 0, session="S", control=f"tcp://127.0.0.1:{port}"))
            qtbot.wait(50)
        for reply in (
            encode_control(0, "state", ok=True, error=None, state={"source": {"replay": {"speed": "fast"}}}),
            encode_control(1, "state", ok=True, error=None, state={"classes": ["a"]}),
        ):
            qtbot.waitUntil(lambda: client.send_control("state"), timeout=WAIT_MS)
            assert rep.poll(WAIT_MS)
            rep.recv_multipart()
            rep.send_multipart(reply)
        qtbot.waitUntil(lambda: len(replies) == 1, timeout=WAIT_MS)
    finally:
        rep.close(0)
    assert client.malformed == 1 and replies == [
        {"command": "state", "ok": True, "error": None, "state": {"classes": ["a"]}}
    ]


def labels_state(counts: dict, captures: int, **fields) -> dict:
    return {"root": "labels", "classes": ["disc", "ring"], "counts": counts, "captures": captures, **fields}


def test_the_label_panel_captures_the_window_on_screen_with_number_keys_and_flashes_once_per_capture(window, qtbot):
    sent = []
    window.control_command.connect(lambda name, args: sent.append((name, args)))
    window.apply({"stats": stats(labels=labels_state({}, 0), training={"state": "idle", "epoch": 0, "epochs": 9})})
    image = np.zeros((2, 8, 8), np.float32)
    window.apply({"sensor": sensor_message(image, [8, 8], frame=41)})
    panel = window.labels
    assert panel.isVisibleTo(window) and [b.text() for b in panel.buttons] == ["1  disc  (0)", "2  ring  (0)"]

    qtbot.keyClick(window, "2")
    qtbot.keyClick(window, "z", QtCore.Qt.KeyboardModifier.ControlModifier)
    assert sent == [("capture", {"label": "ring", "frame": 41}), ("undo_capture", {})]

    # the capture's news comes by reply or by stats, in either order: one flash per capture
    window.apply({"stats": stats(labels=labels_state({"ring": 1}, 1, last="ring"), commands=1)})
    window.apply_reply(
        {
            "command": "capture",
            "ok": True,
            "state": {"commands": 1, "labels": labels_state({"ring": 1}, 1, last="ring")},
        }
    )
    assert window.flashes == 1 and panel.buttons[1].text() == "2  ring  (1)"
    assert "captured 'ring'" in panel.status.text()

    training = {"state": "running", "epoch": 3, "epochs": 9, "message": "epoch 3 of 9"}
    window.apply({"stats": stats(labels=labels_state({"ring": 1}, 1), training=training, commands=1)})
    assert not panel.train.isEnabled() and panel.progress.value() == 3


def test_a_newer_model_taking_over_is_named_in_the_header_and_marked_on_the_timeline(window):
    window.apply({"stats": stats(model={"name": "label-001", "version": 1, "path": "x"})})
    window.apply({"pred": pred([0.1, 0.7, 0.2], seq=0, model_version=1)})
    assert "model label-001 v1" in window.header.text() and window.model_switches == 0
    window.apply({"pred": pred([0.6, 0.2, 0.2], seq=1, model_version=2)})
    assert window.model_switches == 1 and len(window.timeline.marks) == 1
    assert window.view_state()["model"]["version"] == 2


# ---- errors where the user acted, controls that cannot act, a stream that stopped --------------------------------

NO_PRETRAIN = (
    "train: no pretraining run to finetune: start mem serve with --pretrain RUN (or a --model finetuned from one)"
)


def test_a_refused_train_shows_its_reason_once_in_the_label_panel_until_the_next_action(window, qtbot):
    window.apply({"stats": stats(labels=labels_state({"disc": 3}, 3), training={"state": "idle", "epochs": 9})})
    window.labels.train.click()
    window.apply_reply({"command": "train", "ok": False, "error": NO_PRETRAIN, "state": None})
    panel = window.labels
    assert panel.error.isVisibleTo(window) and panel.error.text() == NO_PRETRAIN  # "train: " once, not twice
    assert window.statusBar().currentMessage() == ""  # not a 5 s flash where the user did not act
    for _ in range(3):  # stats keep coming: the reason stays
        window.apply({"stats": stats(labels=labels_state({"disc": 3}, 3), training={"state": "idle", "epochs": 9})})
    assert window.view_state()["labels"]["error"] == NO_PRETRAIN
    with qtbot.waitSignal(window.control_command):
        panel.buttons[0].click()  # the next action
    assert not panel.error.isVisibleTo(window)
    window.apply_reply({"command": "capture", "ok": False, "error": "disk full", "state": None})
    assert panel.error.text() == "capture: disk full"  # an error that does not name its command gets the name


def test_a_failed_training_run_is_shown_in_red_in_the_label_panel(window):
    training = {"state": "failed", "epoch": 2, "epochs": 9, "message": "error: no captures of 'ring'"}
    window.apply({"stats": stats(labels=labels_state({"disc": 3}, 3), training=training)})
    assert window.labels.result.text() == "training failed: error: no captures of 'ring'"
    assert "color" in window.labels.result.styleSheet() and window.labels.result.isVisibleTo(window)


@pytest.mark.parametrize("model_state", ["none", "loading"])
def test_controls_that_need_a_model_are_disabled_and_say_why(window, model_state):
    accumulation = {"events": 30000, "ms": None, "default_events": 30000, "default_ms": None}
    window.apply({"stats": stats(model_state=model_state, accumulation=accumulation)})
    for control in (window.input_box, window.accumulation.reset):
        assert not control.isEnabled()
        assert ("No model" if model_state == "none" else "loading") in control.toolTip()
    window.apply({"stats": stats(model_state="ready", accumulation=accumulation)})
    assert window.input_box.isEnabled() and window.accumulation.reset.isEnabled()
    assert "trained on" in window.accumulation.reset.toolTip()


def contrast(a: QtGui.QColor, b: QtGui.QColor) -> float:
    """WCAG contrast ratio of two colours."""

    def luminance(color: QtGui.QColor) -> float:
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in color.getRgbF()[:3]]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_class_name_placeholder_is_readable_on_the_dark_palette(window):
    window.setPalette(dark_palette())
    window.apply({"stats": stats(labels={"root": "labels", "classes": [], "counts": {}, "captures": 0})})
    field = window.labels.names
    assert field.text() == "" and field.placeholderText()
    image = field.grab().toImage()
    background = image.pixelColor(2, image.height() // 2)
    text = max(
        (image.pixelColor(x, y) for x in range(image.width() // 2) for y in range(image.height())),
        key=lambda c: contrast(c, background),
    )
    assert contrast(text, background) >= 4.5  # WCAG AA for text (Qt's default: black at half opacity, ~1.1)


def test_the_capture_flash_is_held_for_its_time_whatever_the_frame_rate(window, qtbot):
    window.apply({"stats": stats(labels=labels_state({}, 0))})
    window.apply({"sensor": sensor_message(np.zeros((2, 8, 8), np.float32), [8, 8], frame=1)})
    qtbot.wait(50)

    def corner() -> QtGui.QColor:
        return window.picture.grab().toImage().pixelColor(1, 1)

    unlit = corner()
    window.apply({"stats": stats(labels=labels_state({"disc": 1}, 1, last="disc"))})
    assert window.flashes == 1 and corner() == QtGui.QColor(FLASH_COLOR)  # at once, not with the next frame
    time.sleep(FLASH_MS / 2000)  # a busy GUI thread, then one frame (3 fps)
    window.apply({"sensor": sensor_message(np.ones((2, 8, 8), np.float32), [8, 8], frame=2)})
    qtbot.wait(10)
    assert corner() == QtGui.QColor(FLASH_COLOR), "a frame ended the flash early"
    qtbot.waitUntil(lambda: corner() == unlit, timeout=2 * FLASH_MS + 500)


def test_the_timeline_s_axes_show_their_end_labels_whole_with_every_panel_open(window, qtbot):
    window.resize(1240, 700)
    recording = {"active": False, "root": "recordings", "name": None, "events": 0, "error": None}
    accumulation = {"events": 30000, "ms": None, "default_events": 30000, "default_ms": None}
    for i in range(3):
        window.apply(
            {
                "pred": pred([0.1, 0.7, 0.2], seq=i),
                "stats": stats(
                    source={"kind": "sim", "recordable": True},
                    recording=recording,
                    accumulation=accumulation,
                    labels=labels_state({"disc": 3}, 3),
                    training={"state": "idle", "epochs": 9},
                ),
            }
        )
    window.apply_reply({"command": "train", "ok": False, "error": NO_PRETRAIN, "state": None})
    qtbot.wait(50)
    timeline = window.timeline
    assert timeline.height() >= timeline.minimumHeight()
    image = QtGui.QImage(1, 1, QtGui.QImage.Format.Format_ARGB32)
    painter = QtGui.QPainter(image)
    try:
        for name, ends in (("bottom", ("-20", "0")), ("left", ("0", "1"))):
            axis = timeline.getAxis(name)
            texts = axis.generateDrawSpecs(painter)[2]  # (rect, flags, text) of each label drawn
            assert set(ends) <= {text for _, _, text in texts}, name
            for rect, _, text in texts:
                shown = timeline.mapFromScene(axis.mapRectToScene(rect)).boundingRect()
                assert timeline.rect().contains(shown), f"{name} label {text!r} clipped"
    finally:
        painter.end()


def test_a_stream_that_stopped_dims_the_picture_and_blanks_its_rates(qtbot, publisher, client, monkeypatch):
    from app.viewer import window as viewer_window

    monkeypatch.setattr(viewer_window, "STALE_S", 0.5)
    socket, _ = publisher
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    window.show()
    image = np.zeros((2, 8, 8), np.float32)
    image[1] = 1.0  # all ON: red

    def send(seq: int) -> None:
        socket.send_multipart(encode("sensor", seq, {"sensor": image}, session="S", sensor=[8, 8], binning=1))
        socket.send_multipart(encode("stats", seq, session="S", events_per_s=2.5e6, window_events=3000))

    def red() -> int:
        x, y, w, h = window.view_state()["histogram"]["rect"]
        return window.grab().toImage().pixelColor(round(x + w / 2), round(y + h / 2)).red()

    seq = 0
    while window.frames_shown == 0 or window.status_labels["events"].text() != "2.50 Mev/s":
        assert seq < WAIT_MS / 50, "the viewer never drew the stream"
        send(seq)
        seq += 1
        qtbot.wait(50)
        window.update_status()
    live = red()
    # the server went quiet (its last stats came after its last picture: "no new events" may be said first)
    qtbot.waitUntil(lambda: "no data from the server" in (window.view_state()["notice"] or ""), timeout=WAIT_MS)
    window.update_status()
    assert window.view_state()["stale"] and "no data from the server" in window.view_state()["notice"]
    assert window.status_labels["events"].text() == "\u2013 ev/s" and window.status_labels["window"].text() == (
        "window \u2013"
    )
    assert red() < live / 2, "the last picture is drawn dimmed"
    send(seq + 1)  # it comes back
    qtbot.waitUntil(lambda: not window.view_state()["stale"], timeout=WAIT_MS)
    assert window.view_state()["notice"] is None and window.status_labels["events"].text() == "2.50 Mev/s"


def test_a_viewer_that_hears_no_server_says_which_to_start(qtbot, monkeypatch):
    from app.viewer import window as viewer_window

    monkeypatch.setattr(viewer_window, "NO_SERVER_S", 0.2)
    probe = zmq.Context.instance().socket(zmq.PUB)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(0)  # nothing listens there now
    endpoint = f"tcp://127.0.0.1:{port}"
    client = LiveClient(endpoint)
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    try:
        qtbot.waitUntil(lambda: window.view_state()["notice"] is not None, timeout=WAIT_MS)
        start = f"start one with `mem serve --pub {endpoint}`"
        assert window.view_state()["notice"].startswith(f"no server at {endpoint}: {start}")
        assert start in window.header.text() and window.status_labels["link"].text() == f"no server at {endpoint}"
    finally:
        client.close()
    assert "start `mem serve --pub tcp://0.0.0.0:5557` on 10.0.0.5" in viewer_window.no_server_text(
        "tcp://10.0.0.5:5557"
    )
    assert "`mem serve` (" in viewer_window.no_server_text("tcp://127.0.0.1:5557")  # the default needs no --pub


def test_pictures_that_stop_while_the_server_runs_are_marked_unless_the_replay_is_paused(
    qtbot, publisher, client, monkeypatch
):
    from app.viewer import window as viewer_window

    monkeypatch.setattr(viewer_window, "STALE_S", 0.5)
    socket, _ = publisher
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    image = np.ones((2, 8, 8), np.float32)
    playing = {**FILE_SOURCE, "replay": {**REPLAY, "playing": True}}
    paused = {**FILE_SOURCE, "replay": {**REPLAY, "playing": False}}
    seq = 0
    while window.frames_shown == 0:
        assert seq < WAIT_MS / 50, "the viewer never drew the stream"
        socket.send_multipart(encode("sensor", seq, {"sensor": image}, session="S", sensor=[8, 8], binning=1))
        socket.send_multipart(encode("stats", seq, session="S", source=playing))
        seq += 1
        qtbot.wait(50)
    deadline = time.monotonic() + WAIT_MS / 1000
    while not window.view.stale:  # stats go on, pictures do not: a camera whose scene went still
        assert time.monotonic() < deadline, "the picture was never marked"
        socket.send_multipart(encode("stats", seq, session="S", source=playing, events_per_s=0.0))
        seq += 1
        qtbot.wait(100)
    assert window.view_state()["notice"].startswith("no new events for ")
    assert window.status_labels["events"].text() == "0 ev/s"  # the server's rate is live: shown, not blanked
    for _ in range(3):  # paused: a still picture is what the user asked for
        socket.send_multipart(encode("stats", seq, session="S", source=paused))
        seq += 1
        qtbot.wait(300)
    assert not window.view.stale and window.view_state()["notice"] is None


def test_messages_waiting_while_the_gui_thread_was_busy_are_not_a_stopped_stream(qtbot, publisher, client, monkeypatch):
    from app.viewer import window as viewer_window

    monkeypatch.setattr(viewer_window, "STALE_S", 0.5)
    socket, _ = publisher
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    wait_until_connected(qtbot, socket, client)
    socket.send_multipart(encode("stats", 1, session="S", events_per_s=2.5e6))
    time.sleep(0.8)  # a long frame: nothing drained meanwhile
    window.update_status()
    assert not window.view.stale and window.status_labels["events"].text() == "2.50 Mev/s"


def test_a_window_whose_client_was_closed_keeps_its_status_without_errors(qtbot, monkeypatch):
    from app.viewer import window as viewer_window

    monkeypatch.setattr(viewer_window, "STALE_S", 0.0)
    client = LiveClient("tcp://127.0.0.1:9")
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    window.apply({"stats": stats()})
    client.close()  # as `mem view` and the tests do before the window goes
    window.update_status()
    qtbot.wait(300)  # its timer fires: no error in the event loop
    assert window.view.stale
