"""The live wire format: what a client relies on when it decodes the server's messages (docs/protocol.md)."""

from __future__ import annotations

import json
import re
import tracemalloc

import numpy as np
import pytest

from mem_core.events import SensorSize
from mem_core.limits import MAX_SENSOR_SIDE
from mem_core.protocol import (
    PROTOCOL_VERSION,
    ProtocolError,
    SeqTracker,
    decode,
    decode_control,
    decode_events,
    decode_hist,
    decode_pred,
    decode_sensor,
    decode_stats,
    decode_tokens,
    encode,
    encode_control,
    encode_events,
    endpoint_problem,
)


def test_round_trip_keeps_arrays_fields_and_order():
    hist = np.random.default_rng(0).random((2, 8, 6)).astype(np.float16)
    tokens = np.arange(12, dtype=np.int32).reshape(3, 4)
    frames = encode("hist", 7, {"hist": hist, "tokens": tokens}, session="abc", window={"events": 10})
    assert frames[0] == b"hist"
    message = decode(frames)
    assert message.topic == "hist" and message.seq == 7
    assert message.header["version"] == PROTOCOL_VERSION and message.header["session"] == "abc"
    assert message.header["window"] == {"events": 10}
    assert [b["name"] for b in message.header["buffers"]] == ["hist", "tokens"]
    np.testing.assert_array_equal(message.arrays["hist"], hist)
    assert message.arrays["hist"].dtype == np.float16
    np.testing.assert_array_equal(message.arrays["tokens"], tokens)


def test_a_client_can_decode_with_json_and_numpy_only():
    """The documented layout: header JSON lists the buffers; each frame is a raw C-order array."""
    mask = np.array([[0, 1], [2, 1]], dtype=np.uint8)
    frames = encode("pred", 3, {"mask": mask}, task="segmentation", classes=["a", "b", "c"])
    header = json.loads(frames[1])
    (spec,) = header["buffers"]
    array = np.frombuffer(frames[2], dtype=spec["dtype"]).reshape(spec["shape"])
    np.testing.assert_array_equal(array, mask)
    assert header["classes"] == ["a", "b", "c"]


def test_big_endian_arrays_are_sent_little_endian():
    a = np.arange(5, dtype=">f4")
    message = decode(encode("stats", 0, {"a": a}))
    assert message.arrays["a"].dtype == np.dtype("<f4")
    np.testing.assert_array_equal(message.arrays["a"], a)


def test_events_round_trip_with_sensor(events_factory):
    events = events_factory(100, seed=3)
    decoded, sensor = decode_events(decode(encode_events(1, events, SensorSize(32, 48))))
    np.testing.assert_array_equal(decoded, events)
    assert sensor == SensorSize(32, 48)


def _good() -> list[bytes]:
    return encode("hist", 1, {"hist": np.zeros((2, 4, 4), np.float16)})


def _with_header(**changes) -> list[bytes]:
    frames = _good()
    header = json.loads(frames[1])
    header.update(changes)
    return [frames[0], json.dumps(header).encode(), *frames[2:]]


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"hist"], "frame"),
        ([b"hist", b"{not json", b""], "JSON"),
        ([b"hist", b"[1, 2]"], "object"),
        ([b"\xff\xfe", _good()[1], _good()[2]], "topic frame"),
        (_with_header(version=99), "version"),
        (_with_header(topic="pred"), "topic"),
        (_with_header(seq=-1), "seq"),
        (_with_header(seq="1"), "seq"),
        (_good()[:2], "buffers"),
        ([*_good()[:2], b"\x00" * 5], "bytes"),
        (_with_header(buffers=[{"name": "hist", "dtype": "O", "shape": [2, 4, 4]}]), "dtype"),
        (_with_header(buffers=[{"name": "hist", "dtype": "<f2", "shape": [2, -4, 4]}]), "shape"),
        (_with_header(buffers=[{"name": "hist", "dtype": "nonsense", "shape": [2, 4, 4]}]), "dtype"),
    ],
)
def test_malformed_messages_raise_protocol_error_naming_the_problem(frames, reason):
    with pytest.raises(ProtocolError, match=reason):
        decode(frames)


