"""Fuzzing the live message path with mutants of real messages of every kind, at every receiver.

Receivers: the server's control socket (``LiveServer.reply_frames``), ``--source tcp://`` (``ZmqEventSource.accept``),
the viewer's decoders (``hist``, ``tokens``, ``pred``, ``stats``, control replies) and its window. Mutants: cut
frames, flipped bits, dropped or repeated frames, garbage buffers behind a valid header, buffers retyped to another
dtype, hostile header values, absurd declared sizes and deeply nested JSON. The property: a mutant is accepted as valid data or refused with a
``ProtocolError`` naming the message kind, within a time bound (the deadline) and a memory bound (the tracemalloc
peak); the receiver then goes on with the next good message. Seeded (``derandomize``): CI runs the same examples.
"""

from __future__ import annotations

import contextlib
import math
import time
import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mutants import mutant

from app.config import ServeConfig
from app.live.server import LiveServer
from app.viewer.client import VIEW_TOPICS
from app.viewer.window import ViewerWindow
from mem_core.events import validate_events
from mem_core.io import read_events
from mem_core.limits import MAX_IMAGE_SIDE, MAX_NUM_TOKENS, MAX_SENSOR_SIDE
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.protocol import (
    TOPICS,
    VIEW_DECODERS,
    ProtocolError,
    decode,
    decode_control,
    decode_events,
    decode_reply,
    encode,
    encode_control,
    encode_events,
)
from mem_core.representation import InputSpec
from mem_core.runs.export import export_random
from recorders.replay import ReplaySource
from recorders.zmq_source import ZmqEventSource

pytestmark = pytest.mark.slow  # hypothesis over real sockets

FUZZ = settings(
    max_examples=200,  # per kind and receiver: about 3600 mutants in all
    derandomize=True,  # seeded: the same mutants on every run
    database=None,
    deadline=timedelta(seconds=2),  # the time bound (generous: a shared 2-core machine); decoding takes ~1 ms
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MEMORY_BOUND = 16 * 2**20  # bytes a receiver may allocate for one message (the real ones are a few kB)
WAIT_S = 30.0
CONTROL_REQUESTS = [("state", {}), ("pause", {}), ("speed", {"value": 2.0}), ("seek", {"position_s": 0.5}),
                    ("step", {}), ("record_start", {"name": "take1"}), ("record_stop", {})]  # fmt: skip


# ---- real messages -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recording(data_dir):
    return sorted((data_dir / "ncars-dev" / "val" / "cars").glob("*.dat"))[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory, recording):
    """A tiny classifier with a tokenizer serving a real N-Cars recording (stopped after the capture)."""
    export = export_random(
        tmp_path_factory.mktemp("export"),
        architecture=ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0),
        input_spec=InputSpec(n_max=2000, size=(32, 32)),
        tokenizer=TokenizerConfig(img_size=32, num_layers=3, num_tokens=64, hidden_dim=16),
    )
    config = ServeConfig(model=export, pub="tcp://127.0.0.1:*", stats_interval_s=0.2)
    return LiveServer(config, source=ReplaySource(recording, loop=True, batch_us=5000))


@pytest.fixture(scope="module")
def messages(server, recording) -> dict[str, list[bytes]]:
    """One real message of each kind: what the server publishes and replies, what ``mem record --publish`` sends."""
    captured = _capture(server)
    events, sensor = read_events(recording)
    mask = np.zeros((32, 32), np.uint8)
    mask[8:24, 8:24] = 2
    return {
        **captured,
        "events": encode_events(0, events[:300], sensor),
        "pred-segmentation": encode(
            "pred", 0, {"mask": mask}, task="segmentation", classes=["background", "disc", "square"], latency_ms=3.0
        ),
        **{f"control-{c}": encode_control(0, c, **args) for c, args in CONTROL_REQUESTS},
    }


