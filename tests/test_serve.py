"""The live inference server: newest-window inference without backlog, published messages, control, recording."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from app.config import ServeConfig
from app.live.model_slot import serving_switches
from app.live.ring import EventRing
from app.live.sensor_view import sensor_view
from app.live.server import LiveServer, control_endpoint_for
from mem_core.configuration import ConfigError
from mem_core.corpus import Corpus, CorpusWriter, snapshot_corpus
from mem_core.events import SensorSize, make_events
from mem_core.inference import Predictor
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.protocol import decode, decode_sensor, encode, encode_control, encode_events
from mem_core.representation import InputSpec
from mem_core.runs.export import export_random
from mem_core.runs.rundir import RunError
from mem_core.simulator import task_config
from recorders.capture import LabelledCaptures
from recorders.replay import ReplaySource
from recorders.simulated import SimulatorSource
from recorders.sources import open_source
from recorders.synthetic import SyntheticSource

SENSOR = SensorSize(32, 48)
WAIT_S = 30.0  # generous: the machine is shared


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A tiny random classifier (32 x 32 input, 4 x 4 patches of 8) with a 64-token tokenizer."""
    return export_random(
        tmp_path_factory.mktemp("export"),
        architecture=ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0),
        input_spec=InputSpec(n_max=2000, size=(32, 32)),
        tokenizer=TokenizerConfig(img_size=32, num_layers=3, num_tokens=64, hidden_dim=16),
    )


@pytest.fixture(scope="module")
def seg_export(tmp_path_factory):
    return export_random(
        tmp_path_factory.mktemp("seg"),
        task="segmentation",
        classes=("background", "disc", "square"),
        architecture=ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, drop_path=0.0),
        input_spec=InputSpec(n_max=2000, size=(32, 32)),
        head_channels=8,
    )


@contextlib.contextmanager
def serving(model, source, predictor=None, **config):
    server = LiveServer(
        ServeConfig(model=model, pub="tcp://127.0.0.1:*", stats_interval_s=0.2, **config),
        source=source,
        predictor=predictor,
    )
    try:
        yield server.start()
    finally:
        server.stop()


@contextlib.contextmanager
def subscriber(endpoint: str):
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    try:
        yield socket
    finally:
        socket.close(0)


def collect(socket, until, timeout: float = WAIT_S) -> list:
    """Decoded messages until ``until(messages)`` holds (fails after ``timeout``)."""
    messages, deadline = [], time.monotonic() + timeout
    while not until(messages):
        assert time.monotonic() < deadline, f"timed out; got topics {[m.topic for m in messages]}"
        if socket.poll(100):
            messages.append(decode(socket.recv_multipart()))
    return messages


def drain(socket, seconds: float) -> list:
    """Every message that arrives within ``seconds``."""
    messages, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if socket.poll(max(1, round(left * 1000))):
            messages.append(decode(socket.recv_multipart()))
    return messages


def of(messages, topic):
    return [m for m in messages if m.topic == topic]


def request(endpoint: str, command: str, **args) -> dict:
    socket = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    try:
        socket.send_multipart(encode_control(0, command, **args))
        assert socket.poll(WAIT_S * 1000), f"no reply to {command}"
        return decode(socket.recv_multipart()).header
    finally:
        socket.close(0)


# ---- the ring of newest events -------------------------------------------------------------------------------


def test_ring_keeps_exactly_the_newest_events(events_factory):
    rng = np.random.default_rng(1)
    ring, pushed = EventRing(100), []
    for i in range(40):
        batch = events_factory(int(rng.integers(0, 260)), seed=i, t0=10_000 * i)
        pushed.append(batch)
        ring.push(batch, arrival=float(i))
        stream = np.concatenate(pushed)
        for n in (1, 37, 100, 500):
            snap = ring.snapshot(n)
            np.testing.assert_array_equal(snap.events, stream[len(stream) - min(n, len(stream), 100) :])
        assert snap.total == len(stream)
    assert snap.arrival == 39.0


def test_ring_resize_keeps_the_newest_events_and_then_holds_the_new_capacity(events_factory):
    stream = events_factory(300, seed=2)
    ring = EventRing(100)
    ring.push(stream[:250], arrival=1.0)
    ring.resize(40)
    np.testing.assert_array_equal(ring.snapshot().events, stream[210:250])
    ring.resize(120)
    ring.push(stream[250:], arrival=2.0)
    np.testing.assert_array_equal(ring.snapshot().events, stream[210:])  # 40 kept + 50 new
    assert ring.snapshot().total == 300


def test_ring_clear_forgets_events_but_total_keeps_counting(events_factory):
    ring = EventRing(10)
    ring.push(events_factory(15), arrival=1.0)
    ring.clear()
    assert len(ring.snapshot().events) == 0 and ring.total == 15