def test_events_message_with_unequal_columns_is_rejected(events_factory):
    frames = encode_events(0, events_factory(10), SensorSize(32, 48))
    message = decode(frames)
    message.arrays["x"] = message.arrays["x"][:5]
    with pytest.raises(ProtocolError, match="length"):
        decode_events(message)


def test_control_requests_round_trip_and_are_checked():
    assert decode_control(decode(encode_control(0, "speed", value=2.5))) == ("speed", {"value": 2.5})
    assert decode_control(decode(encode_control(1, "seek", position_s=0.25))) == ("seek", {"position_s": 0.25})
    assert decode_control(decode(encode_control(2, "record_start", name="take1"))) == (
        "record_start",
        {"name": "take1"},
    )
    assert decode_control(decode(encode_control(3, "pause"))) == ("pause", {})
    assert decode_control(decode(encode_control(4, "window", events=5000, ms=50.0))) == (
        "window",
        {"events": 5000, "ms": 50.0},
    )
    assert decode_control(decode(encode_control(5, "window", events=5000))) == ("window", {"events": 5000, "ms": None})
    # class names in one spelling: "é" sent as "e" + a combining accent is the one-character "é"
    assert decode_control(decode(encode_control(6, "capture", label="cafe\u0301"))) == (
        "capture",
        {"label": "caf\u00e9"},
    )
    assert decode_control(decode(encode_control(7, "train", classes=["cafe\u0301", "disc"], epochs=3))) == (
        "train",
        {"classes": ["caf\u00e9", "disc"], "epochs": 3},
    )
    for command, args, reason in (
        ("explode", {}, "unknown control command"),
        ("speed", {}, "value"),
        ("speed", {"value": -1.0}, "speed: value: must be in [0, 1000], got -1.0"),
        ("speed", {"value": True}, "number"),
        ("seek", {"position_s": -1.0}, "seek: position_s: must be in [0, 1000000000], got -1.0"),
        # in microseconds an int() overflow in the control thread
        ("seek", {"position_s": 1e308}, "seek: position_s: must be in [0, 1000000000], got 1e+308"),
        ("record_start", {"name": "a/b"}, "name"),
        ("window", {"ms": 50.0}, "window: events"),
        ("window", {"events": 0}, "window: events"),
        ("window", {"events": 10**7}, "window: events"),  # a ring of 150 MB
        ("window", {"events": 5000, "ms": -1.0}, "window: ms"),
        ("window", {"events": 5000, "ms": 1e6}, "window: ms"),
        ("window", {"events": 5000.5}, "window: events"),
        ("train", {"classes": ["disc", 3]}, "train: classes.1: expected a string"),
    ):
        with pytest.raises(ProtocolError, match=re.escape(reason)):
            decode_control(decode(encode_control(0, command, **args)))


def test_seq_tracker_counts_gaps_per_topic_and_restarts_without_gaps():
    tracker = SeqTracker()
    for topic, seq in (("hist", 0), ("pred", 0), ("hist", 1), ("hist", 4), ("pred", 1)):
        tracker.update(decode(encode(topic, seq, session="A")))
    assert tracker.missed == 2 and tracker.received == 5 and tracker.restarts == 0
    # a restarted server (new session) starts at 0 again: not a gap
    assert tracker.update(decode(encode("hist", 0, session="B"))) == 0
    assert tracker.update(decode(encode("hist", 2, session="B"))) == 1
    assert tracker.restarts == 1 and tracker.missed == 3
    # without a session field, a seq that goes back marks a restart
    assert tracker.update(decode(encode("hist", 0, session="B"))) == 0
    assert tracker.restarts == 2


# ---- hostile messages: each ends in ProtocolError naming its kind, before anything big is allocated -----------


def _header_of(frames: list[bytes], **changes) -> list[bytes]:
    header = json.loads(frames[1])
    header.update(changes)
    return [frames[0], json.dumps(header).encode(), *frames[2:]]


