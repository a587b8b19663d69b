"""``mem record``: a crash keeps the flushed events, clean stops, segments, full disks, reconnection, --publish."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import zmq
from recorders_fakes import FakeRig, clock_batches

from mem_core.corpus import Corpus, CorpusError
from mem_core.corpus.format import load_manifest
from mem_core.events import EVENT_DTYPE, SensorSize, validate_events
from mem_core.protocol import decode, decode_events
from mem_core.simulator import EventSimulator, SimulatorConfig
from recorders.base import LiveSource, RecorderError
from recorders.camera import CameraSource
from recorders.config import RecordConfig
from recorders.publish import EventPublisher, normalize_address
from recorders.record import run
from recorders.simulated import SimulatorSource
from recorders.zmq_source import ZmqEventSource

ROOT = Path(__file__).resolve().parent.parent
SIM = SimulatorConfig(sensor=SensorSize(48, 64), n_objects=2, seed=5)


class ArraySource(LiveSource):
    """The given batches, then the end of the stream (or heartbeats forever with ``endless``)."""

    def __init__(self, batches: list[np.ndarray], sensor: SensorSize, endless: bool = False) -> None:
        self.batches, self.sensor, self.endless = batches, sensor, endless
        self.metadata = {"kind": "test", "model": "array", "serial": "0"}

    def __iter__(self):
        yield from self.batches
        while self.endless:
            time.sleep(0.01)
            yield np.empty(0, dtype=EVENT_DTYPE)


def session_events(root: Path, name: str) -> np.ndarray:
    corpus = Corpus(root)
    parts = [corpus.events(i) for i, r in enumerate(corpus.recordings) if r.session == name]
    return np.concatenate(parts) if parts else np.empty(0, dtype=EVENT_DTYPE)


def assert_simulator_prefix(events: np.ndarray, config: SimulatorConfig, batch_us: int = 10_000) -> None:
    """``events`` are exactly the first events of the (deterministic) simulator's stream of ``batch_us`` batches."""
    n_batches = int(events["t"][-1]) // batch_us + 1
    expected = EventSimulator(config).simulate(n_batches * batch_us)
    np.testing.assert_array_equal(events, expected[: events.size])