def _capture(server: LiveServer) -> dict[str, list[bytes]]:
    context = zmq.Context.instance()
    captured: dict[str, list[bytes]] = {}
    with contextlib.ExitStack() as stack:
        sub = stack.enter_context(context.socket(zmq.SUB))
        req = stack.enter_context(context.socket(zmq.REQ))
        for socket in (sub, req):
            socket.setsockopt(zmq.LINGER, 0)
        server.start()
        stack.callback(server.stop)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(server.pub_endpoint)
        deadline = time.monotonic() + WAIT_S
        while not {"sensor", "hist", "tokens", "pred", "stats"} <= set(captured):
            assert time.monotonic() < deadline, f"the server sent only {sorted(captured)}"
            if sub.poll(100):
                frames = sub.recv_multipart()
                captured[frames[0].decode()] = frames
        req.connect(server.control_endpoint)
        req.send_multipart(encode_control(0, "state"))
        assert req.poll(WAIT_S * 1000), "no control reply"
        captured["control-reply"] = req.recv_multipart()
    return captured


# ---- the property --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def bounded_memory():
    """Fails when the body allocates ``MEMORY_BOUND`` bytes or more (numpy's buffers included) at any moment."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"{peak / 2**20:.0f} MiB for one message"


def received(receiver: Callable[[list[bytes]], object], frames: list[bytes], kind: str, original: list[bytes]):
    """``receiver(frames)``: its result, or None after a ``ProtocolError`` naming ``kind`` (or, when the topic
    frame itself was damaged, the kind the receiver expected), within the memory bound."""
    with bounded_memory():
        try:
            return receiver(frames)
        except ProtocolError as exc:
            event(f"refused: {exc.reason[:25]}")
            damaged_topic = frames[:1] != original[:1]
            assert exc.kind == kind or (damaged_topic and exc.kind in (*TOPICS, "live")), exc
            assert str(exc).startswith(f"{exc.kind} message: ")
            return None


VIEWER_DECODERS = VIEW_DECODERS


def viewer_decode(frames: list[bytes]):
    message = decode(frames, expect=VIEW_TOPICS)
    return message.topic, VIEWER_DECODERS[message.topic](message)


def assert_drawable(topic: str, content) -> None:
    """What the viewer relies on in accepted content (docs/protocol.md), whatever the message held."""
    if topic == "sensor":
        image, (top, left, height, width) = content.image, content.input_region
        assert image.shape[0] == 2 and max(image.shape) <= MAX_IMAGE_SIDE and np.isfinite(image).all()
        assert 0 < height <= image.shape[1] + 1e-6 - top and 0 < width <= image.shape[2] + 1e-6 - left
    elif topic == "hist":
        assert content.shape[0] == 2 and max(content.shape) <= MAX_IMAGE_SIDE and np.isfinite(content).all()
    elif topic == "tokens":
        tokens, num_tokens = content
        assert num_tokens <= MAX_NUM_TOKENS and 0 <= tokens.min() <= tokens.max() < num_tokens
    elif topic == "pred" and content.mask is not None:
        assert content.mask.max() < len(content.classes) and max(content.mask.shape) <= MAX_IMAGE_SIDE
    elif topic == "pred":
        assert content.probs.shape == (len(content.classes),) and ((content.probs >= 0) & (content.probs <= 1)).all()
        assert all(entry["id"] < len(content.classes) and 0 <= entry["prob"] <= 1 for entry in content.top_k)
    else:  # stats: numbers where the status bar formats numbers, objects where it looks inside
        objects = ("latency_ms", "stages_ms", "source", "recording", "accumulation", "labels", "training", "model")
        texts = ("session", "task", "model_state", "control")
        numbers = [v for k, v in content.items() if k not in (*texts, *objects)]
        numbers += [*content.get("latency_ms", {}).values(), *content.get("stages_ms", {}).values()]
        assert all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in numbers)
        assert isinstance(content.get("source", {}), dict) and isinstance(content.get("recording") or {}, dict)
        for key in ("labels", "training", "model"):
            assert isinstance(content.get(key) or {}, dict)
        counts = (content.get("labels") or {}).get("counts", {})
        assert all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values())


@FUZZ
@given(data=st.data())
def test_tcp_source_accepts_valid_batches_and_drops_the_rest(messages, data):
    frames = mutant(data, messages["events"])
    decoded = received(lambda f: decode_events(decode(f, expect=("events",))), frames, "events", messages["events"])
    source = ZmqEventSource("tcp://127.0.0.1:1")  # its socket opens only when iterated
    batch = source.accept(frames)
    assert (batch is None) == (decoded is None) and source.malformed == (batch is None)
    if batch is not None:
        validate_events(batch, source.sensor)
        assert max(source.sensor) <= MAX_SENSOR_SIDE


@pytest.mark.parametrize("command", [c for c, _ in CONTROL_REQUESTS])
@FUZZ
@given(data=st.data())
def test_control_socket_answers_every_request_with_a_valid_reply(server, messages, command, data):
    original = messages[f"control-{command}"]
    frames = mutant(data, original)
    request = received(lambda f: decode_control(decode(f, expect=("control",))), frames, "control", original)
    reply = decode_reply(decode(server.reply_frames(frames, 0), expect=("control",)))
    if request is None:
        assert reply["ok"] is False and reply["error"].startswith("control message: ")
    else:  # carried out, or refused for a reason that is not the message's fault (no recording from a file)
        assert reply["command"] == request[0] and (reply["ok"] or "live source" in reply["error"]), reply


VIEWER_MESSAGES = ["sensor", "hist", "tokens", "pred", "pred-segmentation", "stats"]


@pytest.mark.parametrize("name", [*VIEWER_MESSAGES, "control-reply"])
@FUZZ
@given(data=st.data())
def test_viewer_decoders_accept_valid_content_and_refuse_the_rest(messages, name, data):
    kind = "control" if name == "control-reply" else name.split("-")[0]
    frames = mutant(data, messages[name])
    if kind == "control":
        reply = received(lambda f: decode_reply(decode(f, expect=("control",))), frames, kind, messages[name])
        assert reply is None or (isinstance(reply["ok"], bool) and isinstance(reply.get("state") or {}, dict))
    elif (decoded := received(viewer_decode, frames, kind, messages[name])) is not None:
        assert_drawable(*decoded)


@pytest.fixture(scope="module")
def window(qapp):
    w = ViewerWindow()
    w.show()
    yield w
    w.close()


@pytest.mark.parametrize("name", VIEWER_MESSAGES)
@FUZZ
@given(data=st.data())
def test_viewer_drops_and_counts_bad_messages_and_draws_the_next_good_frame(window, messages, name, data):
    try:  # what the client does: a message that is not even a live message never reaches the window
        message = decode(mutant(data, messages[name]), expect=VIEW_TOPICS)
    except ProtocolError:
        return
    try:
        VIEWER_DECODERS[message.topic](message)
        valid = True
    except ProtocolError:
        valid = False
    bad, frames = window.bad_messages, window.frames_shown
    with bounded_memory():
        window.apply({message.topic: message})
    assert window.bad_messages == bad + (not valid)
    drawn = int(valid and message.topic in ("sensor", "hist"))  # a new picture on screen
    good = decode(messages["hist"])
    window.apply({"hist": good, "pred": decode(messages["pred"]), "stats": decode(messages["stats"])})
    window.update_status()
    assert window.frames_shown == frames + drawn + 1 and window.bad_messages == bad + (not valid)
    np.testing.assert_array_equal(window.view.hist, good.arrays["hist"])


def test_real_messages_are_accepted_as_they_are(server, messages):
    """The fuzz starts from valid messages: each receiver takes the originals without complaint."""
    assert ZmqEventSource("tcp://127.0.0.1:1").accept(messages["events"]) is not None
    for name in VIEWER_MESSAGES:
        viewer_decode(messages[name])
    assert decode_reply(decode(messages["control-reply"]))["ok"] is True
    for command, _ in CONTROL_REQUESTS:
        reply = decode_reply(decode(server.reply_frames(messages[f"control-{command}"], 0)))
        assert reply["command"] == command and (reply["ok"] or "live source" in reply["error"])


# ---- messages too large to be read: refused frame by frame, their memory given back -----------------------------

HUGE_FRAMES = 200  # of 1 MiB each: far beyond any request or batch, within each frame's own size limit
GROWTH_BOUND = 64 * 2**20  # what a process may keep after two such messages (it kept 200-400 MB)


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) * 1024


def free_port() -> int:
    socket = zmq.Context.instance().socket(zmq.REP)
    port = socket.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=40000)
    socket.close(0)
    return port


def huge_message(first: bytes) -> list:
    frame = b"x" * (1 << 20)
    return [first, *[frame] * HUGE_FRAMES]  # sent without copying: the test itself holds 1 MiB


@contextlib.contextmanager
def mem_process(*args: str):
    """``mem ARGS`` as a user starts it, stopped with SIGINT (killed if it does not stop)."""
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "app.cli", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        yield process
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=WAIT_S)
        assert process.returncode == 0 and "Traceback" not in out, out[-3000:]
    finally:
        process.kill()
        process.wait()


def test_a_control_request_of_many_frames_is_refused_and_the_server_keeps_no_memory_of_it(tmp_path):
    """One control request of 400 frames of 1 MiB grew the server by 800 MB and kept it (libzmq's MAXMSGSIZE bounds
    each frame only): it is read frame by frame, dropped, answered as malformed, and the next request answered."""
    pub, control = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    socket = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    with mem_process("serve", "--source", "synthetic:0.01", "--pub", pub, "--control", control) as server:
        socket.connect(control)

        def ask(frames: list) -> dict:
            socket.send_multipart(frames, copy=False)
            assert socket.poll(WAIT_S * 1000), "no reply"
            return decode_reply(decode(socket.recv_multipart(), expect=("control",)))

        assert ask(encode_control(0, "state"))["ok"]
        before = rss_bytes(server.pid)
        replies = [ask(huge_message(b"control")) for _ in range(2)]
        assert ask(encode_control(0, "state"))["ok"]
        grown = rss_bytes(server.pid) - before
        socket.close(0)
    assert grown < GROWTH_BOUND, f"the server kept {grown / 2**20:.0f} MiB"
    for reply in replies:
        assert not reply["ok"] and reply["error"].startswith("control message: more than 2 frames")


def test_an_events_message_of_many_frames_is_dropped_and_the_source_keeps_no_memory_of_it(tmp_path, recording):
    """``--source tcp://`` read the same way: a message beyond any batch is dropped as it is read, the next batch
    recorded, and nothing of it kept."""
    from mem_core.corpus import Corpus, CorpusError

    events, sensor = read_events(recording)
    publisher = zmq.Context.instance().socket(zmq.XPUB)  # XPUB: tells when the subscriber is there
    publisher.setsockopt(zmq.LINGER, 0)
    port = publisher.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=40000)
    out = tmp_path / "corpus"

    def recorded() -> int:
        with contextlib.suppress(CorpusError, OSError, ValueError), Corpus(out) as corpus:  # (not written yet)
            return sum(r.n_events for r in corpus.recordings)
        return 0

    def send_until_recorded(seq: int, t0: int) -> None:
        batch = events[:1000].copy()
        batch["t"] += t0 - batch["t"][0]
        total, deadline = recorded(), time.monotonic() + 2 * WAIT_S
        while recorded() <= total:
            assert time.monotonic() < deadline, "no batch was recorded"
            publisher.send_multipart(encode_events(seq, batch, sensor))
            batch["t"] += 1_000_000
            seq += 1
            time.sleep(0.2)

    try:
        with mem_process("record", "--source", f"tcp://127.0.0.1:{port}", "--out", str(out)) as recorder:
            assert publisher.poll(WAIT_S * 1000), "the source never subscribed"
            publisher.recv()  # its subscription
            send_until_recorded(0, 0)
            before = rss_bytes(recorder.pid)
            for _ in range(2):
                publisher.send_multipart(huge_message(b"events"), copy=False)
            send_until_recorded(1000, 100_000_000)
            grown = rss_bytes(recorder.pid) - before
    finally:
        publisher.close(0)
    assert grown < GROWTH_BOUND, f"the source kept {grown / 2**20:.0f} MiB"