def _events_frames(events_factory, **changes) -> list[bytes]:
    return _header_of(encode_events(0, events_factory(10), SensorSize(32, 48)), **changes)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"events", b"[" * 100_000], "nests deeper"),  # not a RecursionError, which would end `mem serve`
        ([b"events", b'{"a":' * 10_000], "nests deeper"),
        (
            [
                b"events",
                json.dumps(
                    {"version": 1, "topic": "events", "seq": 0, "x": [[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]}
                ).encode(),
            ],
            "nests deeper",
        ),
        ([b"events", b'{"version": 1, "seq": ' + b"1" * 5000 + b"}"], "JSON"),  # int() refuses > 4300 digits
        ([b"events", b'{"version": NaN}'], "JSON"),
        ([b"events", b'{"version": 1e999}'], "JSON"),
        ([b"events", b"\xff"], "UTF-8"),
        ([b"histogram", b"{}"], "topic frame"),
    ],
)
def test_hostile_headers_are_protocol_errors_naming_the_kind(frames, reason):
    with pytest.raises(ProtocolError, match=reason) as caught:
        decode(frames, expect=("events",))
    assert caught.value.kind == "events" and str(caught.value).startswith("events message: ")


@pytest.mark.parametrize("shape", [[10**40, 0], [1e40, 0], [2**31] * 7 + [0], [0] * 9, [True, 0], [2**62, 0]])
def test_absurd_buffer_shapes_are_protocol_errors(shape):
    """An empty frame may not declare an absurd shape (``[10**40, 0]`` ended the server's control thread)."""
    frames = [b"control", *_with_header(topic="control", buffers=[{"name": "a", "dtype": "<f4", "shape": shape}])[1:2]]
    with pytest.raises(ProtocolError, match="shape") as caught:
        decode([*frames, b""])
    assert caught.value.kind == "control"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"height": 10**12}, "height"),  # a sensor this size made the server allocate its histogram
        ({"width": MAX_SENSOR_SIDE + 1}, "width"),
        ({"width": 0}, "width"),
        ({"height": 32.0}, "height"),
        ({"height": True}, "height"),
        ({"height": None}, "height"),
    ],
)
def test_events_sensor_sizes_are_bounded(events_factory, changes, reason):
    with pytest.raises(ProtocolError, match=reason) as caught:
        decode_events(decode(_events_frames(events_factory, **changes)))
    assert caught.value.kind == "events"


def test_events_columns_must_convert_without_loss_and_lie_on_the_sensor(events_factory):
    events = events_factory(10)
    frames = encode(
        "events",
        0,
        {"t": events["t"].astype(np.float64), "x": events["x"], "y": events["y"], "p": events["p"]},
        height=32,
        width=48,
    )
    with pytest.raises(ProtocolError, match="column 't'"):
        decode_events(decode(frames))
    off_sensor = events.copy()
    off_sensor["x"] = 999
    with pytest.raises(ProtocolError, match="outside the sensor"):
        decode_events(decode(encode_events(0, off_sensor, SensorSize(32, 48))))


def test_the_largest_real_sensors_fit_the_limit(events_factory):
    events = events_factory(10)
    for sensor in (SensorSize(720, 1280), SensorSize(MAX_SENSOR_SIDE, MAX_SENSOR_SIDE)):
        assert decode_events(decode(encode_events(0, events, sensor)))[1] == sensor


HIST = np.full((2, 8, 8), 0.5, np.float16)
GRID = np.arange(16, dtype=np.int32).reshape(4, 4)
MASK = np.zeros((8, 8), np.uint8)
PROBS = np.array([0.25, 0.75], np.float32)
TOP_K = [{"id": 1, "name": "car", "prob": 0.75}, {"id": 0, "name": "background", "prob": 0.25}]
CLASSES = ["background", "car"]
DECODERS = {
    "sensor": decode_sensor,
    "hist": decode_hist,
    "tokens": decode_tokens,
    "pred": decode_pred,
    "stats": decode_stats,
}
VIEW = np.zeros((2, 100, 120), np.float16)
SENSOR_FIELDS = {"sensor": [100, 120], "binning": 1}


