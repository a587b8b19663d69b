"""The corpus store: round trips, windows and time slices, segments, crash and full-disk safety, DataLoader use."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mem_core.corpus import Corpus, CorpusError, CorpusFullError, CorpusWriter
from mem_core.corpus import reader as corpus_reader
from mem_core.corpus import writer as corpus_writer
from mem_core.corpus.format import FORMAT_VERSION, load_manifest
from mem_core.events import EVENT_DTYPE, SensorSize, make_events

SENSOR = SensorSize(32, 48)
CHILD = Path(__file__).with_name("corpus_writer_child.py")


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks (and time-index stride) of 64 events, so tiny recordings span many chunks."""
    monkeypatch.setattr(corpus_writer, "CHUNK_EVENTS", 64)


def batches(events: np.ndarray, size: int) -> list[np.ndarray]:
    return [events[i : i + size] for i in range(0, events.size, size)]


def test_samples_round_trip_and_share_one_shard(tmp_path, events_factory):
    samples = [events_factory(n, seed=k) for k, n in enumerate([300, 0, 1234, 57])]
    with CorpusWriter(tmp_path / "c", provenance={"dataset": "synthetic"}) as w:
        for k, ev in enumerate(samples):
            w.add_recording(f"s{k}", ev, SENSOR, label=k % 2, metadata={"file": f"s{k}.dat"})

    c = Corpus(tmp_path / "c")
    assert len(c) == 4 and c.total_events == sum(s.size for s in samples)
    assert len({r.shard for r in c.recordings}) == 1
    for k, (info, ev) in enumerate(zip(c.recordings, samples, strict=True)):
        assert info.name == f"s{k}" and info.label == k % 2 and info.metadata == {"file": f"s{k}.dat"}
        assert info.sensor == SENSOR and info.complete and info.n_events == ev.size
        np.testing.assert_array_equal(c.events(k), ev)
        assert c.events(k).dtype == EVENT_DTYPE
    assert c.recordings[1].t_min is None and c.recordings[0].t_min == int(samples[0]["t"][0])
    assert c.provenance[0]["dataset"] == "synthetic"

    d = json.loads(json.dumps(c.describe()))
    nonempty = [s for s in samples if s.size]
    assert d["recordings"] == 4 and d["events"] == c.total_events
    assert d["t_min"] == min(int(s["t"][0]) for s in nonempty)
    assert d["t_max"] == max(int(s["t"][-1]) for s in nonempty)
    assert d["sensors"] == [{"height": 32, "width": 48, "recordings": 4}]
    assert d["labels"] == {"0": 2, "1": 2}


@pytest.mark.parametrize(("start", "count"), [(0, 10), (0, 5000), (63, 2), (100, 777), (4990, 100), (6000, 5)])
def test_window_reads_exactly_the_requested_events(tmp_path, events_factory, small_chunks, start, count):
    first, live = events_factory(101, seed=1), events_factory(5000, seed=2)
    with CorpusWriter(tmp_path) as w:
        w.add_recording("first", first, SENSOR)  # the live recording starts mid-chunk
        w.begin_recording("live", SENSOR)
        for part in batches(live, 333):
            w.append(part)
    np.testing.assert_array_equal(Corpus(tmp_path).window(1, start, count), live[start : start + count])


def time_slice(corpus: Corpus, i: int, t0: int, t1: int) -> np.ndarray:
    """Events of recording ``i`` with ``t0 <= t < t1``, found with ``first_at`` (coarse index + one chunk read)."""
    lo = corpus.first_at(i, t0)
    return corpus.window(i, lo, max(corpus.first_at(i, t1) - lo, 0))


def test_time_slice_matches_a_full_scan(tmp_path, events_factory, small_chunks):
    first, live = events_factory(101, seed=1), events_factory(5000, seed=2)
    live["t"][1000:1100] = live["t"][1000]  # a run of equal times across chunk boundaries
    with CorpusWriter(tmp_path) as w:
        w.add_recording("first", first, SENSOR)
        w.add_recording("live", live, SENSOR)
    c = Corpus(tmp_path)
    t = live["t"]
    edges = [int(t[0]) - 5, int(t[0]), int(t[1000]), int(t[1000]) + 1, int(t[2500]), int(t[-1]), int(t[-1]) + 1]
    rng = np.random.default_rng(0)
    edges += [int(v) for v in rng.integers(int(t[0]), int(t[-1]), 12)]
    for t0 in edges:
        for t1 in edges:
            expected = live[(t >= t0) & (t < t1)]
            np.testing.assert_array_equal(time_slice(c, 1, t0, t1), expected, err_msg=f"t0={t0}, t1={t1}")