def test_control_endpoint_defaults_to_the_next_port():
    assert control_endpoint_for("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5558"
    assert control_endpoint_for("tcp://127.0.0.1:*") == "tcp://127.0.0.1:*"
    assert control_endpoint_for("tcp://127.0.0.1:0") == "tcp://127.0.0.1:0"  # any port, not port 1 (two servers)
    assert control_endpoint_for("ipc:///tmp/mem") == "ipc:///tmp/mem-control"
    with pytest.raises(ConfigError, match="port"):  # a MemError: `mem serve --pub` says so in one line
        control_endpoint_for("tcp://127.0.0.1")


# ---- predictions ---------------------------------------------------------------------------------------------


def test_predictor_gives_a_class_mask_for_segmentation(seg_export, events_factory):
    predictor = Predictor(seg_export)
    out = predictor(events_factory(3000, SENSOR), SENSOR)
    assert out.mask.shape == (32, 32) and out.mask.dtype == np.uint8 and out.mask.max() < 3
    assert out.hist.shape == (2, 32, 32) and out.hist.dtype == np.float16 and 0 < float(out.hist.max()) <= 1.0
    assert out.probs is None and out.tokens is None


def stats_after_predictions(messages) -> bool:
    """Five predictions and a stats message sent after the first of them (stats go out every
    ``stats_interval_s``: the first may predate the model)."""
    preds = [i for i, m in enumerate(messages) if m.topic == "pred"]
    return len(preds) >= 5 and any(m.topic == "stats" for m in messages[preds[0] :])


def test_server_publishes_hist_tokens_pred_and_stats(export):
    source = SyntheticSource(200_000, SENSOR, batch_us=5000)
    with serving(export, source) as server, subscriber(server.pub_endpoint) as sub:
        messages = collect(sub, stats_after_predictions)
    hist, tokens, pred, stats = (of(messages, t) for t in ("hist", "tokens", "pred", "stats"))
    h = hist[-1].arrays["hist"]
    assert h.shape == (2, 32, 32) and h.dtype == np.float16 and float(h.min()) >= 0 and 0 < float(h.max()) <= 1.0
    assert tokens[-1].arrays["tokens"].shape == (4, 4) and int(tokens[-1].arrays["tokens"].max()) < 64
    p = pred[-1]
    assert p.header["task"] == "classification" and p.header["classes"] == ["background", "car"]
    assert [e["name"] for e in p.header["top_k"]] == [p.header["classes"][e["id"]] for e in p.header["top_k"]]
    assert p.header["top_k"][0]["prob"] >= p.header["top_k"][-1]["prob"]
    assert np.isclose(p.arrays["probs"].sum(), 1.0, atol=1e-5)
    assert p.header["window"]["events"] == 2000 and p.header["latency_ms"] > 0
    assert p.header["sensor"] == [32, 48]
    # one frame id ties the hist, tokens and pred of a window together; seq increases per topic
    assert p.header["frame"] in {m.header["frame"] for m in hist}
    for topic in (hist, tokens, pred, stats):
        seqs = [m.seq for m in topic]
        assert seqs == sorted(set(seqs))
    s = stats[-1].header
    assert s["events_per_s"] > 0 and s["window_events"] == 2000 and s["control"] == server.control_endpoint
    assert {"preprocess", "model", "tokenizer", "publish"} <= set(s["stages_ms"])
    assert s["source"]["kind"] == "synthetic" and s["session"] == p.header["session"]


def test_a_gpu_serves_bf16_weights_and_a_cuda_graph_unless_eager_and_a_cpu_the_model_as_it_is(export):
    """``mem serve`` on a GPU: bf16 weights and a CUDA graph (a ViT-B/16 window 5 times faster, docs/BENCHMARKS.md),
    ``--eager`` without them; on a CPU the served predictor is the fp32 model run window by window."""
    assert serving_switches(ServeConfig(device="cuda:1")) == {"bf16_weights": True, "cuda_graph": True}
    for config in (ServeConfig(device="cuda", eager=True), ServeConfig(device="cpu")):
        assert serving_switches(config) == {"bf16_weights": False, "cuda_graph": False}
    with serving(export, SyntheticSource(200_000, SENSOR, batch_us=5000)) as server:
        assert server.model_loaded.wait(WAIT_S)
        predictor = server.predictor
    assert not predictor.bf16_weights and not predictor.cuda_graph and not predictor.graphed
    assert {p.dtype for p in predictor.model.parameters()} == {torch.float32}


def test_window_ms_caps_the_time_span_of_each_window(export):
    # 200 k events/s: the model's 2000-event window spans 10 ms; a 4 ms cap keeps only the newest ~800 events
    source = SyntheticSource(200_000, SENSOR, batch_us=2000)
    with serving(export, source, window_ms=4.0) as server, subscriber(server.pub_endpoint) as sub:
        messages = collect(sub, lambda ms: len(of(ms, "pred")) >= 5)
    for p in of(messages, "pred"):
        window = p.header["window"]
        assert window["t_last_us"] - window["t_first_us"] < 4000
        assert 0 < window["events"] < 2000
    for bad in (-1.0, float("nan"), 1e9):  # a MemError: `mem serve --window-ms` says so in one line
        with pytest.raises(ConfigError, match="window_ms"):
            LiveServer(ServeConfig(model=export, window_ms=bad), source=SyntheticSource(1000, SENSOR))


def window_spans(messages) -> list[tuple[int, float]]:
    """(events, span in ms) of the windows of the ``pred`` messages."""
    windows = [p.header["window"] for p in of(messages, "pred")]
    return [(w["events"], (w["t_last_us"] - w["t_first_us"]) / 1e3) for w in windows]


def test_the_export_s_training_window_is_the_default(export, tmp_path):
    timed = export_random(
        tmp_path / "timed",
        architecture=ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0),
        input_spec=InputSpec(n_max=2000, size=(32, 32)),
        window_ms=4.0,  # as if trained on 4 ms samples
    )
    source = SyntheticSource(200_000, SENSOR, batch_us=2000)  # 2000 events span 10 ms
    with serving(timed, source) as server, subscriber(server.pub_endpoint) as sub:
        messages = collect(sub, lambda ms: len(of(ms, "pred")) >= 3 and of(ms, "stats")[-1:] and server.predictor)
        stats = server.stats()
    assert all(0 < n < 2000 and span < 4.0 for n, span in window_spans(messages))
    assert stats["accumulation"] == {"events": 2000, "ms": 4.0, "default_events": 2000, "default_ms": 4.0}
    source = SyntheticSource(200_000, SENSOR, batch_us=2000)
    with serving(timed, source, window_ms=0.0) as server, subscriber(server.pub_endpoint) as sub:  # 0: no cap
        messages = collect(sub, lambda ms: len(of(ms, "pred")) >= 3)
    sizes = [n for n, _ in window_spans(messages)]
    assert sizes[-1] == 2000 and max(sizes) == 2000  # the newest 2000 events, whatever their span (once filled)

    assert json.loads((export / "model.json").read_text())["training_window"] == {"events": 2000, "ms": None}
    assert Predictor(export).training_window == (2000, None)


def test_window_command_changes_the_windows_of_the_published_frames(export):
    source = SyntheticSource(200_000, SENSOR, batch_us=2000)
    with serving(export, source) as server, subscriber(server.pub_endpoint) as sub:
        collect(sub, lambda ms: of(ms, "pred"))
        reply = request(server.control_endpoint, "window", events=500, ms=None)
        assert reply["ok"] and reply["state"]["accumulation"]["events"] == 500
        messages = collect(sub, lambda ms: len([n for n, _ in window_spans(ms) if n == 500]) >= 3)
        assert window_spans(messages)[-1][0] == 500
        reply = request(server.control_endpoint, "window", events=100_000, ms=3.0)  # by time: at most 3 ms
        assert reply["ok"] and reply["state"]["accumulation"]["ms"] == 3.0
        messages = collect(sub, lambda ms: len([s for _, s in window_spans(ms) if s < 3.0]) >= 3)
        events, span = window_spans(messages)[-1]
        assert span < 3.0 and 200 < events < 2000  # ~600 events in 3 ms; far fewer than the 100 000 allowed
        refused = request(server.control_endpoint, "window", events=0)
        assert not refused["ok"] and "window: events" in refused["error"]
        assert server.stats()["commands"] == 2  # carried out (the refused one is not counted)
        assert server.stats()["accumulation"] == {
            "events": 100_000,
            "ms": 3.0,
            "default_events": 2000,
            "default_ms": None,
        }