@pytest.mark.parametrize(
    ("topic", "arrays", "fields", "reason"),
    [
        ("hist", {"hist": np.zeros((2, 0, 8), np.float16)}, {}, "side"),
        ("hist", {"hist": np.full((2, 8, 8), np.nan, np.float32)}, {}, "NaN"),
        ("hist", {"hist": np.zeros((3, 8, 8), np.float16)}, {}, "channels"),
        ("hist", {"hist": np.full((2, 8, 8), 1e300)}, {}, "float16 or float32"),
        ("hist", {"hist": np.zeros((2, 4096, 1), np.float16)}, {}, "side"),
        ("tokens", {"tokens": GRID}, {"num_tokens": 10**8}, "num_tokens"),  # took the viewer to 2.8 GB
        ("tokens", {"tokens": np.zeros((0, 4), np.int32)}, {"num_tokens": 64}, "side"),
        ("tokens", {"tokens": GRID}, {"num_tokens": 8}, "token ids"),
        ("tokens", {"tokens": GRID.astype(np.float32)}, {"num_tokens": 64}, "kind"),
        ("pred", {"mask": np.full((8, 8), 2**62, np.uint64)}, {"task": "segmentation", "classes": CLASSES}, "class id"),
        ("pred", {"mask": MASK}, {"task": "segmentation", "classes": []}, "classes"),
        ("pred", {"probs": PROBS}, {"task": "classification", "classes": ["a", "b", "c"]}, "probs"),
        ("pred", {"probs": PROBS * np.nan}, {"task": "classification", "classes": CLASSES}, "probs"),
        (
            "pred",
            {"probs": PROBS},
            {"task": "classification", "classes": CLASSES, "top_k": [{"id": "1"}]},
            "top_k.0.id",
        ),
        ("pred", {"probs": PROBS}, {"task": "classification", "classes": CLASSES, "top_k": TOP_K * 2}, "top_k"),
        ("pred", {"probs": PROBS}, {"task": "detection", "classes": CLASSES}, "task"),
        ("stats", {}, {"events_per_s": "fast"}, "events_per_s"),
        ("stats", {}, {"latency_ms": [1, 2]}, "latency_ms"),
        ("stats", {}, {"source": {"replay": {"duration_s": -1}}}, "source.replay.duration_s"),
        ("stats", {}, {"control": "garbage"}, "control"),
        ("stats", {}, {"malformed": 1.5}, "malformed"),
        ("stats", {}, {"events_per_s": 10**400}, "events_per_s"),  # an OverflowError, not a ProtocolError, before
        ("stats", {}, {"accumulation": {"events": 0}}, "accumulation.events"),
        ("stats", {}, {"accumulation": {"ms": -1.0}}, "accumulation.ms"),
        ("sensor", {"sensor": VIEW}, {"sensor": [100, 120], "binning": 2}, "binned by 2"),
        ("sensor", {"sensor": VIEW}, {"sensor": [10**9, 120], "binning": 1}, "sensor"),
        ("sensor", {"sensor": VIEW}, {"sensor": [100, 120]}, "binning"),
        ("sensor", {"sensor": VIEW}, {**SENSOR_FIELDS, "input_region": [0, 0, 200, 120]}, "input_region"),
        ("sensor", {"sensor": VIEW}, {**SENSOR_FIELDS, "input_region": [-11, 0, 120, 120]}, "input_region"),
        ("sensor", {"sensor": VIEW}, {**SENSOR_FIELDS, "input_region": [0, -1, 100, 100]}, "input_region"),
        ("sensor", {"sensor": VIEW}, {**SENSOR_FIELDS, "input_region": [0, 0, 0, 120]}, "input_region"),
        ("sensor", {"sensor": VIEW}, {**SENSOR_FIELDS, "input_region": [0, 0, 100]}, "input_region"),
        ("sensor", {"sensor": VIEW.astype(np.float64)}, SENSOR_FIELDS, "float16/32"),
        ("sensor", {"sensor": VIEW[:1]}, {"sensor": [100, 120], "binning": 1}, "shape"),
        ("sensor", {"sensor": VIEW * np.float16(np.nan)}, SENSOR_FIELDS, "NaN"),
        ("sensor", {"hist": VIEW}, SENSOR_FIELDS, "buffer 'sensor'"),
    ],
)
def test_content_that_does_not_fit_the_topic_is_a_protocol_error_naming_it(topic, arrays, fields, reason):
    message = decode(encode(topic, 0, arrays, **fields))
    with pytest.raises(ProtocolError, match=reason) as caught:
        DECODERS[topic](message)
    assert caught.value.kind == topic