def test_reopen_appends_and_keeps_names_unique(tmp_path, events_factory):
    a, b = events_factory(200, seed=1), events_factory(300, seed=2)
    with CorpusWriter(tmp_path, provenance={"run": 1}) as w:
        w.add_recording("a", a, SENSOR)
    with CorpusWriter(tmp_path, provenance={"run": 2}) as w:
        with pytest.raises(ValueError, match="'a' already exists"):
            w.add_recording("a", b, SENSOR)
        w.add_recording("b", b, SENSOR)
    c = Corpus(tmp_path)
    assert [r.name for r in c.recordings] == ["a", "b"]
    assert c.recordings[0].shard != c.recordings[1].shard  # a shard is only ever written by one writer
    np.testing.assert_array_equal(c.events(c.index("b")), b)
    assert [p["run"] for p in c.provenance] == [1, 2]


def test_only_one_writer_at_a_time(tmp_path):
    with CorpusWriter(tmp_path), pytest.raises(CorpusError, match="another CorpusWriter"):
        CorpusWriter(tmp_path)
    CorpusWriter(tmp_path).close()


def test_rotate_and_full_shards_cut_a_session_into_segments(tmp_path, events_factory):
    live = events_factory(2500, seed=3)
    with CorpusWriter(tmp_path, shard_max_events=1000) as w:
        w.begin_recording("drive", SENSOR, label="street", metadata={"camera": "sim"})
        w.append(live[:300])
        w.rotate()
        for part in batches(live[300:], 700):
            w.append(part)
    c = Corpus(tmp_path)
    assert [r.name for r in c.recordings] == ["drive", "drive/1", "drive/2", "drive/3"]
    assert [r.n_events for r in c.recordings] == [300, 1000, 1000, 200]
    assert {r.session for r in c.recordings} == {"drive"} and [r.segment for r in c.recordings] == [0, 1, 2, 3]
    assert len({r.shard for r in c.recordings}) == 4
    assert all(r.complete and r.label == "street" and r.metadata == {"camera": "sim"} for r in c.recordings)
    np.testing.assert_array_equal(np.concatenate([c.events(i) for i in range(len(c))]), live)


def test_ingest_never_splits_a_sample_that_fits_in_a_shard(tmp_path, events_factory):
    with CorpusWriter(tmp_path, shard_max_events=1000) as w:
        for k in range(5):
            w.add_recording(f"s{k}", events_factory(400, seed=k), SENSOR)
    c = Corpus(tmp_path)
    assert [r.n_events for r in c.recordings] == [400] * 5
    assert [r.shard for r in c.recordings] == ["shard-00000.h5"] * 2 + ["shard-00001.h5"] * 2 + ["shard-00002.h5"]


@pytest.mark.parametrize(("interval", "visible"), [(0.0, 600), (3600.0, 0)])
def test_appends_are_committed_each_flush_interval_and_readable_live(tmp_path, events_factory, interval, visible):
    live = events_factory(600)
    with CorpusWriter(tmp_path, flush_interval_s=interval) as w:
        w.begin_recording("live", SENSOR)
        for part in batches(live, 200):
            w.append(part)
        c = Corpus(tmp_path)  # read while the writer is still recording: only committed events show
        assert c.total_events == visible
        if visible:
            assert not c.recordings[0].complete
            np.testing.assert_array_equal(c.events(0), live[:visible])
        c.close()
    assert Corpus(tmp_path).recordings[0].n_events == 600


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda e: e[::-1], "not sorted"),
        (lambda e: make_events(e["t"], e["x"] + 100, e["y"], e["p"]), "outside the sensor"),
        (lambda e: make_events(e["t"] - 10**9, e["x"], e["y"], e["p"]), "back in time"),
        (lambda e: np.zeros(5), "EVENT_DTYPE"),
    ],
)
def test_invalid_appends_are_rejected_whole(tmp_path, events_factory, bad, message):
    ev = events_factory(400)
    with CorpusWriter(tmp_path, flush_interval_s=0) as w:
        w.begin_recording("live", SENSOR)
        w.append(ev[:200])
        with pytest.raises(ValueError, match=message):
            w.append(bad(ev[200:]))
        w.append(ev[200:])
    np.testing.assert_array_equal(Corpus(tmp_path).events(0), ev)


