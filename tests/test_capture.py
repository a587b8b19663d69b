"""Labelled captures: each window a durable labelled recording, undo of the last one, counts per class."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mem_core.corpus import Corpus, CorpusError, CorpusWriter, snapshot_corpus
from mem_core.events import SensorSize
from recorders.base import RecorderError
from recorders.capture import LabelledCaptures

SENSOR = SensorSize(100, 120)


def test_captures_are_labelled_recordings_with_their_exact_events(tmp_path, events_factory):
    windows = [events_factory(500 + k, sensor=SENSOR, seed=k) for k in range(3)]
    with LabelledCaptures(tmp_path / "labels") as captures:
        for events, label in zip(windows, ["car", "background", "car"], strict=True):
            captures.capture(events, SENSOR, label, metadata={"seq": 7})
        assert captures.counts() == {"background": 1, "car": 2}
    corpus = Corpus(tmp_path / "labels")
    assert [r.label for r in corpus.recordings] == ["car", "background", "car"]
    assert all(r.sensor == SENSOR and r.metadata["seq"] == 7 for r in corpus.recordings)
    for k, events in enumerate(windows):
        np.testing.assert_array_equal(corpus.events(k), events)


def test_undo_takes_the_last_capture_out_and_a_new_session_continues(tmp_path, events_factory):
    root = tmp_path / "labels"
    with LabelledCaptures(root) as captures:
        captures.capture(events_factory(100, sensor=SENSOR), SENSOR, "car")
        captures.capture(events_factory(100, sensor=SENSOR, seed=1), SENSOR, "background")
        assert captures.undo() == "background"
        assert captures.counts() == {"car": 1}
        assert [r.label for r in Corpus(root).recordings] == ["car"]  # committed at once
    with LabelledCaptures(root) as captures:  # a later session counts what is there and adds to it
        assert captures.counts() == {"car": 1}
        assert captures.undo() is None  # nothing captured in this session yet
        captures.capture(events_factory(100, sensor=SENSOR, seed=2), SENSOR, "background")
    assert [r.label for r in Corpus(root).recordings] == ["car", "background"]
    assert Corpus(root).check(full=True) == {}


def test_captures_after_an_undo_and_a_restart_get_names_of_their_own(tmp_path, events_factory):
    """An undo leaves a gap in the names: a later session numbers its captures after the highest name, not after
    the count, so its first capture does not collide with the last one kept."""
    root = tmp_path / "labels"
    with LabelledCaptures(root) as captures:
        for k, label in enumerate(["car", "background"]):
            captures.capture(events_factory(100, sensor=SENSOR, seed=k), SENSOR, label)
        captures.undo()
        captures.capture(events_factory(100, sensor=SENSOR, seed=2), SENSOR, "background")
    with LabelledCaptures(root) as captures:
        names = [captures.capture(events_factory(100, sensor=SENSOR, seed=3 + k), SENSOR, "car") for k in range(3)]
        assert captures.counts() == {"background": 1, "car": 4}
    corpus = Corpus(root)
    assert [r.label for r in corpus.recordings] == ["car", "background", "car", "car", "car"]
    assert len({r.name for r in corpus.recordings}) == 5 and set(names) <= {r.name for r in corpus.recordings}


def test_a_snapshot_keeps_the_captures_of_its_moment_and_capturing_goes_on(tmp_path, events_factory):
    root = tmp_path / "labels"
    windows = [events_factory(100, sensor=SENSOR, seed=k) for k in range(3)]
    with LabelledCaptures(root) as captures:
        captures.capture(windows[0], SENSOR, "car")
        captures.capture(windows[1], SENSOR, "background")
        snap = captures.snapshot(tmp_path / "run" / "captures")
        assert captures.undo() == "background"  # later undos and captures leave the snapshot alone
        captures.capture(windows[2], SENSOR, "car")
    assert [r.label for r in snap.recordings] == ["car", "background"]
    assert snap.provenance[-1]["snapshot_of"] == str(root.resolve()) and snap.check(full=True) == {}
    for k in range(2):
        np.testing.assert_array_equal(snap.events(k), windows[k])
    assert [r.label for r in Corpus(root).recordings] == ["car", "car"]
    with pytest.raises(CorpusError, match="holds a corpus already"):
        snapshot_corpus(root, tmp_path / "run" / "captures", provenance={})


def test_a_labels_folder_moved_away_says_so_and_capturing_goes_on_once_it_is_back(tmp_path, events_factory):
    root, away = tmp_path / "labels", tmp_path / "away"
    windows = [events_factory(100, sensor=SENSOR, seed=k) for k in range(3)]
    with LabelledCaptures(root) as captures:
        captures.capture(windows[0], SENSOR, "car")
        root.rename(away)
        for _ in range(2):  # every try says what happened and what to do, never that a name exists
            with pytest.raises(RecorderError, match=r"'car' not stored: the labels folder .* is gone .* back"):
                captures.capture(windows[1], SENSOR, "car")
        assert captures.counts() == {"car": 1}
        away.rename(root)
        captures.capture(windows[1], SENSOR, "car")
        assert captures.undo() == "car"
        captures.capture(windows[2], SENSOR, "background")
    corpus = Corpus(root)
    assert [r.label for r in corpus.recordings] == ["car", "background"] and corpus.check(full=True) == {}
    np.testing.assert_array_equal(corpus.events(1), windows[2])


def test_a_labels_folder_moved_away_keeps_no_reserve_file(tmp_path, events_factory):
    """The writer's 16 MB reserve (``.reserve``) stayed in a labels corpus moved away while the server ran."""
    root, away = tmp_path / "labels", tmp_path / "away"
    with LabelledCaptures(root) as captures:
        captures.capture(events_factory(100, sensor=SENSOR), SENSOR, "car")
        root.rename(away)
        with pytest.raises(RecorderError, match="is gone"):
            captures.capture(events_factory(100, sensor=SENSOR, seed=1), SENSOR, "car")
    assert not (away / ".reserve").exists() and Corpus(away).label_counts() == {"car": 1}