def test_an_object_of_many_wrong_entries_is_refused_by_its_size_not_entry_by_entry():
    """60 000 bad capture counts: one error at once, not 60 000 errors built (42 MiB and seconds in the viewer)."""
    message = decode(encode("stats", 0, labels={"counts": {f"c{i}": "x" for i in range(60_000)}}))
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=r"labels\.counts: at most 1000 entries, got 60000"):
            decode_stats(message)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


def test_what_the_server_sends_is_accepted_as_it_is():
    assert decode_hist(decode(encode("hist", 0, {"hist": HIST}))) is not None
    tokens, num_tokens = decode_tokens(decode(encode("tokens", 0, {"tokens": GRID}, num_tokens=64)))
    assert num_tokens == 64 and tokens.shape == (4, 4)
    pred = decode_pred(decode(encode("pred", 0, {"probs": PROBS}, task="classification", classes=CLASSES, top_k=TOP_K)))
    assert pred.top_k == TOP_K and pred.classes == CLASSES
    assert decode_pred(decode(encode("pred", 0, {"mask": MASK}, task="segmentation", classes=CLASSES))).mask is not None
    replay = {"playing": True, "speed": 1.0, "position_s": 0.5, "duration_s": 2.0}
    stats = {"events_per_s": 2.5e6, "control": "tcp://0.0.0.0:5558", "recording": None, "source": {"replay": replay}}
    assert decode_stats(decode(encode("stats", 0, **stats, unknown_field=[1]))) == stats
    accumulation = {"events": 30000, "ms": None, "default_events": 30000, "default_ms": 100.0}
    stats = {"model_state": "loading", "accumulation": accumulation}
    assert decode_stats(decode(encode("stats", 0, **stats))) == stats
    region = [0.0, 10.0, 100.0, 100.0]  # a centre crop of the model input
    view = decode_sensor(decode(encode("sensor", 0, {"sensor": VIEW}, **SENSOR_FIELDS, input_region=region)))
    assert view.sensor == (100, 120) and view.binning == 1 and view.input_region == tuple(region)
    region = [-10.0, 0.0, 120.0, 120.0]  # the extent crop of an object as wide as the sensor: past its top and foot
    view = decode_sensor(decode(encode("sensor", 0, {"sensor": VIEW}, **SENSOR_FIELDS, input_region=region)))
    assert view.input_region == tuple(region)
    gen4 = np.zeros((2, 360, 640), np.float16)  # 1280 x 720 binned by 2
    view = decode_sensor(decode(encode("sensor", 0, {"sensor": gen4}, sensor=[720, 1280], binning=2)))
    assert view.input_region == (0, 0, 360, 640)  # the default: the whole picture


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:5557", "tcp://localhost:5557", "tcp://[::1]:5557", "ipc:///tmp/mem"]
)
def test_endpoints_a_client_can_connect_to_are_accepted(endpoint):
    assert endpoint_problem(endpoint) is None


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("garbage", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1:*", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1:99999", "port 99999"),
        ("ipc://", "ipc://PATH"),
    ],
)
def test_endpoints_a_client_cannot_connect_to_are_named(endpoint, problem):
    assert problem in endpoint_problem(endpoint)
