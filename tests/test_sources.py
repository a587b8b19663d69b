"""Live sources: the simulated camera, file and corpus replay, and the camera's discovery, serial choice and
reconnection."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from recorders_fakes import FakeRig, clock_batches

from mem_core.corpus import Corpus, CorpusWriter
from mem_core.events import EVENT_DTYPE, SensorSize, validate_events
from mem_core.io import EventFileError, read_events, write_events
from mem_core.representation import event_histogram
from mem_core.simulator import EventSimulator, SimulatorConfig
from recorders import corpus_replay, record, zmq_source
from recorders.base import Pacer, RecorderError
from recorders.camera import CameraSource, DvCameraBackend, NoCameraError
from recorders.config import RecordConfig
from recorders.corpus_replay import CorpusReplaySource
from recorders.dv_network import DvNetworkSource
from recorders.publish import EventPublisher
from recorders.replay import ReplaySource
from recorders.simulated import SimulatorSource
from recorders.sources import open_source
from recorders.zmq_source import ZmqEventSource

SIM = SimulatorConfig(sensor=SensorSize(64, 80), n_objects=1, size_range=(0.2, 0.25), noise_rate_hz=0.2, seed=3)


def mem_record(source: str, out: Path, *options: str) -> Corpus:
    """``mem record --source SOURCE --out OUT OPTIONS`` as a user starts it; the corpus it wrote, opened."""
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "record", "--source", source, "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return Corpus(out)


def concat(batches: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(batches) if batches else np.empty(0, dtype=EVENT_DTYPE)


def assert_monotonic(batches: list[np.ndarray]) -> None:
    """Every batch is valid and time never goes back from one batch to the next."""
    events = concat(batches)
    validate_events(events)


# ---------------------------------------------------------------------------------------------- simulator


def test_simulator_source_delivers_the_simulators_events():
    source = SimulatorSource(SIM, batch_us=5_000, speed=0, duration_us=40_000)
    batches = list(source)
    expected = EventSimulator(SIM).simulate(40_000)
    assert source.sensor == SIM.sensor
    assert source.metadata["kind"] == "sim" and source.metadata["height"] == 64 and source.metadata["width"] == 80
    assert len(batches) == 8
    assert_monotonic(batches)
    np.testing.assert_array_equal(concat(batches), expected)


def test_simulator_events_rendered_as_a_histogram_show_the_object():
    source = SimulatorSource(SIM, object_classes=[0], speed=0, duration_us=20_000)
    events = concat(list(source))
    counts = event_histogram(events, source.sensor).sum(axis=0)  # (H, W) events per pixel
    ys, xs = np.nonzero(source.simulator.label_mask())
    margin = 8  # the object moves at most ~5 px in 20 ms
    box = np.zeros(counts.shape, dtype=bool)
    box[max(ys.min() - margin, 0) : ys.max() + margin + 1, max(xs.min() - margin, 0) : xs.max() + margin + 1] = True
    assert box.mean() < 0.6
    assert counts[box].sum() > 0.9 * counts.sum()
    assert box[np.unravel_index(np.argmax(counts), counts.shape)]


def test_simulator_source_runs_in_real_time_when_asked():
    source = SimulatorSource(SIM, batch_us=10_000, speed=1.0, duration_us=200_000)
    start = time.monotonic()
    n = sum(1 for _ in source)
    assert n == 20
    assert time.monotonic() - start >= 0.19


def test_a_paused_simulator_holds_its_time_and_a_step_delivers_the_next_window_of_the_same_stream():
    source = SimulatorSource(SIM, batch_us=5_000, speed=0, duration_us=60_000)
    stream = iter(source)
    first = next(stream)
    source.pause()
    assert [next(stream).size for _ in range(3)] == [0, 0, 0]  # heartbeats: simulated time stands still
    assert source.simulator.time_us == 5_000
    assert source.step(events=10**6, span_us=20_000) == 25_000
    stepped = next(stream)
    assert next(stream).size == 0  # still paused after the step
    source.resume()
    rest = concat(list(stream))
    assert_monotonic([first, stepped, rest])
    expected = EventSimulator(SIM).simulate(60_000)  # pausing and stepping change nothing in what is recorded
    np.testing.assert_array_equal(concat([first, stepped, rest]), expected)
    assert int(stepped["t"][0]) >= 5_000 and int(stepped["t"][-1]) < 25_000


class FakeClock:
    """``time.monotonic`` / ``time.sleep`` stand-ins: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now, self.slept = 100.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.parametrize("speed", [1.0, 4.0])