class GatedPredictor(Predictor):
    """The real predictor whose warm-up waits for ``release``: a model that takes its time to load."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def warm_up(self) -> None:
        assert self.release.wait(WAIT_S)
        super().warm_up()


def test_sensor_views_stream_while_the_model_loads_and_predictions_follow(export):
    predictor = GatedPredictor(export)
    source = SyntheticSource(100_000, SENSOR, batch_us=5000)
    with serving(export, source, predictor=predictor) as server, subscriber(server.pub_endpoint) as sub:
        loading = collect(sub, lambda ms: len(of(ms, "sensor")) >= 3 and of(ms, "stats"))
        state = request(server.control_endpoint, "state")["state"]
        predictor.release.set()
        ready = collect(
            sub, lambda ms: of(ms, "pred") and "ready" in [m.header["model_state"] for m in of(ms, "stats")]
        )
    assert not of(loading, "hist") and not of(loading, "pred")
    assert {m.header["model_state"] for m in of(loading, "stats")} == {"loading"}
    assert state["model_state"] == "loading" and "task" not in state and "classes" not in state
    view = decode_sensor(of(loading, "sensor")[-1])
    assert view.image.shape == (2, 32, 48) and view.binning == 1 and view.input_region == (0, 0, 32, 48)
    assert of(ready, "pred")[-1].header["frame"] in {m.header["frame"] for m in of(ready, "sensor")}


def test_a_model_that_crops_each_window_s_extent_shows_where_it_looks(tmp_path):
    # An N-Cars-like model (InputSpec.crop="extent"): the input is the square around each window's events, and
    # the sensor view the viewer gets marks that square, also where it reaches past the sensor's short side.
    extent_export = export_random(
        tmp_path / "extent",
        architecture=ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0),
        input_spec=InputSpec(n_max=2000, size=(32, 32), crop="extent"),
    )
    predictor = Predictor(extent_export)
    ys, xs = np.mgrid[4:12, 30:46]  # an 8 x 16 object: a 16 px square around it
    events = make_events(np.arange(ys.size), xs.ravel(), ys.ravel(), np.arange(ys.size) % 2)
    out = predictor(events, SENSOR)
    assert out.region == (0.0, 30.0, 16.0, 16.0)
    assert out.hist[..., 0].max() > 0 and out.hist[..., -1].max() > 0  # the object spans the input's width
    source = SyntheticSource(100_000, SENSOR, batch_us=5000)  # events everywhere: the sensor's longer side
    with serving(extent_export, source) as server, subscriber(server.pub_endpoint) as sub:
        messages = collect(sub, lambda ms: of(ms, "pred") and of(ms, "sensor"))
    frame = of(messages, "pred")[-1].header["frame"]
    view = decode_sensor(next(m for m in of(messages, "sensor") if m.header["frame"] == frame))
    assert view.input_region == (-8.0, 0.0, 48.0, 48.0)


def test_a_model_that_cannot_be_loaded_ends_the_server_with_its_error(tmp_path):
    with pytest.raises(ConfigError, match="missing: no such file or directory"):  # at once, before loading anything
        LiveServer(ServeConfig(model=tmp_path / "missing"), source=SyntheticSource(1000, SENSOR))
    (tmp_path / "empty").mkdir()
    server = LiveServer(
        ServeConfig(model=tmp_path / "empty", pub="tcp://127.0.0.1:*"), source=SyntheticSource(1000, SENSOR)
    )
    with pytest.raises(RunError, match="empty: not a MEM run directory"):  # a MemError: `mem serve` prints one line
        server.run(duration_s=WAIT_S)


def test_a_model_whose_first_window_is_slow_is_served_once_it_ran_and_a_stop_meanwhile_is_prompt(export, monkeypatch):
    """A busy machine is slow, not wrong: a fixed time box refused a fully trained model under load. The server
    waits for the first window; stopped meanwhile, it ends at once."""
    from mem_core.inference import Predictor

    started, release = threading.Event(), threading.Event()

    def slow_first_window(self) -> None:  # a first window that takes as long as the test says
        started.set()
        release.wait(60)

    monkeypatch.setattr(Predictor, "warm_up", slow_first_window)
    server = LiveServer(ServeConfig(model=export, pub="tcp://127.0.0.1:*"), source=SyntheticSource(1000, SENSOR))
    server.start()
    try:
        assert started.wait(WAIT_S) and server.running and server.model.version == 0
        release.set()
        assert server.model.loaded.wait(WAIT_S) and server.model.version == 1
    finally:
        server.stop()
    started.clear()
    release.clear()
    server = LiveServer(ServeConfig(model=export, pub="tcp://127.0.0.1:*"), source=SyntheticSource(1000, SENSOR))
    server.start()
    assert started.wait(WAIT_S)
    begun = time.monotonic()
    server.stop()
    assert not server.running and time.monotonic() - begun < 5
    release.set()


def test_sensor_view_keeps_the_sensor_geometry_and_every_event_and_bins_large_sensors():
    sensor = SensorSize(100, 120)  # N-Cars: 120 wide, 100 high
    xs, ys, ps = [110] * 3 + [2] + [60] * 1000, [5] * 3 + [90] + [50] * 1000, [1] * 3 + [0] + [1] * 1000
    events = make_events(np.arange(len(xs)), xs, ys, ps)
    view, binning = sensor_view(events, sensor)
    assert view.shape == (2, 100, 120) and view.dtype == np.float16 and binning == 1
    assert view[1, 5, 110] == 1.0 and np.isclose(view[0, 90, 2], 1 / 3, atol=1e-3)  # scaled to the brightest...
    assert view[1, 50, 60] == 1.0  # ...that is not hot: a hot pixel is shown (clipped), it does not darken the rest
    assert np.count_nonzero(view) == 3

    gen4 = SensorSize(720, 1280)
    view, binning = sensor_view(make_events([0, 1], [0, 1279], [0, 719], [1, 1]), gen4)
    assert binning == 2 and view.shape == (2, 360, 640) and view[1, 359, 639] == view[1, 0, 0] == 1.0


class ReplayClock:
    """The replay's clock (``time`` in recorders.base and recorders.replay): it advances by exactly what the replay
    sleeps, so the pace a replay keeps is measured whatever the machine's load (the work between batches and late
    wake-ups take none of its time)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
        self.now += seconds


