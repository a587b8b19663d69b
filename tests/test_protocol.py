"""The live wire format: what a client relies on when it decodes the server's messages (docs/protocol.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mem_core.events import SensorSize
from mem_core.protocol import (
    PROTOCOL_VERSION,
    ProtocolError,
    SeqTracker,
    decode,
    decode_control,
    decode_events,
    encode,
    encode_control,
    encode_events,
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
        ([b"\xff\xfe", _good()[1], _good()[2]], "ASCII"),
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
    for command, args, reason in (
        ("explode", {}, "unknown control command"),
        ("speed", {}, "value"),
        ("speed", {"value": 0}, "outside"),
        ("speed", {"value": True}, "number"),
        ("seek", {"position_s": -1.0}, "outside"),
        ("record_start", {"name": "a/b"}, "name"),
    ):
        with pytest.raises(ProtocolError, match=reason):
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