def test_pacer_releases_event_time_at_speed_times_wall_time(monkeypatch, speed):
    clock = FakeClock()
    monkeypatch.setattr("recorders.base.time", clock)
    pacer = Pacer(speed)
    pacer.wait(1_000_000)  # anchors: event time 1 s happens now
    pacer.wait(1_500_000)
    clock.now += 0.05  # work that took 50 ms counts towards the next wait
    pacer.wait(2_000_000)
    assert clock.slept == pytest.approx([0.5 / speed, 0.5 / speed - 0.05])


def test_pacer_at_speed_zero_never_waits(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr("recorders.base.time", clock)
    pacer = Pacer(0)
    for t in range(0, 10_000_000, 1_000_000):
        pacer.wait(t)
    assert clock.slept == []
    with pytest.raises(ValueError, match="speed"):
        Pacer(-1)


def test_open_source_rejects_what_it_does_not_know(tmp_path):
    with pytest.raises(RecorderError, match=r"missing\.dat': no such file or folder$"):
        open_source(str(tmp_path / "missing.dat"))
    with pytest.raises(RecorderError, match="'camra' is not camera"):
        open_source("camra")
    with pytest.raises(RecorderError, match="simulator preset"):
        open_source("sim:nope")
    assert isinstance(open_source("sim", speed=0), SimulatorSource)


def test_a_source_file_that_is_a_fifo_or_a_device_is_refused_by_name(tmp_path):
    os.mkfifo(tmp_path / "pipe.dat")
    (tmp_path / "zero.dat").symlink_to("/dev/zero")
    with pytest.raises(EventFileError, match=r"pipe\.dat: not a regular file \(a FIFO\)"):
        open_source(str(tmp_path / "pipe.dat"))
    with pytest.raises(EventFileError, match=r"zero\.dat: not a regular file \(a character device\)"):
        open_source(str(tmp_path / "zero.dat"))


# ---------------------------------------------------------------------------------------------- camera


def take_events(source, n_events: int, max_batches: int = 10_000) -> list[np.ndarray]:
    batches = []
    for batch in itertools.islice(source, max_batches):
        batches.append(batch)
        if sum(b.size for b in batches) >= n_events:
            break
    return batches


def test_no_camera_is_a_clear_error_not_an_index_error():
    with pytest.raises(NoCameraError, match="no event camera found"):
        CameraSource(backend=FakeRig({}))


def test_dv_processing_backend_reports_no_camera_on_this_machine():
    backend = DvCameraBackend()
    if backend.discover():
        pytest.skip("an event camera is connected")
    with pytest.raises(NoCameraError, match="no event camera found"):
        CameraSource(backend=backend)


def test_camera_is_chosen_by_serial(events_factory):
    rig = FakeRig({"DXA001": [clock_batches(events_factory, [1])], "DXA002": [clock_batches(events_factory, [2])]})
    source = CameraSource("DXA002", backend=rig)
    assert source.metadata == {"kind": "camera", "model": "DVXPLORER", "serial": "DXA002", "height": 32, "width": 48}
    np.testing.assert_array_equal(take_events(source, 500)[-1], clock_batches(events_factory, [2])[0])
    with pytest.raises(NoCameraError, match=r"serial 'DXA009'.*DXA001.*DXA002"):
        CameraSource("DXA009", backend=rig)


def test_unplugged_camera_reconnects_and_time_keeps_going(events_factory):
    first = clock_batches(events_factory, [1, 2, 3])
    second = clock_batches(events_factory, [4, 5], t0=0)  # a re-plugged camera restarts its clock
    rig = FakeRig({"DXA001": [first, second]}, away_polls=3)
    source = CameraSource(backend=rig, retry_interval_s=0.001)
    batches = take_events(source, 2500)
    events = concat(batches)
    assert source.reconnects == 1 and source.connected
    assert rig.opened[0].closed
    assert events.size == 2500
    assert_monotonic(batches)
    assert any(b.size == 0 for b in batches)  # heartbeats while the camera was away
    before, after = concat(first), concat(second)
    np.testing.assert_array_equal(events[:1500], before)
    for field in ("x", "y", "p"):
        np.testing.assert_array_equal(events[1500:][field], after[field])
    np.testing.assert_array_equal(np.diff(events[1500:]["t"]), np.diff(after["t"]))
    source.close()


def test_camera_that_does_not_come_back_fails_after_the_timeout(events_factory):
    rig = FakeRig({"DXA001": [clock_batches(events_factory, [1]), []]}, away_polls=10**9)
    source = CameraSource(backend=rig, retry_interval_s=0.001, reconnect_timeout_s=0.05)
    with pytest.raises(RecorderError, match="DXA001 disconnected and was not back"):
        for _ in source:
            pass
    no_retry = CameraSource(backend=FakeRig({"DXA001": [clock_batches(events_factory, [1]), []]}), reconnect=False)
    with pytest.raises(RecorderError, match="DXA001 disconnected"):
        for _ in no_retry:
            pass


# ---------------------------------------------------------------------------------------------- file replay


@pytest.fixture
def recording(tmp_path, events_factory):
    """A .dat file of 2000 events over ~0.2 s and its events."""
    path = tmp_path / "rec.dat"
    write_events(path, events_factory(2000, seed=7, t0=5_000), SensorSize(32, 48))
    return path, read_events(path).events


def test_replay_as_fast_as_possible_delivers_the_file(recording):
    path, events = recording
    source = ReplaySource(path, speed=0, batch_us=20_000)
    batches = list(source)
    assert source.sensor == SensorSize(32, 48) and source.metadata["path"] == str(path.resolve())
    assert all(int(b["t"][-1]) - int(b["t"][0]) < 20_000 for b in batches)
    np.testing.assert_array_equal(concat(batches), events)


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_replay_takes_the_recordings_duration_divided_by_speed(recording, speed):
    path, events = recording
    span = (int(events["t"][-1]) - int(events["t"][0])) / 1e6
    start = time.monotonic()
    n = sum(b.size for b in ReplaySource(path, speed=speed, batch_us=10_000))
    assert n == events.size
    assert time.monotonic() - start >= 0.9 * span / speed


def test_looped_replay_repeats_the_file_with_time_moving_on(recording):
    path, events = recording
    batches = take_events(ReplaySource(path, speed=0, loop=True, batch_us=50_000), 3 * events.size)
    looped = concat(batches)[: 3 * events.size]
    validate_events(looped)
    for k in range(3):
        part = looped[k * events.size : (k + 1) * events.size]
        np.testing.assert_array_equal(part[["x", "y", "p"]], events[["x", "y", "p"]])
        np.testing.assert_array_equal(np.diff(part["t"]), np.diff(events["t"]))


def test_replay_pause_and_seek(recording):
    path, events = recording
    source = ReplaySource(path, speed=0, batch_us=10_000)
    stream = iter(source)
    first = next(stream)
    source.pause()
    assert next(stream).size == 0  # paused: heartbeats only
    source.seek(0)
    source.resume()
    rest = concat(list(stream))
    validate_events(concat([first, rest]))
    np.testing.assert_array_equal(rest[["x", "y", "p"]], events[["x", "y", "p"]])  # replayed from the start


def test_replay_stays_responsive_through_a_quiet_stretch(tmp_path, events_factory):
    path = tmp_path / "gap.dat"
    burst = events_factory(100, seed=1)  # ~10 ms of events, then 0.5 s of silence, then another burst
    write_events(path, np.concatenate([burst, events_factory(100, seed=2, t0=510_000)]), SensorSize(32, 48))
    batches = list(ReplaySource(path, speed=1.0, batch_us=10_000))
    sizes = [b.size for b in batches]
    assert sum(sizes) == 200
    first, last = next(i for i, n in enumerate(sizes) if n), max(i for i, n in enumerate(sizes) if n)
    assert sizes[first:last].count(0) >= 5  # heartbeats while the file is quiet


def test_replay_of_a_bad_file_names_it(tmp_path):
    bad = tmp_path / "garbage.dat"
    bad.write_bytes(b"\x00\x01garbage" * 7)
    with pytest.raises(EventFileError, match=r"garbage\.dat"):
        ReplaySource(bad)


def test_replay_of_times_spanning_int64_is_refused_on_opening(tmp_path):
    events = np.zeros(2, dtype=[("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "?")])
    events["t"] = [-(2**63), 2**63 - 1]
    np.savez(tmp_path / "span.npz", event_data=events)
    with pytest.raises(EventFileError, match=r"span\.npz: corrupt: t spans"):
        open_source(str(tmp_path / "span.npz"))


def test_looped_replay_stops_with_one_line_before_time_leaves_int64(tmp_path):
    events = np.zeros(2, dtype=EVENT_DTYPE)
    events["t"] = [-(2**61), 2**61]  # the widest span a file may hold: each loop moves time on by 2^62 us
    source = ReplaySource(write_events(tmp_path / "wide.npz", events, SensorSize(32, 48)), speed=0, loop=True)
    stream = iter(source)
    np.testing.assert_array_equal(np.concatenate([next(stream), next(stream)])["t"], events["t"])
    with pytest.raises(RecorderError, match=r"wide\.npz: replayed time would reach \d+ us, beyond"):
        for _ in range(10):
            next(stream)


# ---------------------------------------------------------------------------------------------- corpus replay

WIDE = SensorSize(40, 64)


@pytest.fixture
def corpus(tmp_path, events_factory):
    """A corpus of recordings ``a`` (3000 events from t=1000 us), ``b`` (2000 events from t=0: earlier than ``a``'s),
    ``empty`` (no events) and ``c:d`` (1000 events), written by the product's writer; and their events by name."""
    root = tmp_path / "lab"
    recordings = {
        "a": events_factory(3000, seed=1, t0=1000),
        "b": events_factory(2000, seed=2),
        "empty": events_factory(0),
        "c:d": events_factory(1000, seed=3, t0=40_000),
    }
    with CorpusWriter(root) as writer:
        for name, events in recordings.items():
            writer.add_recording(name, events, SensorSize(32, 48))
    return root, recordings


def replay_all(source) -> tuple[np.ndarray, list[str]]:
    """Every event of a non-looping replay, and the recording its metadata named with each batch."""
    batches, serials = [], []
    for batch in source:
        if batch.size:
            batches.append(batch)
            serials.append(source.metadata["serial"])
    return concat(batches), serials


@pytest.mark.parametrize("block", [None, 700])  # 700: batches start and end at block boundaries as well
def test_corpus_replay_delivers_every_recording_in_order_with_time_moving_on(corpus, block, monkeypatch):
    root, recordings = corpus
    if block is not None:
        monkeypatch.setattr(corpus_replay, "BLOCK_EVENTS", block)
    source = open_source(str(root), speed=0, batch_us=20_000)
    assert isinstance(source, CorpusReplaySource) and source.metadata["kind"] == "corpus"
    events, serials = replay_all(source)
    validate_events(events)  # time sorted across recordings, though b starts before a ends
    played = [recordings[name] for name in ("a", "b", "c:d")]
    np.testing.assert_array_equal(events[["x", "y", "p"]], concat(played)[["x", "y", "p"]])
    starts = np.cumsum([0] + [r.size for r in played])
    for k, r in enumerate(played):
        np.testing.assert_array_equal(np.diff(events["t"][starts[k] : starts[k + 1]]), np.diff(r["t"]))
    assert int(events["t"][3000]) == int(events["t"][2999]) + 1  # b begins 1 us after a ends
    assert list(dict.fromkeys(serials)) == ["lab/a", "lab/b", "lab/c:d"]  # the header names the recording played


def test_corpus_replay_of_one_recording_by_name_or_index_at_its_own_sensor(tmp_path, events_factory):
    root = tmp_path / "mixed"
    small, wide = events_factory(500, seed=4), events_factory(800, WIDE, seed=5, t0=7)
    with CorpusWriter(root) as writer:
        writer.add_recording("small", small, SensorSize(32, 48))
        writer.add_recording("wide", wide, WIDE)
    for spec in (f"{root}:wide", f"{root}:1"):
        source = open_source(spec, speed=0)
        assert source.sensor == WIDE and source.metadata["serial"] == "mixed/wide"
        assert (source.metadata["height"], source.metadata["width"]) == (40, 64)
        np.testing.assert_array_equal(replay_all(source)[0], wide)  # its own times too
    source = open_source(str(root), speed=0)  # all of them: each on its own sensor
    sensors = [source.sensor for batch in source if batch.size]
    assert sensors[0] == SensorSize(32, 48) and sensors[-1] == WIDE


def test_corpus_replay_of_a_session_plays_its_segments_in_order(tmp_path, events_factory):
    root, events = tmp_path / "sessions", events_factory(3000, seed=6)
    with CorpusWriter(root) as writer:
        writer.begin_recording("walk", SensorSize(32, 48))
        for part in np.array_split(events, 3):
            writer.append(part)
            writer.rotate()  # segments walk, walk/1, walk/2, and walk/3 without events
        writer.end_recording()
    assert len(Corpus(root)) == 4
    np.testing.assert_array_equal(replay_all(open_source(f"{root}:walk", speed=0))[0], events)
    assert replay_all(open_source(f"{root}:walk/2", speed=0))[0].size == 1000


def test_an_unknown_or_empty_recording_is_one_line_naming_the_corpus_and_its_recordings(corpus, tmp_path):
    root, _ = corpus
    with pytest.raises(
        RecorderError,
        match=r"lab: no recording 'nope' \(a name or an index 0\.\.3\); it has "
        r"recordings a, b, empty, c:d$",
    ):
        open_source(f"{root}:nope")
    with pytest.raises(RecorderError, match="no recording '4'"):
        open_source(f"{root}:4")
    with pytest.raises(RecorderError, match="recording 'empty' holds no events"):
        open_source(f"{root}:empty")
    (tmp_path / "folder").mkdir()
    with pytest.raises(RecorderError, match="is a folder but no corpus"):
        open_source(str(tmp_path / "folder"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{")
    with pytest.raises(RecorderError, match=r"broken/manifest\.json: corrupt corpus manifest"):
        open_source(str(tmp_path / "broken"))


def test_looped_corpus_replay_starts_over_with_time_moving_on_and_seeks_clip(corpus):
    root, recordings = corpus
    total = sum(r.size for r in recordings.values())
    source = open_source(str(root), speed=0, loop=True, batch_us=20_000)
    looped = concat(take_events(source, 2 * total))[: 2 * total]
    validate_events(looped)
    np.testing.assert_array_equal(looped[total:][["x", "y", "p"]], looped[:total][["x", "y", "p"]])
    stream = iter(source)
    next(stream)
    source.seek(10**12)  # past the end: the last event
    assert source.metadata["serial"] == "lab/c:d"
    last = next(stream)
    np.testing.assert_array_equal(last[["x", "y", "p"]], recordings["c:d"][-1:][["x", "y", "p"]])
    source.seek(-5)  # before the start: the first event, after the last delivered
    first = next(stream)
    assert source.metadata["serial"] == "lab/a" and first["t"][0] > last["t"][-1]
    np.testing.assert_array_equal(first[["x", "y", "p"]], recordings["a"][: first.size][["x", "y", "p"]])


@pytest.mark.parametrize("kind", ["file", "corpus"])
def test_a_seek_while_paused_delivers_the_window_ending_there_and_a_step_the_next(kind, corpus, recording):
    if kind == "file":
        path, events = recording
        source, t0 = ReplaySource(path, speed=0, batch_us=10_000), int(events["t"][0])
    else:
        root, recordings = corpus
        source, events = open_source(f"{root}:b", speed=0, batch_us=10_000), recordings["b"]
        t0 = int(events["t"][0])
    stream = iter(source)
    before = next(stream)
    source.pause()
    assert next(stream).size == 0
    target = int(events["t"][1200]) - t0  # the position of event 1200
    source.seek(target)
    assert source.preview(300, None) == int(events["t"][900]) - t0  # where the window's first event lies
    window = next(stream)
    np.testing.assert_array_equal(window[["x", "y", "p"]], events[900:1200][["x", "y", "p"]])
    assert next(stream).size == 0  # still paused
    source.step(100, None)
    step = next(stream)
    np.testing.assert_array_equal(step[["x", "y", "p"]], events[1200:1300][["x", "y", "p"]])
    span = int(events["t"][1350]) - int(events["t"][1300])
    source.step(1000, span)  # a time cap: the window spans less than span_us
    np.testing.assert_array_equal(next(stream)[["x", "y", "p"]], events[1300:1350][["x", "y", "p"]])
    source.resume()
    rest = concat(list(stream))
    validate_events(concat([before, window, step, rest]))
    np.testing.assert_array_equal(rest[["x", "y", "p"]], events[1350:][["x", "y", "p"]])  # on after the step


def test_a_seek_to_the_start_while_paused_delivers_the_first_window(corpus):
    root, recordings = corpus
    source = open_source(str(root), speed=0)
    stream = iter(source)
    next(stream)
    source.pause()
    b_starts = int(recordings["a"]["t"][-1]) - int(recordings["a"]["t"][0]) + 1  # b's position on the timeline
    source.seek(b_starts)
    assert source.metadata["serial"] == "lab/b"
    assert source.preview(400, None) == b_starts  # nothing of b before: the window starts there
    np.testing.assert_array_equal(next(stream)[["x", "y", "p"]], recordings["b"][:400][["x", "y", "p"]])
    source.resume()
    assert next(stream)[0][["x", "y", "p"]] == recordings["b"][400][["x", "y", "p"]]  # playing on after the window


def test_mem_record_records_a_replayed_corpus_and_refuses_itself_and_mixed_sensors(corpus, tmp_path, events_factory):
    root, recordings = corpus
    with mem_record(str(root), tmp_path / "copy", "--speed", "0") as recorded:
        (info,) = recorded.recordings
        assert info.metadata["kind"] == "corpus" and info.metadata["source"] == str(root)
        events = recorded.events(0)
    np.testing.assert_array_equal(events[["x", "y", "p"]], concat(list(recordings.values()))[["x", "y", "p"]])
    with pytest.raises(RecorderError, match="cannot record a corpus into itself"):
        record.run(RecordConfig(source=str(root), out=root, speed=0, status=False))
    with CorpusWriter(root) as writer:
        writer.add_recording("wide", events_factory(100, WIDE), WIDE)
    with pytest.raises(RecorderError, match=r"lab: its recordings lie on 2 sensor sizes \(48x32, 64x40\)"):
        record.run(RecordConfig(source=str(root), out=tmp_path / "other", speed=0, status=False))
    assert record.run(RecordConfig(source=f"{root}:wide", out=tmp_path / "other", speed=0, status=False)).stored == 100


# ---------------------------------------------------------------------------------------------- ZMQ events


def test_a_burst_of_large_batches_over_tcp_holds_a_bounded_number_of_bytes(monkeypatch):
    monkeypatch.setattr(zmq_source, "MAX_QUEUED_BYTES", 8 << 20, raising=False)
    address, sensor, n = f"tcp://127.0.0.1:{free_port()}", SensorSize(480, 640), 200_000
    with EventPublisher(address, sndhwm=1000) as publisher:
        source = ZmqEventSource(address)
        stream = iter(source)
        deadline = time.monotonic() + 20
        while not next(stream).size:  # until subscribed: ZMQ drops what is published before
            publisher.publish(np.zeros(1, EVENT_DTYPE), sensor)
            assert time.monotonic() < deadline, "the subscription never arrived"
        burst = [np.zeros(n, EVENT_DTYPE) for _ in range(40)]  # 104 MB, published while the consumer is busy
        for k, batch in enumerate(burst):
            batch["t"] = 10 + k * n + np.arange(n)
            publisher.publish(batch, sensor)
        time.sleep(3)
        received = []
        while (batch := next(stream)).size or not received:
            received.append(batch)
        source.close()
    received = [b for b in received if b.size == n]  # probes sent before the subscription took are left out
    assert sum(b.nbytes for b in received) <= 8 << 20 and source.dropped >= 30
    first = int(received[0]["t"][0] - 10) // n
    for k, batch in enumerate(received):  # the batches kept arrive whole and in order
        np.testing.assert_array_equal(batch, burst[first + k])


# ---------------------------------------------------------------------------------------------- DV network stream

WRITER = Path(__file__).with_name("dv_network_writer_child.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dv_writer(port: int):
    """A real dv-processing NetworkWriter in its own process (as DV would be), killed at the end."""
    child = subprocess.Popen([sys.executable, str(WRITER), str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "listening"
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


def assert_streamed_pattern(events: np.ndarray, offset: int = 0) -> None:
    """The events are exactly those the writer child sends (see its docstring), times shifted by ``offset``."""
    t = events["t"].astype(np.int64) - offset
    k, i = t // 10_000, (t % 10_000) // 100
    assert np.all(t % 100 == 0) and np.all(i < 100)
    np.testing.assert_array_equal(events["x"], (7 * i + k) % 120)
    np.testing.assert_array_equal(events["y"], (3 * i + k) % 100)
    np.testing.assert_array_equal(events["p"], i % 2)


def take(source, n: int, timeout_s: float = 20) -> np.ndarray:
    """Read batches from ``source`` until ``n`` events have arrived."""
    batches, got, deadline = [], 0, time.monotonic() + timeout_s
    for batch in source:
        batches.append(batch.copy())
        got += batch.size
        if got >= n:
            return concat(batches)
        assert time.monotonic() < deadline, f"only {got} of {n} events arrived"
    raise AssertionError("the source ended")


def test_dv_network_stream_delivers_exactly_the_events_sent():
    port = free_port()
    with dv_writer(port), open_source(f"dv+tcp://127.0.0.1:{port}") as source:
        assert source.sensor == SensorSize(100, 120)
        assert source.metadata["kind"] == "dv-network" and source.metadata["model"] == "DVXplorer_test"
        events = take(source, 1000)
    validate_events(events, SensorSize(100, 120))
    assert events["t"][0] == 0  # from the first batch on: nothing lost at the start
    assert_streamed_pattern(events)


def test_dv_network_stream_reconnects_when_the_server_restarts():
    port = free_port()
    with dv_writer(port):
        source = DvNetworkSource(f"dv+tcp://127.0.0.1:{port}", retry_interval_s=0.05)
        stream = iter(source)
        before = take(stream, 500)
    # The server is gone: the source waits (heartbeats), then picks up the restarted server's stream.
    with dv_writer(port):
        after = take(stream, 500)
    source.close()
    assert source.reconnects == 1
    events = np.concatenate([before, after])
    validate_events(events)  # time never goes back, although the new server starts its clock at 0
    assert_streamed_pattern(before)
    assert_streamed_pattern(after, offset=int(after["t"][0]))


def test_dv_network_source_names_the_endpoint_when_nothing_serves_it():
    port = free_port()
    with pytest.raises(NoCameraError, match=f"nothing streams events at dv\\+tcp://127.0.0.1:{port}"):
        open_source(f"dv+tcp://127.0.0.1:{port}")
    for spec in ("dv+tcp://127.0.0.1", "dv+tcp://:5000", "dv+tcp://host:99999"):
        with pytest.raises(RecorderError, match="expected dv\\+tcp://HOST:PORT"):
            open_source(spec)


def test_mem_record_records_a_dv_network_stream(tmp_path):
    port = free_port()
    with dv_writer(port):
        corpus = mem_record(f"dv+tcp://127.0.0.1:{port}", tmp_path / "corpus", "--duration", "1.5")
    with corpus:
        (recording,) = corpus.recordings
        assert recording.metadata["kind"] == "dv-network"
        events = corpus.events(0)
    assert events.size >= 1000  # ~100 events per 10 ms for most of 1.5 s
    assert_streamed_pattern(events)