class ClockedReplay(ReplaySource):
    """A replay noting its clock's time as it hands on each batch, by the stream time of the batch's last event."""

    def __init__(self, *args, clock: ReplayClock, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.clock, self.handed = clock, {}

    def __iter__(self):
        for batch in super().__iter__():
            if batch.size:
                self.handed[int(batch["t"][-1])] = self.clock.now
            yield batch


def replay_rate(sub, source: ClockedReplay, since: float, span: float = 0.5) -> float:
    """Seconds of stream per second of the replay's clock, over the ``pred`` frames of batches it handed on after
    ``since`` (its clock's time) spanning ``span`` seconds of that clock."""

    def paced(messages):
        times = [m.header["window"]["t_last_us"] for m in of(messages, "pred")]
        return [(source.handed[t], t) for t in times if source.handed.get(t, since) > since]

    frames = paced(collect(sub, lambda ms: len(p := paced(ms)) > 1 and p[-1][0] - p[0][0] >= span))
    (c0, t0), (c1, t1) = frames[0], frames[-1]
    return (t1 - t0) / 1e6 / (c1 - c0)


def preds_after(sub, since: float, seconds: float) -> list:
    """The ``pred`` messages whose newest event arrived after wall time ``since``, over ``seconds`` of arrivals."""

    def fresh(ms):
        return [m for m in of(ms, "pred") if m.header["t_arrival"] > since]

    return fresh(collect(sub, lambda ms: len(fresh(ms)) > 1 and fresh(ms)[-1].header["t_arrival"] - since > seconds))


def test_replay_speed_pause_and_seek_show_in_the_published_frames(export, data_dir, monkeypatch):
    clock = ReplayClock()
    monkeypatch.setattr("recorders.base.time", clock)
    monkeypatch.setattr("recorders.replay.time", clock)
    path = data_dir / "fixtures" / "nmnist_sample.bin"  # 310 ms
    source = ClockedReplay(path, loop=True, batch_us=2000, clock=clock)
    with serving(export, source) as server, subscriber(server.pub_endpoint) as sub:
        assert server.model_loaded.wait(WAIT_S)
        control = server.control_endpoint
        for speed in (4.0, 0.25):
            reply = request(control, "speed", value=speed)
            assert reply["ok"] and reply["state"]["source"]["replay"]["speed"] == speed
            rate = replay_rate(sub, source, clock.now)
            assert rate == pytest.approx(speed, rel=0.02), f"at {speed}x the stream advanced {rate:.2f} s per second"

        reply = request(control, "pause")
        assert reply["ok"] and reply["state"]["source"]["replay"]["playing"] is False
        paused_at = time.time()
        time.sleep(1.0)
        late = of(drain(sub, 0.5), "pred")
        assert all(m.header["t_arrival"] <= paused_at for m in late), "events arrived while paused"

        reply = request(control, "seek", position_s=0.2)
        position = reply["state"]["source"]["replay"]["position_s"]  # 0.2, or the window shown ends just before
        assert reply["ok"] and 0.198 < position <= 0.2
        played_at = time.time()
        assert request(control, "play")["ok"]
        # the seek's own frame (shown while paused, it may arrive after played_at: its window, too, may end just
        # before 0.2 s, as the reply's) or a later one; 0.25x: 0.2 s of file take 0.8 s
        first = preds_after(sub, played_at, 0.0)[0].header["window"]
        assert 0.198 < first["position_s"] < 0.3, (
            f"the first frame after seeking to 0.2 s (shown at {position}) shows {first['position_s']}"
        )
        replay = request(control, "state")["state"]["source"]["replay"]
        assert replay["playing"] and 0 <= replay["position_s"] <= replay["duration_s"] + 1e-6
        refused = request(control, "record_start")
        assert not refused["ok"] and "live source" in refused["error"]


@pytest.fixture
def halves(tmp_path, events_factory):
    """A corpus ``lab`` of two 0.6 s recordings on SENSOR, written by the product's writer: ``left`` with events in
    the left half only, ``right`` in the right half only; and their events."""
    half = SensorSize(SENSOR.height, SENSOR.width // 2)
    left, right = events_factory(6000, half, seed=1, t0=5_000), events_factory(6000, half, seed=2)
    right["x"] += half.width
    root = tmp_path / "lab"
    with CorpusWriter(root) as writer:
        writer.add_recording("left", left, SENSOR)
        writer.add_recording("right", right, SENSOR)
    return root, left, right


def sides(view: np.ndarray) -> tuple[bool, bool]:
    """Whether a (2, H, W) sensor view shows events in its left half, in its right half."""
    half = view.shape[2] // 2
    return bool(view[:, :, :half].any()), bool(view[:, :, half:].any())


def new_frame(sub, after: int) -> tuple:
    """The ``sensor`` and ``pred`` messages of the first window published with a frame id above ``after``."""
    messages = collect(sub, lambda ms: any(m.header["frame"] > after for m in of(ms, "pred")) and of(ms, "sensor"))
    pred = next(m for m in of(messages, "pred") if m.header["frame"] > after)
    sensor = next(m for m in of(messages, "sensor") if m.header["frame"] == pred.header["frame"])
    return decode_sensor(sensor), pred.header


def test_a_corpus_replays_through_the_server_naming_the_recording_it_plays(export, halves):
    root, left, right = halves
    with (
        serving(export, open_source(str(root), loop=True)) as server,
        subscriber(server.pub_endpoint) as sub,
    ):
        assert server.model_loaded.wait(WAIT_S)

        def seen(messages) -> set:
            """The recordings stats named, and which halves the windows showed."""
            serials = {m.header["source"]["serial"] for m in of(messages, "stats")}
            return serials | {sides(decode_sensor(m).image) for m in of(messages, "sensor")}

        # windows of the left recording, then of the right one, and stats naming each
        messages = collect(sub, lambda ms: {"lab/left", "lab/right", (True, False), (False, True)} <= seen(ms))
    source = of(messages, "stats")[-1].header["source"]
    assert source["kind"] == "corpus" and [source["height"], source["width"]] == [32, 48]
    duration = (int(left["t"][-1]) - int(left["t"][0]) + 1 + int(right["t"][-1]) - int(right["t"][0])) / 1e6
    assert source["replay"]["duration_s"] == pytest.approx(duration)


def test_a_seek_while_paused_publishes_the_window_ending_at_the_new_position_and_a_step_the_next(export, halves):
    root, left, right = halves
    right_starts = (int(left["t"][-1]) - int(left["t"][0]) + 1) / 1e6  # where ``right`` begins on the timeline
    with (
        serving(export, open_source(str(root), loop=True)) as server,
        subscriber(server.pub_endpoint) as sub,
    ):
        assert server.model_loaded.wait(WAIT_S)
        control = server.control_endpoint
        assert request(control, "pause")["ok"]
        frame, deadline = -1, time.monotonic() + WAIT_S
        while server.windows != frame:  # settles once the batches in flight at the pause are inferred
            assert time.monotonic() < deadline, "windows went on while paused"
            frame = server.windows
            time.sleep(0.5)

        for position in (right_starts + 0.3, 0.2):  # into the right recording, then back into the left one
            reply = request(control, "seek", position_s=position)
            assert reply["ok"] and reply["state"]["source"]["replay"]["playing"] is False
            view, pred = new_frame(sub, frame)
            frame = pred["frame"]
            events, t0 = (right, int(right["t"][0])) if position > right_starts else (left, int(left["t"][0]))
            start = 0 if events is left else round(right_starts * 1e6)
            end = int(np.searchsorted(events["t"], t0 + round(position * 1e6) - start))
            window = events[end - 2000 : end]  # the model's 2000 events, ending at the position
            np.testing.assert_array_equal(view.image, sensor_view(window, SENSOR)[0])
            assert pred["window"]["events"] == 2000 and abs(pred["window"]["position_s"] - position) < 0.002
            assert of(drain(sub, 0.5), "pred") == []  # one frame, then paused as before
            serial = request(control, "state")["state"]["source"]["serial"]
            assert serial == ("lab/right" if events is right else "lab/left")

        reply = request(control, "step")
        assert reply["ok"] and reply["state"]["source"]["replay"]["playing"] is False
        view, pred = new_frame(sub, frame)
        np.testing.assert_array_equal(view.image, sensor_view(left[end : end + 2000], SENSOR)[0])
        assert pred["window"]["position_s"] > 0.2


def test_the_simulated_camera_pauses_to_hold_its_picture_and_steps_but_has_no_timeline_to_seek(export):
    with (
        serving(export, SimulatorSource(task_config(seed=2), speed=1.0)) as server,
        subscriber(server.pub_endpoint) as sub,
    ):
        assert server.model_loaded.wait(WAIT_S)
        control = server.control_endpoint
        reply = request(control, "pause")
        replay = reply["state"]["source"]["replay"]
        assert reply["ok"] and replay["playing"] is False and "duration_s" not in replay
        frame, deadline = -1, time.monotonic() + WAIT_S
        while server.windows != frame:  # settles once the batches in flight at the pause are inferred
            assert time.monotonic() < deadline, "windows went on while paused"
            frame = server.windows
            time.sleep(0.5)
        held = request(control, "state")["state"]["source"]["replay"]["position_s"]
        late = [m for m in of(drain(sub, 0.5), "pred") if m.header["frame"] > frame]
        assert late == []  # the picture holds: nothing new to look at or capture

        reply = request(control, "seek", position_s=0.0)
        assert not reply["ok"] and "sim" in reply["error"] and "seek" in reply["error"]
        reply = request(control, "step")
        assert reply["ok"] and reply["state"]["source"]["replay"]["playing"] is False
        _, pred = new_frame(sub, frame)
        assert pred["window"]["position_s"] > held
        assert of(drain(sub, 0.5), "pred") == []  # one window, then held again

        assert request(control, "play")["ok"]
        collect(sub, lambda ms: len(of(ms, "pred")) >= 3)


class SlowPredictor(Predictor):
    """The real predictor plus a fixed delay, standing in for a model slower than the event stream."""

    delay_s = 0.05

    def __call__(self, events, sensor):
        time.sleep(self.delay_s)
        return super().__call__(events, sensor)


def test_a_slow_model_skips_windows_instead_of_building_a_backlog(export):
    source = SyntheticSource(2_000_000, SENSOR, batch_us=2000)  # 1000 windows/s, the model does < 20/s
    with serving(export, source, predictor=SlowPredictor(export), window_events=2000) as server:
        deadline = time.monotonic() + WAIT_S
        while len(server.latencies) < 30:
            assert time.monotonic() < deadline, "too few predictions"
            time.sleep(0.1)
        latencies = [lat for _, lat in list(server.latencies)]
        skipped = server.skipped_windows
    # the newest window is always the one inferred: latency stays near one model run, it does not grow
    assert np.median(latencies[-10:]) < np.median(latencies[:10]) + 0.2
    assert max(latencies[-10:]) < 1.0
    assert skipped > 100


def test_slow_joiner_gets_self_contained_messages(export):
    source = SyntheticSource(200_000, SENSOR, batch_us=5000)
    with serving(export, source) as server:
        deadline = time.monotonic() + WAIT_S
        while server.frames < 10:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with subscriber(server.pub_endpoint) as late:  # joins long after the server started
            messages = collect(late, lambda ms: of(ms, "pred") and of(ms, "stats"))
    first_pred = of(messages, "pred")[0]
    assert first_pred.header["classes"] == ["background", "car"] and first_pred.header["top_k"]
    assert of(messages, "stats")[0].header["control"] == server.control_endpoint


# ---- sources -------------------------------------------------------------------------------------------------


def test_tcp_source_uses_published_events_and_drops_malformed_ones(export, events_factory):
    publisher = zmq.Context.instance().socket(zmq.PUB)
    publisher.setsockopt(zmq.LINGER, 0)
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    try:
        source = open_source(f"tcp://127.0.0.1:{port}")
        with serving(export, source) as server:
            deadline = time.monotonic() + WAIT_S
            seq = 0
            while server.frames == 0 or source.malformed < 2:
                assert time.monotonic() < deadline, "the tcp source produced no prediction"
                publisher.send_multipart(
                    encode_events(seq, events_factory(500, SENSOR, seed=seq, t0=seq * 10**5), SENSOR)
                )
                publisher.send_multipart([b"events", b"{broken json"])
                off_sensor = events_factory(10, SENSOR)
                off_sensor["x"] = 999
                publisher.send_multipart(encode_events(seq, off_sensor, SENSOR))
                seq += 1
                time.sleep(0.05)
            assert server.stats()["malformed"] >= 2
        assert source.sensor == SENSOR
    finally:
        publisher.close(0)


# ---- control -------------------------------------------------------------------------------------------------


def raw_requests(endpoint: str, requests: list[list[bytes]]) -> list[dict]:
    """The reply headers to raw multipart ``requests`` sent over one REQ socket (each must be answered)."""
    socket = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    replies = []
    try:
        for frames in requests:
            socket.send_multipart(frames)
            assert socket.poll(WAIT_S * 1000), f"no reply to {frames[1][:40]!r}"
            replies.append(decode(socket.recv_multipart()).header)
    finally:
        socket.close(0)
    return replies


def test_malformed_control_requests_are_answered_and_counted(export):
    source = SyntheticSource(100_000, SENSOR, batch_us=5000)
    with serving(export, source) as server:
        bad = [[b"control", b"not json"], encode("control", 0, command="explode")]
        assert all(r["ok"] is False and r["error"] for r in raw_requests(server.control_endpoint, bad))
        assert request(server.control_endpoint, "pause")["error"].startswith("pause: the source")
        assert server.stats()["malformed"] == 2


def test_record_start_and_stop_write_a_corpus_of_the_live_source(export, tmp_path):
    from mem_core.simulator import SimulatorConfig
    from recorders.simulated import SimulatorSource

    source = SimulatorSource(SimulatorConfig(sensor=SENSOR, n_objects=1), batch_us=5000)
    with serving(export, source, record_dir=tmp_path / "corpus") as server:
        assert request(server.control_endpoint, "record_start", name="take1")["ok"]
        deadline = time.monotonic() + WAIT_S
        while server.recorder.state()["events"] < 1000:
            assert time.monotonic() < deadline, "nothing recorded"
            time.sleep(0.05)
        reply = request(server.control_endpoint, "record_stop")
    assert reply["ok"] and reply["state"]["recording"]["active"] is False
    recorded = reply["state"]["recording"]["events"]
    with Corpus(tmp_path / "corpus") as corpus:
        events = corpus.events(corpus.index("take1"))
    assert len(events) == recorded and events["x"].max() < SENSOR.width


HOSTILE_REQUESTS = [
    [b"control", b"[" * 100_000],  # a RecursionError in the control thread
    [b"control", b"[1, 2]"],
    [
        b"control",
        b'{"version": 1, "topic": "control", "seq": 0, "buffers": [{"name": "a", "dtype": "<f4", '
        b'"shape": [10000000000000000000000000000000000000000, 0]}]}',
        b"",
    ],  # shape [1e40, 0] ended the thread
    [b"control", b'{"version": NaN}'],
    [b"\xff" * 100, b"{}"],
]


def test_control_answers_every_hostile_request_and_then_the_next_good_one(export):
    source = SyntheticSource(100_000, SENSOR, batch_us=5000)
    with serving(export, source) as server:
        for reply in raw_requests(server.control_endpoint, HOSTILE_REQUESTS):
            assert reply["ok"] is False and reply["error"].startswith("control message: ")
        assert request(server.control_endpoint, "state")["ok"] is True
        assert server.stats()["malformed"] == len(HOSTILE_REQUESTS)


def test_a_control_frame_over_the_size_limit_never_reaches_the_server(export):
    source = SyntheticSource(100_000, SENSOR, batch_us=5000)
    with serving(export, source) as server:
        socket = zmq.Context.instance().socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(server.control_endpoint)
        try:
            socket.send(b"{" + b" " * (3 << 20) + b"}")  # 3 MiB: would be answered as malformed if it arrived
            assert not socket.poll(2000)  # ZMQ drops the peer; nothing is read, nothing answered
        finally:
            socket.close(0)
        assert request(server.control_endpoint, "state")["ok"] is True
        assert server.stats()["malformed"] == 0


def test_a_failing_command_is_answered_and_the_control_thread_goes_on(export, data_dir, monkeypatch):
    from recorders.replay import ReplaySource

    source = ReplaySource(sorted((data_dir / "ncars-dev" / "val" / "cars").glob("*.dat"))[0], loop=True)

    def broken() -> None:
        raise RuntimeError("the replay broke")

    monkeypatch.setattr(source, "pause", broken)
    with serving(export, source) as server:
        reply = request(server.control_endpoint, "pause")
        assert reply["ok"] is False and "RuntimeError: the replay broke" in reply["error"]
        assert request(server.control_endpoint, "speed", value=2.0)["ok"] is True


def test_tcp_source_drops_hostile_messages_and_keeps_serving(export, events_factory):
    publisher = zmq.Context.instance().socket(zmq.PUB)
    publisher.setsockopt(zmq.LINGER, 0)
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    good = events_factory(500, SENSOR)
    hostile = [
        [b"events", b"[" * 100_000],  # ended `mem serve --source tcp://...` with a RecursionError
        [
            b"events",
            json.dumps({**json.loads(encode_events(0, good, SENSOR)[1]), "height": 10**12}).encode(),
            *encode_events(0, good, SENSOR)[2:],
        ],  # a sensor of 10^12 rows
        [
            b"events",
            b'{"version": 1, "topic": "events", "seq": 0, "buffers": [{"name": "t", "dtype": "<i8", '
            b'"shape": [10000000000000000000000000000000000000000, 0]}]}',
            b"",
        ],
    ]
    try:
        source = open_source(f"tcp://127.0.0.1:{port}")
        with serving(export, source) as server:
            deadline, seq = time.monotonic() + WAIT_S, 0
            while source.malformed < len(hostile) or server.frames < 2:
                assert time.monotonic() < deadline, f"{server.frames} predictions, {source.malformed} dropped"
                for frames in hostile if source.malformed < len(hostile) else []:
                    publisher.send_multipart(frames)
                publisher.send_multipart(
                    encode_events(seq, events_factory(500, SENSOR, seed=seq, t0=seq * 10**5), SENSOR)
                )
                seq += 1
                time.sleep(0.05)
            assert server.stats()["malformed"] >= len(hostile)
            assert server.running
    finally:
        publisher.close(0)


# ---- labelling, training from captures, and models taking over -------------------------------------------------


def test_capture_stores_exactly_the_window_a_prediction_was_made_on_and_undo_takes_it_back(export, tmp_path):
    labels = tmp_path / "labels"
    with (
        serving(export, SimulatorSource(task_config(seed=4)), labels=labels) as server,
        subscriber(server.pub_endpoint) as sub,
    ):
        pred = of(collect(sub, lambda ms: of(ms, "pred")), "pred")[0].header
        reply = request(server.control_endpoint, "capture", label="disc", frame=pred["frame"])
        assert reply["ok"], reply
        assert reply["state"]["labels"]["counts"] == {"disc": 1} and reply["state"]["labels"]["captures"] == 1
        assert reply["state"]["labels"]["classes"] == ["background", "car", "disc"]  # the model's, then captured

        gone = request(server.control_endpoint, "capture", label="disc", frame=10**9)
        assert not gone["ok"] and f"window {10**9} is no longer held" in gone["error"]
        blank = request(server.control_endpoint, "capture", label="  ")
        assert not blank["ok"] and "capture: label must be a class name" in blank["error"]
        assert request(server.control_endpoint, "capture", label="square")["ok"]  # the newest window
        undone = request(server.control_endpoint, "undo_capture")
        assert undone["ok"] and undone["state"]["labels"]["counts"] == {"disc": 1}

    corpus = Corpus(labels)
    (capture,) = corpus.recordings
    window = pred["window"]
    events = corpus.events(0)
    assert capture.label == "disc" and capture.sensor == SensorSize(*pred["sensor"])
    assert (len(events), int(events["t"][0]), int(events["t"][-1])) == (
        window["events"],
        window["t_first_us"],
        window["t_last_us"],
    )
    assert capture.metadata["frame"] == pred["frame"] and capture.metadata["kind"] == "sim"
    assert capture.metadata["prediction"] == pred["top_k"][0]["name"] and capture.metadata["model_version"] == 1


def pretraining_run(root) -> Path:
    """A directory that says it is a pretraining run (what the server checks at its start; a Train run would need
    its weights)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"stage": "pretrain", "config": {}}))
    return root


def test_train_says_what_is_missing_before_it_starts(export, tmp_path):
    with serving(export, SimulatorSource(task_config()), labels=tmp_path / "labels") as server:
        reply = request(server.control_endpoint, "train")
        assert not reply["ok"] and "no pretraining run to finetune" in reply["error"]
    pretrain = pretraining_run(tmp_path / "pretrain")
    with (
        serving(export, SimulatorSource(task_config()), labels=tmp_path / "labels", pretrain=pretrain) as server,
        subscriber(server.pub_endpoint) as sub,
    ):
        collect(sub, lambda ms: of(ms, "sensor"))  # a window to capture
        assert request(server.control_endpoint, "capture", label="disc")["ok"]
        reply = request(server.control_endpoint, "train")
        assert not reply["ok"] and "at least 2 classes, have only disc" in reply["error"]
        assert request(server.control_endpoint, "capture", label="ring")["ok"]
        reply = request(server.control_endpoint, "train")
        assert not reply["ok"] and "disc has 1, ring has 1" in reply["error"]
        assert reply["state"]["training"]["state"] == "idle"
    assert not (tmp_path / "label-runs").exists()


@pytest.mark.parametrize(("cpus", "user", "threads"), [(2, None, "1"), (16, None, "15"), (1, None, "1"), (2, "2", "2")])
def test_a_training_run_leaves_a_core_to_the_live_stream_unless_the_user_chose(
    tmp_path, monkeypatch, cpus, user, threads
):
    """Torch's threads on every core stall each other while the server runs (Train took 5x longer under load): the
    child trains on one core fewer, or on the OMP_NUM_THREADS the user set."""
    from app.live.labelling import TRAIN_LOG, TrainingJob

    monkeypatch.setattr("app.live.labelling.usable_cores", lambda: cpus)  # the cores this process may run on
    if user is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user)
    job = TrainingJob(tmp_path / "labels", tmp_path / "pretrain", tmp_path / "run", 1, on_done=lambda export: None)
    probe = "import os; print('threads', os.environ.get('OMP_NUM_THREADS'))"  # what torch reads at its start
    monkeypatch.setattr(job, "command", lambda: [sys.executable, "-c", probe])
    job.start()
    deadline = time.monotonic() + 30
    while job.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.state()["state"] == "done"
    assert (tmp_path / "run" / TRAIN_LOG).read_text().split() == ["threads", threads]


def test_without_a_model_the_server_streams_sensor_views_to_label(tmp_path):
    with (
        serving(None, SimulatorSource(task_config()), labels=tmp_path / "labels") as server,
        subscriber(server.pub_endpoint) as sub,
    ):
        messages = collect(sub, lambda ms: len(of(ms, "sensor")) >= 3 and of(ms, "stats"))
        stats = of(messages, "stats")[-1].header
        assert stats["model_state"] == "none" and stats["model"] is None
        assert stats["accumulation"]["ms"] == 50.0  # a window to label with: crisp shapes
        assert not of(messages, "pred")
        assert request(server.control_endpoint, "capture", label="disc")["ok"]


def test_a_pretraining_run_that_is_not_one_is_refused_at_the_start(tmp_path):
    finetune = tmp_path / "finetune"
    finetune.mkdir()
    (finetune / "config.json").write_text(json.dumps({"stage": "finetune", "config": {}}))
    for path, why in [
        (tmp_path / "missing", "no such directory"),
        (tmp_path, "not a MEM run directory"),
        (finetune, "a 'finetune' run, not a pretraining run"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(f"pretrain {path}: {why}")):  # not at the first Train
            LiveServer(ServeConfig(pretrain=path, pub="tcp://127.0.0.1:*"), source=SyntheticSource(1000, SENSOR))


def labelling(tmp_path, **config):
    """A server without a model on the simulated camera, labelling into ``tmp_path / "labels"``."""
    return serving(None, SimulatorSource(task_config()), labels=tmp_path / "labels", **config)


def test_a_label_session_goes_on_after_an_undo_and_a_restart_with_one_class_per_spelling(tmp_path):
    with labelling(tmp_path) as server, subscriber(server.pub_endpoint) as sub:
        collect(sub, lambda ms: of(ms, "sensor"))  # a window to capture
        for label in ("disc", "ring"):
            assert request(server.control_endpoint, "capture", label=label)["ok"]
        assert request(server.control_endpoint, "undo_capture")["ok"]
        assert request(server.control_endpoint, "capture", label="cafe\u0301")["ok"]  # e + a combining accent
    with labelling(tmp_path) as server, subscriber(server.pub_endpoint) as sub:  # mem serve started again
        collect(sub, lambda ms: of(ms, "sensor"))
        for _ in range(3):
            reply = request(server.control_endpoint, "capture", label="caf\u00e9")  # é as one character
            assert reply["ok"], reply["error"]
        assert reply["state"]["labels"]["counts"] == {"caf\u00e9": 4, "disc": 1}
    corpus = Corpus(tmp_path / "labels")
    assert [r.label for r in corpus.recordings] == ["disc", *["caf\u00e9"] * 4]
    assert len({r.name for r in corpus.recordings}) == 5


def test_a_labels_folder_moved_away_under_the_server_says_so_and_capturing_goes_on_once_it_is_back(tmp_path):
    labels, away = tmp_path / "labels", tmp_path / "away"
    with labelling(tmp_path) as server, subscriber(server.pub_endpoint) as sub:
        collect(sub, lambda ms: of(ms, "sensor"))
        assert request(server.control_endpoint, "capture", label="disc")["ok"]
        labels.rename(away)
        for _ in range(2):  # every try says what happened and what to do
            reply = request(server.control_endpoint, "capture", label="disc")
            assert not reply["ok"] and reply["error"].startswith(
                f"capture: 'disc' not stored: the labels folder {labels} is gone (moved or deleted?); put it back"
            )
        stats = collect(sub, lambda ms: any(m.header["labels"]["error"] for m in of(ms, "stats")))
        assert "is gone" in next(m.header["labels"]["error"] for m in of(stats, "stats") if m.header["labels"]["error"])
        away.rename(labels)
        reply = request(server.control_endpoint, "capture", label="ring")
        assert reply["ok"] and reply["state"]["labels"]["counts"] == {"disc": 1, "ring": 1}
    corpus = Corpus(labels)
    assert [r.label for r in corpus.recordings] == ["disc", "ring"] and corpus.check(full=True) == {}


def fake_train_run(runs, n: int, labels, export, finished: bool = True) -> Path:
    """What a Train run leaves: the captures it learned from and its export (``model.json`` written last)."""
    run = runs / f"label-{n:03d}"
    snapshot_corpus(labels, run / "captures", provenance={"tool": "test"})
    shutil.copytree(export, run / "export")
    if not finished:
        (run / "export" / "model.json").unlink()
    return run / "export"


def test_a_server_started_again_serves_the_newest_train_run_on_its_labels(export, tmp_path):
    labels, other, runs = tmp_path / "labels", tmp_path / "other", tmp_path / "label-runs"
    for root in (labels, other):
        with LabelledCaptures(root) as captures:
            captures.capture(make_events([1, 2], [0, 1], [0, 1], [0, 1]), SENSOR, "disc")
    fake_train_run(runs, 1, labels, export)
    newest = fake_train_run(runs, 2, labels, export)
    fake_train_run(runs, 3, other, export)  # another labels folder's
    fake_train_run(runs, 4, labels, export, finished=False)  # cut short while exporting
    with labelling(tmp_path, train_out=runs) as server, subscriber(server.pub_endpoint) as sub:
        messages = collect(sub, lambda ms: of(ms, "pred") and of(ms, "stats")[-1].header["model_state"] == "ready")
        assert of(messages, "pred")[0].header["model_version"] == 1
        stats = of(messages, "stats")[-1].header
        assert stats["model"]["path"] == str(newest) and stats["training"]["state"] == "idle"
        assert stats["training"]["message"] == f"serving {newest}, trained before this server started"


def test_train_needs_the_captures_of_every_class_offered_and_learns_from_those_of_its_moment(
    export, tmp_path, monkeypatch
):
    from app.live.labelling import TrainingJob

    # the run itself (mem train-labels) is tests/test_label_loop.py's; here the child exports a model at once
    copy = "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])"
    monkeypatch.setattr(TrainingJob, "command", lambda job: [sys.executable, "-c", copy, str(export), str(job.export)])
    runs = tmp_path / "label-runs"
    config = {"train_out": runs, "pretrain": pretraining_run(tmp_path / "pretrain"), "classes": ("disc", "ring", "sq")}
    with labelling(tmp_path, **config) as server, subscriber(server.pub_endpoint) as sub:
        collect(sub, lambda ms: of(ms, "sensor"))
        for label in ("disc", "disc", "ring", "ring"):
            assert request(server.control_endpoint, "capture", label=label)["ok"]
        refused = request(server.control_endpoint, "train")  # --classes
        assert not refused["ok"] and refused["error"].endswith("of every class (one is held out): sq has 0")
        refused = request(server.control_endpoint, "train", classes=["disc", "ring", "cross"])  # the viewer's
        assert not refused["ok"] and refused["error"].endswith("of every class (one is held out): cross has 0")
        assert request(server.control_endpoint, "train", classes=["disc", "ring"])["ok"]
        assert request(server.control_endpoint, "capture", label="ring")["ok"]  # after Train was pressed
        assert request(server.control_endpoint, "undo_capture")["ok"]
        assert request(server.control_endpoint, "capture", label="disc")["ok"]
        done = collect(sub, lambda ms: any(m.header["training"]["state"] == "done" for m in of(ms, "stats")))
        stats = next(m.header for m in of(done, "stats") if m.header["training"]["state"] == "done")
        assert "(4 captures: 2 disc, 2 ring); now serving" in stats["training"]["message"]
        assert stats["model"]["path"] == str(runs / "label-001" / "export")
    assert [r.label for r in Corpus(runs / "label-001" / "captures").recordings] == ["disc", "disc", "ring", "ring"]
    assert [r.label for r in Corpus(tmp_path / "labels").recordings] == ["disc", "disc", "ring", "ring", "disc"]


def test_watch_serves_a_newer_export_without_dropping_the_stream_and_keeps_it_when_one_is_broken(export, tmp_path):
    served = tmp_path / "served"
    shutil.copytree(export, served)
    tiny = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0)
    with (
        serving(served, SyntheticSource(2e5, sensor=SENSOR), watch=True) as server,
        subscriber(server.pub_endpoint) as sub,
    ):
        first = of(collect(sub, lambda ms: of(ms, "pred")), "pred")[0].header
        assert first["model_version"] == 1 and first["classes"] == ["background", "car"]
        newer = export_random(
            tmp_path / "newer",
            classes=("a", "b", "c"),
            architecture=tiny,
            input_spec=InputSpec(n_max=2000, size=(32, 32)),
            seed=1,
        )
        for name in ("model.safetensors", "model.json"):  # as mem export writes: weights, then the JSON
            shutil.copy(newer / name, served / name)
        messages = collect(sub, lambda ms: any(m.header.get("model_version") == 2 for m in of(ms, "pred")))
        swapped = next(m.header for m in of(messages, "pred") if m.header["model_version"] == 2)
        assert swapped["classes"] == ["a", "b", "c"] and swapped["session"] == first["session"]
        assert swapped["frame"] > first["frame"]

        (served / "model.safetensors").write_bytes(b"not a model")
        stats = collect(sub, lambda ms: any((m.header.get("model") or {}).get("error") for m in of(ms, "stats")))
        model = next(m.header["model"] for m in of(stats, "stats") if m.header["model"].get("error"))
        assert model["version"] == 2 and "model.safetensors" in model["error"]
        later = of(collect(sub, lambda ms: len(of(ms, "pred")) >= 3), "pred")
        assert all(m.header["model_version"] == 2 for m in later)  # still serving the last good model


def test_train_s_score_says_on_how_many_captures_it_was_measured_and_warns_when_they_are_few():
    """ "top-1 100 % on 2 held-out captures" read as a verdict next to a model calling squares discs."""
    from app.live.labelling import score_note

    few = score_note(1.0, 3, 3)
    assert few.startswith("top-1 100% on 3 held-out captures, 1 a class, trained on the others")
    assert few.endswith("(a rough figure: below 5 held out a class, one capture moves it by 33%)")
    assert score_note(0.9, 30, 3) == "top-1 90% on 30 held-out captures, 10 a class, trained on the others"
    assert score_note(None, None, None) == "top-1 ? on the held-out captures"