def test_misuse_is_reported(tmp_path, events_factory):
    with CorpusWriter(tmp_path) as w:
        with pytest.raises(CorpusError, match="begin_recording"):
            w.append(events_factory(10))
        with pytest.raises(ValueError, match="without '/'"):
            w.begin_recording("a/b", SENSOR)
        w.begin_recording("a", SENSOR)
        with pytest.raises(CorpusError, match="still open"):
            w.begin_recording("b", SENSOR)
    with pytest.raises(CorpusError, match="closed"):
        w.begin_recording("c", SENSOR)


def test_killed_writer_leaves_a_readable_corpus(tmp_path):
    sys.path.insert(0, str(CHILD.parent))
    from corpus_writer_child import BATCH, live_events, sample_events

    root = tmp_path / "c"
    child = subprocess.Popen([sys.executable, str(CHILD), str(root), "stream"])
    try:
        deadline = time.monotonic() + 60
        while _committed(root, "live") < 3 * BATCH:  # let it commit a few times, then kill it mid-stream
            assert child.poll() is None and time.monotonic() < deadline, "writer child died or stalled"
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    c = Corpus(root)
    live = c.recordings[c.index("live")]
    assert not live.complete and live.n_events >= 3 * BATCH and live.metadata == {"source": "child"}
    np.testing.assert_array_equal(c.events(c.index("live")), live_events(0, live.n_events))
    for k in range(2):
        np.testing.assert_array_equal(c.events(c.index(f"sample{k}")), sample_events(k))

    with CorpusWriter(root) as w:  # the lock died with the child; the corpus takes more recordings
        w.add_recording("after", sample_events(0), SENSOR)
    assert Corpus(root).recordings[-1].name == "after"


def journal(root: Path) -> Path:
    """The journal ``root``'s manifest names (it may not exist yet)."""
    return root / f"journal-{json.loads((root / 'manifest.json').read_text())['journal']:06d}.jsonl"


def test_a_commit_appends_one_line_of_its_own_size_and_the_manifest_is_rewritten_rarely(tmp_path, events_factory):
    """A commit's cost is its change's, not the corpus's: 400 captures rewrote the manifest 400 times, growing."""
    ev = events_factory(100)
    lines, rewrites = [], 0
    with CorpusWriter(tmp_path, flush_interval_s=0) as w:
        for k in range(400):
            inode, before = (tmp_path / "manifest.json").stat().st_ino, journal(tmp_path)
            size = before.stat().st_size if before.exists() else 0
            w.add_recording(f"capture-{k:06d}", ev, SENSOR, label="car", metadata={"k": k})
            if (tmp_path / "manifest.json").stat().st_ino != inode:
                rewrites += 1  # folded
            else:
                lines.append(before.stat().st_size - size)
    assert rewrites <= 4 and len(lines) >= 396
    assert max(lines[-50:]) <= max(lines[:50]) + 8  # (a few more digits)
    assert not list(tmp_path.glob("journal-*")) and len(Corpus(tmp_path)) == 400  # closed: the manifest alone


def test_a_torn_last_journal_line_is_left_out_and_a_damaged_one_is_named(tmp_path, events_factory):
    ev = events_factory(300)
    crashed = tmp_path / "crashed"
    with CorpusWriter(tmp_path / "c", flush_interval_s=0) as w:
        w.add_recording("a", ev[:100], SENSOR)
        w.add_recording("b", ev[100:200], SENSOR)
        shutil.copytree(tmp_path / "c", crashed)  # the folder as a crash at this moment leaves it
    damaged = tmp_path / "damaged"
    shutil.copytree(crashed, damaged)
    with journal(crashed).open("ab") as f:
        f.write(b'{"recordings": [{"name": "x", "sens')  # the writer died in the middle of a line
    assert [r.name for r in Corpus(crashed).recordings] == ["a", "b"]
    with journal(damaged).open("ab") as f:
        f.write(b'{"recordings": [7]}\n')
    with pytest.raises(CorpusError, match=r"journal-\d+\.jsonl: line 3 is malformed: an entry without a name"):
        Corpus(damaged)
    with CorpusWriter(crashed) as w:  # the next writer folds what was committed and goes on
        w.add_recording("c", ev[200:], SENSOR)
    c = Corpus(crashed)
    assert [r.name for r in c.recordings] == ["a", "b", "c"] and c.check(full=True) == {}
    assert not list(crashed.glob("journal-*"))