def test_a_labels_folder_deleted_and_made_again_takes_the_next_capture(tmp_path, events_factory):
    """The next capture was lost with "write failed ... goes on once labels is writable again": a folder made anew
    where the old one was is a new labelled corpus, written at once."""
    root = tmp_path / "labels"
    windows = [events_factory(100, sensor=SENSOR, seed=k) for k in range(3)]
    with LabelledCaptures(root) as captures:
        captures.capture(windows[0], SENSOR, "car")
        shutil.rmtree(root)
        root.mkdir()
        captures.capture(windows[1], SENSOR, "background")
        assert captures.counts() == {"background": 1}
        assert captures.undo() == "background"  # what this session may undo: the captures of the new folder
        assert captures.undo() is None
        captures.capture(windows[2], SENSOR, "car")
    corpus = Corpus(root)
    assert [r.label for r in corpus.recordings] == ["car"] and corpus.check(full=True) == {}
    np.testing.assert_array_equal(corpus.events(0), windows[2])


def test_the_room_captures_leave_free_on_the_disk_is_the_user_s_to_set(tmp_path, events_factory, small_disk):
    """Captures were refused below 256 MB free with no way to say otherwise (mem serve --min-free-bytes)."""
    root = tmp_path / "labels"
    root.mkdir()
    small_disk(root, 100 << 20)  # a disk with 100 MB free
    with pytest.raises(CorpusError, match="below min_free_bytes=268435456"):
        LabelledCaptures(root).capture(events_factory(100, sensor=SENSOR), SENSOR, "car")
    with LabelledCaptures(root, min_free_bytes=1 << 20) as captures:
        captures.capture(events_factory(100, sensor=SENSOR), SENSOR, "car")
    assert Corpus(root).label_counts() == {"car": 1}


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_a_capture_the_disk_fails_to_take_is_not_stored_and_the_next_one_is(
    tmp_path, events_factory, monkeypatch, code
):
    root = tmp_path / "labels"
    windows = [events_factory(100, sensor=SENSOR, seed=k) for k in range(3)]
    real = os.fsync

    def failing(fd: int) -> None:  # a shard's fsync fails, as a disk's transient error would
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith("shard-"):
            raise OSError(code, os.strerror(code))
        real(fd)

    with LabelledCaptures(root) as captures:
        captures.capture(windows[0], SENSOR, "car")
        monkeypatch.setattr(os, "fsync", failing)
        with pytest.raises(RecorderError, match=rf"'car' not stored: .*{os.strerror(code)}.*writable again"):
            captures.capture(windows[1], SENSOR, "car")
        monkeypatch.undo()
        assert captures.counts() == {"car": 1}
        captures.capture(windows[2], SENSOR, "background")
        assert captures.counts() == {"background": 1, "car": 1}
    corpus = Corpus(root)
    assert [r.label for r in corpus.recordings] == ["car", "background"]
    for k, events in enumerate([windows[0], windows[2]]):
        np.testing.assert_array_equal(corpus.events(k), events)