def child(*args: str) -> subprocess.Popen:
    """A recording child process: ``mem`` itself (``app.cli``) or ``recorders_record_child.py``."""
    argv = (
        ["-m", "app.cli", *args] if args[0] == "record" else [str(ROOT / "tests" / "recorders_record_child.py"), *args]
    )
    return subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_events(root: Path, min_events: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(CorpusError):  # (not written yet)
            manifest = load_manifest(root)  # what is committed: the manifest and its journal
            if sum(r["n_events"] for r in manifest["recordings"]) >= min_events:
                return
        time.sleep(0.05)
    raise AssertionError(f"{root}: fewer than {min_events} events committed after {timeout} s")


# ---------------------------------------------------------------------------------------------- crash, stops


def test_sigkill_during_recording_keeps_all_but_the_last_second(tmp_path):
    out = tmp_path / "corpus"
    proc = child(str(out), "killed")
    try:
        wait_for_events(out, 1)
        time.sleep(2.0)
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.time()
    finally:
        proc.kill()
        proc.communicate()
    corpus = Corpus(out)
    (rec,) = corpus.recordings
    assert not rec.complete and rec.n_events > 0
    events = corpus.events(0)
    # The simulator is deterministic: the corpus holds exactly the first events of its stream.
    assert_simulator_prefix(events, SimulatorConfig(**rec.metadata["simulator"]))
    # Real-time source: what is missing is at most the last second (plus slack for a loaded machine).
    started = datetime.fromisoformat(rec.metadata["start_utc"]).timestamp()
    assert int(events["t"][-1]) / 1e6 >= killed_at - started - 1.75


def test_ctrl_c_stops_cleanly_and_completes_the_recording(tmp_path):
    out = tmp_path / "corpus"
    proc = child(str(out), "desk")
    try:
        wait_for_events(out, 1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    result = json.loads(stdout)
    assert result["stop_reason"] == "interrupted (SIGINT)" and result["error"] is None
    (rec,) = Corpus(out).recordings
    assert rec.name == "desk" and rec.complete and rec.n_events == result["stored"] == result["events"] > 0


def test_duration_stops_and_manifest_keeps_camera_facts(tmp_path):
    out = tmp_path / "corpus"
    result = run(RecordConfig(source="sim", out=out, duration_s=0.5, min_free_bytes=0), source=SimulatorSource(SIM))
    assert result.stop_reason == "duration" and result.ok
    assert 0.5 <= result.seconds < 5
    assert result.events == result.stored > 0
    (rec,) = Corpus(out).recordings
    assert rec.complete and rec.sensor == SIM.sensor
    meta = rec.metadata
    assert meta["model"] == "MEM simulator" and meta["serial"] == "sim-seed5"
    assert (meta["height"], meta["width"]) == (48, 64)
    assert abs(datetime.fromisoformat(meta["start_utc"]).timestamp() - time.time()) < 60
    assert_simulator_prefix(session_events(out, result.name), SIM)


def test_source_end_and_stop_event_end_the_recording(tmp_path, events_factory):
    batches = [events_factory(1000, seed=s, t0=10**6 * s) for s in range(3)]
    result = run(
        RecordConfig(source="test", out=tmp_path / "a", min_free_bytes=0),
        source=ArraySource(batches, SensorSize(32, 48)),
    )
    assert result.stop_reason == "source ended" and result.stored == 3000
    np.testing.assert_array_equal(session_events(tmp_path / "a", result.name), np.concatenate(batches))

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    endless = ArraySource(batches, SensorSize(32, 48), endless=True)
    result = run(RecordConfig(source="test", out=tmp_path / "b", min_free_bytes=0), source=endless, stop=stop)
    assert result.stop_reason == "stopped" and result.stored == 3000


class TimedSource(LiveSource):
    """Heartbeats for ``delay_s`` (a camera opening, a compiler warming up), then, like a camera, every event up to
    the current time (one per ms) whenever it is read; ``rate`` < 1 is a source whose event time runs slow."""

    def __init__(self, delay_s: float, rate: float = 1.0) -> None:
        self.delay_s, self.rate = delay_s, rate
        self.sensor, self.metadata = SensorSize(32, 48), {"kind": "test"}

    def __iter__(self):
        start = time.monotonic()
        while time.monotonic() - start < self.delay_s:
            time.sleep(0.01)
            yield np.empty(0, dtype=EVENT_DTYPE)
        start, sent = time.monotonic(), 0  # sent: events (= ms of event time) delivered so far
        while True:
            due = int((time.monotonic() - start) * self.rate * 1000)
            batch = np.zeros(due - sent, dtype=EVENT_DTYPE)
            batch["t"] = 1_000 * np.arange(sent, due)
            sent = due
            yield batch
            time.sleep(0.01)


def test_duration_counts_from_the_first_events_not_from_the_start(tmp_path):
    config = RecordConfig(source="test", out=tmp_path / "c", duration_s=1.0, min_free_bytes=0, status=False)
    result = run(config, source=TimedSource(delay_s=1.5))
    events = session_events(tmp_path / "c", result.name)
    assert result.stop_reason == "duration"
    assert events["t"][-1] - events["t"][0] >= 800_000  # about 1 s of events, not the ~0 s left after the delay
    assert result.lag_warning is None


def test_a_source_that_cannot_keep_up_is_reported(tmp_path):
    config = RecordConfig(source="test", out=tmp_path / "c", duration_s=0.3, min_free_bytes=0, status=False)
    result = run(config, source=TimedSource(delay_s=0, rate=0.2))  # 0.2 s of events per second: 1.5 s for 0.3 s
    assert result.behind_s > 1.0
    assert "fell" in result.lag_warning and "behind real time" in result.lag_warning


class BusyRecorderSource(LiveSource):
    """A camera stream as a recorder finds it that was busy for ``busy_s`` after its first batch (its first write
    loads a numba kernel: seconds on a loaded machine): 10 ms of events, then everything that waited meanwhile at
    once, then heartbeats."""

    def __init__(self, busy_s: float, waiting_batches: int) -> None:
        self.busy_s, self.waiting_batches = busy_s, waiting_batches
        self.sensor, self.metadata = SensorSize(32, 48), {"kind": "test"}

    def __iter__(self):
        for k in range(1 + self.waiting_batches):
            batch = np.zeros(10, dtype=EVENT_DTYPE)
            batch["t"] = 10_000 * k + 1_000 * np.arange(10)
            yield batch
            if k == 0:
                time.sleep(self.busy_s)
        while True:
            time.sleep(0.01)
            yield np.empty(0, dtype=EVENT_DTYPE)


def test_events_that_waited_while_the_recorder_was_busy_are_recorded_up_to_the_duration(tmp_path):
    """The wall clock ran past --duration while the recorder was busy, but the source's events of that time were
    waiting: they are recorded (200 of a DV stream's 15,000 events were, when the wall clock decided)."""
    config = RecordConfig(source="test", out=tmp_path / "c", duration_s=1.0, min_free_bytes=0, status=False)
    result = run(config, source=BusyRecorderSource(busy_s=1.5, waiting_batches=200))
    events = session_events(tmp_path / "c", result.name)
    assert result.stop_reason == "duration"
    assert events.size == 1000 and events["t"][-1] == 999_000  # all of the first second, nothing after it


def test_a_camera_whose_scene_went_still_stops_at_the_duration_by_the_wall_clock(tmp_path, events_factory):
    """Heartbeats and no events after the first: the wall clock ends the recording (else it would never end)."""
    config = RecordConfig(source="test", out=tmp_path / "c", duration_s=0.5, min_free_bytes=0, status=False)
    result = run(config, source=ArraySource([events_factory(100)], SensorSize(32, 48), endless=True))
    assert result.stop_reason == "duration" and result.stored == 100


def test_quiet_source_is_still_committed_within_a_second(tmp_path, events_factory):
    out = tmp_path / "corpus"
    stop = threading.Event()
    source = ArraySource([events_factory(500)], SensorSize(32, 48), endless=True)
    config = RecordConfig(source="test", out=out, flush_interval_s=0.2, min_free_bytes=0)
    worker = threading.Thread(target=run, args=(config,), kwargs={"source": source, "stop": stop})
    worker.start()
    try:
        wait_for_events(out, 500, timeout=2.0)  # no append after the first batch: the heartbeat commit did it
    finally:
        stop.set()
        worker.join()


def test_segments_rotate_within_one_session(tmp_path):
    out = tmp_path / "corpus"
    config = RecordConfig(source="sim", out=out, duration_s=1.3, segment_minutes=0.4 / 60, min_free_bytes=0)
    result = run(config, source=SimulatorSource(SIM, batch_us=10_000))
    recs = Corpus(out).recordings
    assert result.segments == len(recs) >= 3
    assert {r.session for r in recs} == {result.name}
    assert [r.segment for r in recs] == list(range(len(recs)))
    assert len({r.shard for r in recs}) == len(recs)
    events = session_events(out, result.name)
    assert events.size == result.stored == result.events
    assert_simulator_prefix(events, SIM)


def test_a_camera_unplugged_mid_recording_continues_the_same_session(tmp_path, events_factory):
    first = clock_batches(events_factory, [1, 2])
    second = clock_batches(events_factory, [3, 4], t0=0)
    source = CameraSource(backend=FakeRig({"DXB042": [first, second]}, away_polls=5), retry_interval_s=0.01)
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    result = run(RecordConfig(source="camera", out=tmp_path / "c", min_free_bytes=0), source=source, stop=stop)
    assert result.reconnects == 1 and result.stored == 2000 and result.segments == 1
    events = session_events(tmp_path / "c", result.name)
    validate_events(events)
    np.testing.assert_array_equal(events[["x", "y", "p"]], np.concatenate(first + second)[["x", "y", "p"]])
    assert Corpus(tmp_path / "c").recordings[0].metadata["serial"] == "DXB042"


def test_mem_record_shows_its_progress_in_a_log_too(tmp_path):
    """On a terminal a live line; piped or written to a log, a plain line every few seconds (it showed nothing)."""
    proc = child("record", "--source", "sim", "--out", str(tmp_path / "c"), "--duration", "7")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    progress = [line for line in stderr.splitlines() if line.startswith("recording sim-")]
    assert progress, stderr
    seconds, of, events = re.fullmatch(
        r"recording sim-\S+: (\d+\.\d) of (\d+) s  ([\d,]+) events .* MB", progress[0]
    ).groups()
    assert 0 < float(seconds) < 7 and of == "7" and int(events.replace(",", "")) > 0
    assert "stopped: duration" in stdout


def test_no_camera_through_the_cli_is_one_clear_line(tmp_path):
    proc = child("record", "--source", "camera", "--out", str(tmp_path / "c"))
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "no event camera found" in stderr
    assert "Traceback" not in stderr and "IndexError" not in stderr


def test_an_out_that_is_a_file_is_one_clear_line_from_the_cli(tmp_path):
    (tmp_path / "taken").write_text("a file, not a corpus")
    proc = child("record", "--source", "sim", "--out", str(tmp_path / "taken"), "--duration", "1")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert stderr.strip() == f"error: {tmp_path / 'taken'}: exists and is not a directory, so it cannot hold a corpus"


def test_an_out_path_too_long_for_the_system_is_one_line(tmp_path):
    out = tmp_path.joinpath(*["d" * 200] * 21)  # past PATH_MAX (4096)
    with pytest.raises(CorpusError, match=r"d/?: cannot hold a corpus \(File name too long\)"):
        run(RecordConfig(source="sim", out=out, duration_s=1))


# ---------------------------------------------------------------------------------------------- full disk


def fast_random_source(events_factory, n_batches: int = 400) -> ArraySource:
    sensor = SensorSize(480, 640)
    return ArraySource([events_factory(50_000, sensor, seed=k, t0=k * 10**7) for k in range(n_batches)], sensor)


def test_recording_stops_before_the_disk_fills(tmp_path, events_factory, small_disk):
    out = tmp_path / "corpus"
    small_disk(out, 60_000_000)
    source = fast_random_source(events_factory)
    config = RecordConfig(source="test", out=out, flush_interval_s=0.05, min_free_bytes=20_000_000)
    result = run(config, source=source)
    assert result.stop_reason == "disk full" and not result.ok
    assert "min_free_bytes" in result.error
    assert 0 < result.stored < result.events <= 400 * 50_000
    events = session_events(out, result.name)
    np.testing.assert_array_equal(events, np.concatenate(source.batches)[: events.size])


def test_a_small_disk_keeps_the_events_that_fit(tmp_path, events_factory, small_disk):
    out = tmp_path / "corpus"
    small_disk(out, 18_000_000)  # the writer's ballast must not take most of it
    sensor = SensorSize(480, 640)
    # 6 M events: more than 18 MB hold however well they compress
    source = ArraySource([events_factory(500_000, sensor, seed=k, t0=k * 10**8) for k in range(12)], sensor)
    result = run(RecordConfig(source="test", out=out, flush_interval_s=0.05, min_free_bytes=0), source=source)
    assert result.stop_reason == "disk full"
    assert result.stored >= 500_000
    events = session_events(out, result.name)
    np.testing.assert_array_equal(events, np.concatenate(source.batches)[: events.size])


@pytest.fixture
def small_filesystem(tmp_path):
    """A 48 MB tmpfs (needs root); skipped only where mounting is not permitted and CI is not set."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a small tmpfs: {done.stderr!r}")
        pytest.skip(f"mounting a small tmpfs is not permitted here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_recording_on_a_really_full_filesystem_keeps_what_was_committed(small_filesystem, events_factory):
    out = small_filesystem / "corpus"
    source = fast_random_source(events_factory)
    result = run(RecordConfig(source="test", out=out, flush_interval_s=0.05, min_free_bytes=0), source=source)
    assert result.stop_reason == "disk full"
    assert str(out) in result.error
    events = session_events(out, result.name)
    assert 0 < events.size == result.stored < result.events
    np.testing.assert_array_equal(events, np.concatenate(source.batches)[: events.size])


# ---------------------------------------------------------------------------------------------- --publish


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_normalize_address():
    assert normalize_address("5557") == "tcp://127.0.0.1:5557"
    assert normalize_address("0.0.0.0:5557") == "tcp://0.0.0.0:5557"
    assert normalize_address("tcp://127.0.0.1:9") == "tcp://127.0.0.1:9"
    with pytest.raises(RecorderError, match="publish address"):
        normalize_address("localhost:http")


def test_publish_sends_the_recorded_events_to_a_subscriber(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"events")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.connect(address)
    out = tmp_path / "corpus"
    config = RecordConfig(source="sim", out=out, duration_s=1.5, publish=address, min_free_bytes=0)
    holder = {}
    worker = threading.Thread(target=lambda: holder.update(result=run(config, source=SimulatorSource(SIM))))
    worker.start()
    received = []
    try:
        while len(received) < 20:
            received.append(decode(sub.recv_multipart()))
    finally:
        worker.join()
        sub.close()
    result = holder["result"]
    assert result.published >= len(received) and result.publish_dropped == 0
    stored = session_events(out, result.name)
    seqs = [m.seq for m in received]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # nothing lost once subscribed
    batches = [decode_events(m) for m in received]
    assert all(sensor == SIM.sensor for _, sensor in batches)
    got = np.concatenate([events for events, _ in batches])
    start = int(np.searchsorted(stored["t"], got["t"][0]))
    np.testing.assert_array_equal(got, stored[start : start + got.size])


FROZEN_SUBSCRIBER = """
import sys, zmq
sub = zmq.Context().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(sys.argv[1])
sub.recv_multipart()
print("subscribed", flush=True)
sub.recv_multipart()
"""


# The publisher runs in its own process: libzmq reports some failures by aborting, which must fail this test, not
# take pytest down with it. Each round freezes a subscriber mid-stream, publishes big batches (drops, never waits),
# closes the publisher and only then kills the subscriber - the order in which a zero linger made libzmq abort.
FROZEN_PUBLISHER = """
import json, os, signal, subprocess, sys, threading, time
import numpy as np
from mem_core.events import EVENT_DTYPE, SensorSize
from recorders.publish import EventPublisher

subscriber_code, address, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
sensor = SensorSize(480, 640)
small, big = np.zeros(10, EVENT_DTYPE), np.zeros(200_000, EVENT_DTYPE)
for _ in range(rounds):
    child = subprocess.Popen([sys.executable, "-c", subscriber_code, address], stdout=subprocess.PIPE, text=True)
    publisher = EventPublisher(address, sndhwm=2)
    ready = threading.Thread(target=child.stdout.readline)
    ready.start()
    while ready.is_alive():  # until the subscriber has received a message
        publisher.publish(small, sensor)
        ready.join(0.05)
    os.kill(child.pid, signal.SIGSTOP)  # frozen: reads nothing more, its TCP buffers fill up
    start = time.monotonic()
    results = [publisher.publish(big, sensor) for _ in range(200)]
    elapsed = time.monotonic() - start
    publisher.close()
    child.kill()
    child.wait()
    time.sleep(0.3)  # the I/O thread tears the dead connection down now
    print(json.dumps(dict(failed=results.count(False), dropped=publisher.dropped, sent=publisher.sent,
                          seq=publisher.seq, elapsed=elapsed)), flush=True)
"""


def test_publish_never_blocks_on_a_frozen_subscriber_and_survives_its_death():
    address = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", FROZEN_PUBLISHER, FROZEN_SUBSCRIBER, address, "3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"publisher process died (rc {done.returncode}): {done.stderr[-2000:]}"
    rounds = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rounds) == 3
    for r in rounds:
        assert r["failed"] == r["dropped"] > 0
        assert r["seq"] == r["sent"] + r["dropped"]
        assert r["elapsed"] < 30


def test_publish_address_in_use_is_a_clear_error():
    address = f"tcp://127.0.0.1:{free_port()}"
    with EventPublisher(address), pytest.raises(RecorderError, match=f"cannot publish on {address}"):
        EventPublisher(address)


def publish_until(publisher: EventPublisher, sensor: SensorSize, t0: int, done) -> list[np.ndarray]:
    """Publish batches of 100 events (times from ``t0`` on) until ``done()``; the batches published."""
    sent, deadline = [], time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, "the recording never took the published events"
        batch = np.zeros(100, EVENT_DTYPE)
        batch["t"] = t0 + 100 * len(sent) + np.arange(100)
        batch["x"], batch["y"] = np.arange(100) % sensor.width, np.arange(100) % sensor.height
        publisher.publish(batch, sensor)
        sent.append(batch)
        time.sleep(0.01)  # a publisher's pace, not a wait for the recorder
    return sent


def committed_sessions(root: Path) -> dict[str, int]:
    """Events committed per session (none when nothing is committed yet)."""
    with contextlib.suppress(CorpusError):
        sessions: dict[str, int] = {}
        for r in load_manifest(root)["recordings"]:
            sessions[r["session"]] = sessions.get(r["session"], 0) + r["n_events"]
        return sessions
    return {}


def test_a_publisher_restarting_with_its_clock_back_goes_on_as_a_new_session(tmp_path, capsys):
    """`mem record --source tcp://...` died with "events go back in time" when the publisher restarted; everything
    after was lost. The recording goes on as a second session, said in one line."""
    address, sensor, out = f"tcp://127.0.0.1:{free_port()}", SensorSize(100, 120), tmp_path / "c"
    config = RecordConfig(source=address, out=out, flush_interval_s=0, min_free_bytes=0, status=False)
    stop, holder = threading.Event(), {}
    worker = threading.Thread(
        target=lambda: holder.update(result=run(config, source=ZmqEventSource(address), stop=stop))
    )
    context = zmq.Context()  # the first publisher's own: terminating it lets go of the port
    with EventPublisher(address, context=context) as first:
        worker.start()
        publish_until(first, sensor, 5_000_000, lambda: committed_sessions(out))
    context.term()
    with EventPublisher(address) as restarted:  # its clock starts at 0 again
        publish_until(restarted, sensor, 0, lambda: len(committed_sessions(out)) == 2 or not worker.is_alive())
    stop.set()
    worker.join(timeout=60)
    result = holder["result"]
    assert result.ok and len(result.sessions) == 2 and result.stored == result.events
    before, after = (session_events(out, name) for name in result.sessions)
    validate_events(before, sensor)
    validate_events(after, sensor)
    assert before["t"].min() >= 5_000_000 > after["t"].max()
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "started over" in line]
    assert "clock went back" in line and line.endswith(f"goes on as session {result.sessions[1]}")


def test_a_source_whose_sensor_changes_goes_on_as_a_new_session_on_that_sensor(tmp_path, events_factory):
    small, large = SensorSize(32, 48), SensorSize(64, 80)
    batches = [events_factory(500, small, seed=1, t0=0), events_factory(500, large, seed=2, t0=10**6)]

    class Restarted(ArraySource):
        def __iter__(self):
            yield batches[0]
            self.sensor = large  # a restarted publisher on another camera, its clock going on
            yield batches[1]

    source = Restarted([], small)
    result = run(RecordConfig(source="tcp://x", out=tmp_path / "c", min_free_bytes=0, status=False), source=source)
    assert result.ok and len(result.sessions) == 2
    corpus = Corpus(tmp_path / "c")
    assert [r.sensor for r in corpus.recordings] == [small, large]
    for batch, name in zip(batches, result.sessions, strict=True):
        np.testing.assert_array_equal(session_events(tmp_path / "c", name), batch)