def test_a_corpus_of_the_format_before_the_journal_is_read_and_extended(tmp_path, events_factory):
    ev = events_factory(200)
    _corpus_with_one_recording(tmp_path, ev[:100])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["journal"]
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "format_version": 1}))
    np.testing.assert_array_equal(Corpus(tmp_path).events(0), ev[:100])
    with CorpusWriter(tmp_path) as w:
        w.add_recording("b", ev[100:], SENSOR)
    assert [r.name for r in Corpus(tmp_path).recordings] == ["a", "b"]
    assert json.loads((tmp_path / "manifest.json").read_text())["format_version"] == FORMAT_VERSION


def _committed(root: Path, name: str) -> int:
    """Events of recording ``name`` committed right now (0 before it exists)."""
    try:
        manifest = load_manifest(root)
    except CorpusError:  # (not written yet)
        return 0
    return sum(r["n_events"] for r in manifest["recordings"] if r["name"] == name)


def test_real_write_failure_raises_corpus_full_and_keeps_committed_events(tmp_path):
    sys.path.insert(0, str(CHILD.parent))
    from corpus_writer_child import BATCH, live_events

    root = tmp_path / "c"
    done = subprocess.run(
        [sys.executable, str(CHILD), str(root), "fsize"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["error"] == "CorpusFullError" and report["errno"] == errno.EFBIG
    assert str(root) in report["message"] and "bytes free" in report["message"]
    c = Corpus(root)
    live = c.recordings[c.index("live")]
    assert live.n_events >= BATCH and not live.complete
    np.testing.assert_array_equal(c.events(c.index("live")), live_events(0, live.n_events))


def test_low_free_space_stops_the_writer_with_a_clear_error(tmp_path, events_factory, monkeypatch):
    ev = events_factory(1000)
    w = CorpusWriter(tmp_path, flush_interval_s=0, min_free_bytes=10_000)
    w.begin_recording("live", SENSOR)
    w.append(ev[:500])
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=12_345))
    with pytest.raises(CorpusFullError, match=re.escape(f"{tmp_path}: only 12345 bytes free")) as info:
        w.append(ev[500:])
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    with pytest.raises(CorpusError, match="earlier error"):
        w.append(ev[500:])
    w.close()
    c = Corpus(tmp_path)
    np.testing.assert_array_equal(c.events(0), ev[:500])


@pytest.mark.parametrize(("code", "full"), [(errno.ENOSPC, True), (errno.EIO, False)])
def test_failed_shard_write_surfaces_as_corpus_error(tmp_path, events_factory, monkeypatch, code, full):
    ev = events_factory(1000)
    w = CorpusWriter(tmp_path, flush_interval_s=0)
    w.begin_recording("live", SENSOR)
    w.append(ev[:500])

    def failing_write(self, key, value):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(h5py.Dataset, "__setitem__", failing_write)
    with pytest.raises(CorpusError, match=r"shard-00000\.h5") as info:
        w.append(ev[500:])
    assert isinstance(info.value, CorpusFullError) == full
    assert ("bytes free" in str(info.value)) == full
    monkeypatch.undo()
    w.close()
    assert not (tmp_path / ".reserve").exists()
    np.testing.assert_array_equal(Corpus(tmp_path).events(0), ev[:500])


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_a_commit_whose_fsync_fails_stops_the_writer_and_keeps_what_was_committed(
    tmp_path, events_factory, monkeypatch, code
):
    ev = events_factory(300)
    w = CorpusWriter(tmp_path, flush_interval_s=0)
    w.add_recording("a", ev[:100], SENSOR)
    real = os.fsync

    def failing(fd: int) -> None:  # a shard's fsync fails, as a disk's transient error would
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith("shard-"):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(CorpusError, match=r"shard-00000\.h5: .*; events committed before are kept"):
        w.add_recording("b", ev[100:200], SENSOR)
    monkeypatch.undo()
    with pytest.raises(CorpusError, match="stopped after an earlier error"):  # never half a commit later
        w.add_recording("c", ev[200:], SENSOR)
    w.close()
    assert [r.name for r in Corpus(tmp_path).recordings] == ["a"]
    with CorpusWriter(tmp_path) as w:  # what was not committed holds no name
        w.add_recording("b", ev[100:200], SENSOR)
    assert [r.name for r in Corpus(tmp_path).recordings] == ["a", "b"]