def test_a_class_name_in_two_unicode_spellings_is_one_class(tmp_path, events_factory):
    with LabelledCaptures(tmp_path / "labels") as captures:
        captures.capture(events_factory(100, sensor=SENSOR), SENSOR, "caf\u00e9")  # é as one character
        captures.capture(events_factory(100, sensor=SENSOR, seed=1), SENSOR, "cafe\u0301")  # e + combining accent
        assert captures.counts() == {"caf\u00e9": 2}
    assert Corpus(tmp_path / "labels").label_counts() == {"caf\u00e9": 2}


@pytest.mark.parametrize(
    ("label", "why"),
    [("x" * 56, "at most 55 characters"), ("car\x1b[2J", "printable"), ("   ", "a capture needs a class name")],
)
def test_a_label_no_model_could_carry_is_refused_and_nothing_is_written(tmp_path, events_factory, label, why):
    root = tmp_path / "labels"
    with LabelledCaptures(root) as captures:
        captures.capture(events_factory(100, sensor=SENSOR), SENSOR, "car")
        with pytest.raises(RecorderError, match=why):
            captures.capture(events_factory(100, sensor=SENSOR, seed=1), SENSOR, label)
    assert [r.label for r in Corpus(root).recordings] == ["car"]


def test_a_class_past_the_most_a_model_may_have_is_refused(tmp_path, events_factory, monkeypatch):
    monkeypatch.setattr("recorders.capture.MAX_CLASSES", 2)
    with LabelledCaptures(tmp_path / "labels") as captures:
        for label in ("car", "background", "car"):  # more of a class already held is fine
            captures.capture(events_factory(100, sensor=SENSOR), SENSOR, label)
        with pytest.raises(RecorderError, match="already holds the 2 classes a model may have"):
            captures.capture(events_factory(100, sensor=SENSOR), SENSOR, "truck")
        assert captures.counts() == {"background": 1, "car": 2}


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        (["x" * 80], r"classes.0: .*at most 55 characters"),
        (["caf\u00e9", "cafe\u0301"], r"classes: .*'café' is there twice \(the same name in two Unicode spellings\)"),
    ],
)
def test_a_labelled_corpus_with_labels_no_model_could_carry_is_refused_on_opening(
    tmp_path, events_factory, labels, why
):
    root = tmp_path / "labels"
    with CorpusWriter(root) as writer:  # written by another tool: the writer takes any label
        for k, label in enumerate(labels):
            writer.add_recording(f"r{k}", events_factory(100, sensor=SENSOR), SENSOR, label=label)
    with pytest.raises(RecorderError, match=rf"labels: the labelled corpus's {why}"):
        LabelledCaptures(root)


def test_a_capture_survives_the_process_being_killed(tmp_path):
    code = (
        "import os, sys\nfrom mem_core.events import SensorSize, make_events\n"
        "from recorders.capture import LabelledCaptures\n"
        "c = LabelledCaptures(sys.argv[1])\n"
        "c.capture(make_events([1, 2, 3], [0, 1, 2], [0, 1, 2], [0, 1, 0]), SensorSize(4, 4), 'car')\n"
        "os._exit(9)  # no close: as a killed server\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "labels")], check=False, timeout=120)
    (recording,) = Corpus(tmp_path / "labels").recordings
    assert recording.label == "car" and recording.n_events == 3


def test_bad_captures_are_clear_errors(tmp_path, events_factory):
    with LabelledCaptures(tmp_path / "labels") as captures:
        with pytest.raises(RecorderError, match="needs a class name"):
            captures.capture(events_factory(10, sensor=SENSOR), SENSOR, " ")
        with pytest.raises(RecorderError, match="holds no events"):
            captures.capture(events_factory(0, sensor=SENSOR), SENSOR, "car")


def test_remove_recording_refuses_unknown_and_open_recordings(tmp_path, events_factory):
    with CorpusWriter(tmp_path) as writer:
        with pytest.raises(CorpusError, match="no recording named 'x'"):
            writer.remove_recording("x")
        writer.begin_recording("live", SENSOR)
        with pytest.raises(CorpusError, match="still being recorded"):
            writer.remove_recording("live")
