"""The live inference server: newest-window inference without backlog, published messages, control, recording."""

from __future__ import annotations

import contextlib
import json
import time

import numpy as np
import pytest
import zmq

from app.config import ServeConfig
from app.live.ring import EventRing
from app.live.server import LiveServer, control_endpoint_for
from mem_core.configuration import ConfigError
from mem_core.corpus import Corpus
from mem_core.events import SensorSize
from mem_core.export import export_random
from mem_core.inference import Predictor
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.protocol import decode, encode, encode_control, encode_events
from mem_core.representation import InputSpec
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


def test_ring_clear_forgets_events_but_total_keeps_counting(events_factory):
    ring = EventRing(10)
    ring.push(events_factory(15), arrival=1.0)
    ring.clear()
    assert len(ring.snapshot().events) == 0 and ring.total == 15


def test_control_endpoint_defaults_to_the_next_port():
    assert control_endpoint_for("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5558"
    assert control_endpoint_for("tcp://127.0.0.1:*") == "tcp://127.0.0.1:*"
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


def test_server_publishes_hist_tokens_pred_and_stats(export):
    source = SyntheticSource(200_000, SENSOR, batch_us=5000)
    with serving(export, source) as server, subscriber(server.pub_endpoint) as sub:
        messages = collect(sub, lambda ms: len(of(ms, "pred")) >= 5 and len(of(ms, "stats")) >= 2)
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


def test_window_ms_caps_the_time_span_of_each_window(export):
    # 200 k events/s: the model's 2000-event window spans 10 ms; a 4 ms cap keeps only the newest ~800 events
    source = SyntheticSource(200_000, SENSOR, batch_us=2000)
    with serving(export, source, window_ms=4.0) as server, subscriber(server.pub_endpoint) as sub:
        messages = collect(sub, lambda ms: len(of(ms, "pred")) >= 5)
    for p in of(messages, "pred"):
        window = p.header["window"]
        assert window["t_last_us"] - window["t_first_us"] < 4000
        assert 0 < window["events"] < 2000
    with pytest.raises(ValueError, match="window_ms"):
        LiveServer(ServeConfig(model=export, window_ms=0.0), source=SyntheticSource(1000, SENSOR))


class SlowPredictor(Predictor):
    """The real predictor plus a fixed delay, standing in for a model slower than the event stream."""

    delay_s = 0.05

    def __call__(self, events, sensor):
        time.sleep(self.delay_s)
        return super().__call__(events, sensor)


def test_a_slow_model_skips_windows_instead_of_building_a_backlog(export):
    source = SyntheticSource(2_000_000, SENSOR, batch_us=2000)  # 1000 windows/s, the model does < 20/s
    with serving(export, source, predictor=SlowPredictor(export), window=2000) as server:
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


def test_control_pauses_seeks_and_changes_replay_speed(export, data_dir):
    from recorders.replay import ReplaySource

    path = sorted((data_dir / "ncars-dev" / "val" / "cars").glob("*.dat"))[0]
    source = ReplaySource(path, loop=True, batch_us=5000)
    with serving(export, source) as server:
        control = server.control_endpoint
        reply = request(control, "pause")
        assert reply["ok"] and reply["state"]["source"]["replay"]["playing"] is False
        frames, deadline = -1, time.monotonic() + WAIT_S
        while server.frames != frames:  # settles once the batches in flight at the pause are inferred
            assert time.monotonic() < deadline, "predictions went on while paused"
            frames = server.frames
            time.sleep(0.5)
        reply = request(control, "speed", value=2.0)
        assert reply["ok"] and reply["state"]["source"]["replay"]["speed"] == 2.0
        assert request(control, "seek", position_s=0.05)["ok"]
        assert request(control, "play")["ok"]
        deadline = time.monotonic() + WAIT_S
        while server.frames == frames:
            assert time.monotonic() < deadline, "no predictions after play"
            time.sleep(0.05)
        replay = request(control, "state")["state"]["source"]["replay"]
        assert replay["playing"] and 0 <= replay["position_s"] <= replay["duration_s"] + 1e-6
        refused = request(control, "record_start")
        assert not refused["ok"] and "live source" in refused["error"]


def test_malformed_control_requests_are_answered_and_counted(export):
    source = SyntheticSource(100_000, SENSOR, batch_us=5000)
    with serving(export, source) as server:
        socket = zmq.Context.instance().socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(server.control_endpoint)
        try:
            for frames in ([b"control", b"not json"], encode("control", 0, command="explode")):
                socket.send_multipart(frames)
                assert socket.poll(WAIT_S * 1000)
                reply = decode(socket.recv_multipart()).header
                assert reply["ok"] is False and reply["error"]
        finally:
            socket.close(0)
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
        socket = zmq.Context.instance().socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(server.control_endpoint)
        try:
            for frames in HOSTILE_REQUESTS:
                socket.send_multipart(frames)
                assert socket.poll(WAIT_S * 1000), f"no reply to {frames[1][:40]!r}"
                reply = decode(socket.recv_multipart()).header
                assert reply["ok"] is False and reply["error"].startswith("control message: ")
        finally:
            socket.close(0)
        assert request(server.control_endpoint, "state")["ok"] is True
        assert server.stats()["malformed"] == len(HOSTILE_REQUESTS)


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
            assert server._runner.is_alive()
    finally:
        publisher.close(0)