def test_a_corpus_moved_away_under_its_writer_stops_it_and_is_whole_when_put_back(tmp_path, events_factory):
    root, away = tmp_path / "c", tmp_path / "away"
    ev = events_factory(200)
    w = CorpusWriter(root, flush_interval_s=0)
    w.add_recording("a", ev[:100], SENSOR)
    root.rename(away)
    with pytest.raises(CorpusError, match=re.escape(str(root)) + r".*No such file.*events committed before are kept"):
        w.add_recording("b", ev[100:], SENSOR)
    w.close()
    away.rename(root)
    with CorpusWriter(root) as w:  # the lock was let go of
        w.add_recording("b", ev[100:], SENSOR)
    c = Corpus(root)
    assert [r.name for r in c.recordings] == ["a", "b"] and c.check(full=True) == {}
    np.testing.assert_array_equal(c.events(1), ev[100:])


def edit_manifest(root: Path, old: str, new: str) -> None:
    manifest = root / "manifest.json"
    text = manifest.read_text()
    assert text.count(old) == 1, old
    manifest.write_text(text.replace(old, new))


def copy_recording(root: Path, **changes) -> None:
    """A hand edit: the manifest's recording entry listed twice, the copy with ``changes``."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["recordings"].append({**manifest["recordings"][0], **changes})
    (root / "manifest.json").write_text(json.dumps(manifest))


def _corpus_with_one_recording(root: Path, events: np.ndarray) -> None:
    with CorpusWriter(root) as w:
        w.add_recording("a", events, SENSOR)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda root: (root / "manifest.json").unlink(), "no corpus manifest"),
        (lambda root: (root / "manifest.json").write_text('{"format_version": 1, "recor'), "corrupt corpus manifest"),
        (lambda root: (root / "manifest.json").write_text("[1, 2]"), "not a corpus manifest"),
        (
            lambda root: edit_manifest(root, f'"format_version": {FORMAT_VERSION}', '"format_version": 99'),
            "format_version 99",
        ),
        (lambda root: edit_manifest(root, '"offset"', '"offst"'), "recording entry 0 is malformed: missing offset"),
        (lambda root: edit_manifest(root, '"n_events": 100', '"n_events": -1'), "n_events -1 not in 0..2"),
        (lambda root: edit_manifest(root, '"n_events": 100', '"n_events": 5000'), r"events 0..5000 beyond the 100"),
        (lambda root: edit_manifest(root, '"n_events": 100', '"n_events": "100"'), "n_events '100'"),
        (lambda root: edit_manifest(root, '"t_min": ', '"t_min": "a", "was": '), "t_min/t_max"),
        (lambda root: edit_manifest(root, "32,\n    48", "32,\n    4294967295"), "implausible sensor 4294967295x32"),
        (
            lambda root: edit_manifest(root, '"shard-00000.h5",\n   "offset"', '"../x.h5",\n   "offset"'),
            "'../x.h5' is not",
        ),
        (
            lambda root: edit_manifest(root, '"file": "shard-00000.h5"', '"file": "/etc/passwd"'),
            "shard entry 0 is malformed",
        ),
        (lambda root: edit_manifest(root, '"events": 100', '"events": 1e300'), "shard entry 0 is malformed: events"),
        (lambda root: edit_manifest(root, '"recordings": [', '"recordings": 7, "x": ['), "recordings must be a list"),
        (copy_recording, "recording entry 1 is malformed: name 'a' is entry 0's too"),
        (
            lambda root: copy_recording(root, name="b"),
            "entry 1 is malformed: segment 0 of session 'a' is entry 0's too",
        ),
    ],
)
def test_damaged_manifest_is_a_clear_error(tmp_path, events_factory, damage, message):
    _corpus_with_one_recording(tmp_path, events_factory(100))
    damage(tmp_path)
    with pytest.raises(CorpusError, match=message) as info:
        Corpus(tmp_path)
    assert "manifest.json" in str(info.value)
    with pytest.raises(CorpusError):  # and never extended
        CorpusWriter(tmp_path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda shard: shard.unlink(), "is missing"),
        (lambda shard: shard.write_bytes(b"not an hdf5 file" * 100), "cannot open shard"),
    ],
)
def test_damaged_shard_is_a_clear_error(tmp_path, events_factory, damage, message):
    _corpus_with_one_recording(tmp_path, events_factory(100))
    damage(tmp_path / "shard-00000.h5")
    c = Corpus(tmp_path)
    with pytest.raises(CorpusError, match=message) as info:
        c.events(0)
    assert "shard-00000.h5" in str(info.value)


def flip(path: Path, start: int, stop: int) -> None:
    """Invert bytes ``[start, stop)`` of ``path``."""
    data = bytearray(path.read_bytes())
    data[start:stop] = bytes(b ^ 0xFF for b in data[start:stop])
    path.write_bytes(data)


def test_damaged_shard_metadata_fails_at_once_instead_of_hanging(tmp_path, events_factory):
    # HDF5 with SWMR retries a block whose checksum fails, waiting twice as long each time: these damages kept a
    # reader waiting for hours. A sealed shard is read without SWMR, an unsealed one with few retries.
    roots = []
    for where in (40, 200, 1600):
        for sealed in (True, False):
            root = tmp_path / f"at{where}-{'sealed' if sealed else 'open'}"
            _corpus_with_one_recording(root, events_factory(3000))
            flip(root / "shard-00000.h5", where, where + 8)
            if not sealed:  # as a shard left by a writer that died
                edit_manifest(root, '"sealed": true', '"sealed": false')
            roots.append(str(root))
    code = (
        "import sys\nfrom mem_core.corpus import Corpus, CorpusError\n"
        "for root in sys.argv[1:]:\n"
        "    try: Corpus(root).events(0)\n"
        "    except CorpusError as e: print(e, flush=True)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, *roots], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert len(lines) == len(roots), done.stderr
    for root, line in zip(roots, lines, strict=True):
        assert line.startswith(f"{root}/shard-00000.h5: "), line
    assert time.monotonic() - started < 30


def test_check_opens_every_shard_and_full_check_reads_every_event(tmp_path, events_factory):
    with CorpusWriter(tmp_path) as w:
        for k in range(3):
            w.add_recording(f"r{k}", events_factory(20_000, seed=k), SENSOR)
            w.rotate()
    assert sorted(Corpus(tmp_path).shards) == ["shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]
    assert Corpus(tmp_path).check(full=True) == {}
    shards = [tmp_path / f"shard-0000{k}.h5" for k in range(3)]
    shards[0].write_bytes(shards[0].read_bytes()[:5000])  # cut short
    with h5py.File(shards[1], "r+") as f:  # valid HDF5 (checksums rewritten), events out of order
        f["t"][100] = 0
    flip(shards[2], shards[2].stat().st_size // 2, shards[2].stat().st_size // 2 + 64)  # a damaged chunk
    quick = Corpus(tmp_path).check()
    assert list(quick) == ["shard-00000.h5"] and str(shards[0]) in quick["shard-00000.h5"]
    full = Corpus(tmp_path).check(full=True)
    assert sorted(full) == ["shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]
    assert "recording 'r1': event 100 (t=0," in full["shard-00001.h5"]
    assert "cannot read events" in full["shard-00002.h5"]


def reverse_times(f: h5py.File) -> None:
    f["t"][:100] = f["t"][:100][::-1]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: f["x"].__setitem__(50, 48), r"event 50 \(t=\d+, x=48, y=\d+, p=\d\) lies off the 48x32 sensor"),
        (
            lambda f: f["p"].__setitem__(70, 7),
            r"event 70 \(t=\d+, x=\d+, y=\d+, p=7\) has a polarity other than 0 or 1",
        ),
        (reverse_times, r"event 1 \(t=\d+, .*\) comes before t=\d+ of the event before it"),
        (lambda f: f["t"].__setitem__(0, -5), r"event 0 \(t=-5, .*\) comes before t=\d+ of the manifest's t_min"),
    ],
)
def test_a_window_with_values_a_recording_cannot_hold_names_the_shard_and_the_event(
    tmp_path, events_factory, damage, message
):
    # HDF5 rewrites the checksums: only the values themselves tell the damage
    _corpus_with_one_recording(tmp_path, events_factory(100))
    with h5py.File(tmp_path / "shard-00000.h5", "r+") as f:
        damage(f)
    corpus = Corpus(tmp_path)
    assert corpus.check() == {}  # the cheap check opens shards and compares counts only
    with pytest.raises(CorpusError, match=rf"shard-00000\.h5: recording 'a': {message}"):
        corpus.window(0, 0, 100)


def test_manifest_claiming_more_events_than_the_shard_holds_is_a_clear_error(tmp_path, events_factory):
    _corpus_with_one_recording(tmp_path, events_factory(100))
    edit_manifest(tmp_path, '"n_events": 100', '"n_events": 500000000000')
    edit_manifest(tmp_path, '"events": 100', '"events": 500000000000')  # consistent, so only the shard can tell
    corpus = Corpus(tmp_path)
    with pytest.raises(CorpusError, match=r"shard-00000\.h5: holds 100 events, the manifest needs 500000000000"):
        corpus.events(0)  # refused before 6.5 TB are allocated


@pytest.mark.slow  # loader worker processes
def test_corpus_reads_in_dataloader_workers_and_after_pickling(tmp_path, events_factory):
    torch = pytest.importorskip("torch")
    samples = [events_factory(300 + 50 * k, seed=k) for k in range(6)]
    with CorpusWriter(tmp_path) as w:
        for k, ev in enumerate(samples):
            w.add_recording(f"s{k}", ev, SENSOR, label=k % 2)
    c = Corpus(tmp_path)
    c.events(0)  # the parent holds an open HDF5 handle when the workers fork

    class Windows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(c)

        def __getitem__(self, i: int):
            return torch.from_numpy(c.window(i, 10, 200)["x"].astype(np.int64)), os.getpid()

    loader = torch.utils.data.DataLoader(Windows(), batch_size=2, num_workers=2)
    got, pids = [], set()
    for x, pid in loader:
        got.extend(x.numpy())
        pids.update(pid.tolist())
    for k, x in enumerate(got):
        np.testing.assert_array_equal(x, samples[k]["x"][10:210])
    assert os.getpid() not in pids and len(pids) == 2

    clone = pickle.loads(pickle.dumps(c))
    np.testing.assert_array_equal(clone.events(5), samples[5])


def test_windows_read_from_several_threads_are_exact(tmp_path, events_factory, small_chunks):
    from concurrent.futures import ThreadPoolExecutor

    live = events_factory(5000, seed=3)
    with CorpusWriter(tmp_path) as w:
        w.add_recording("live", live, SENSOR)
    c = Corpus(tmp_path)
    starts = np.random.default_rng(0).integers(0, 4900, 64).tolist()
    with ThreadPoolExecutor(4) as pool:
        windows = list(pool.map(lambda s: c.window(0, s, 100 + s % 50), starts))
    for s, got in zip(starts, windows, strict=True):
        np.testing.assert_array_equal(got, live[s : s + 100 + s % 50])


def test_reading_a_long_recording_keeps_no_recording_sized_buffer(tmp_path, events_factory, monkeypatch):
    monkeypatch.setattr(corpus_reader, "READ_BUFFER_EVENTS", 1000)
    events = events_factory(30_000, seed=4)
    with CorpusWriter(tmp_path) as w:
        w.add_recording("long", events, SENSOR)
    c = Corpus(tmp_path)
    np.testing.assert_array_equal(c.window(0, 10, 500), events[10:510])
    np.testing.assert_array_equal(c.events(0), events)
    assert c.buffered_events <= max(1000, corpus_reader.CHUNK_EVENTS)
