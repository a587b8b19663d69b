"""``mem ingest``: good files in, bad files listed (never fatal), re-runs skip, dataset labels, workers, full disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import synthetic_events

from mem_core.corpus import Corpus, CorpusError
from mem_core.events import SensorSize
from mem_core.io import read_events, write_events
from recorders.base import RecorderError
from recorders.config import IngestConfig
from recorders.ingest import run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mixed_folder(tmp_path, events_factory) -> tuple[Path, list[Path], list[Path]]:
    """A folder tree with good files (.dat, .bin, .npz), bad ones (truncated, garbage, empty) and a text file."""
    folder = tmp_path / "in"
    (folder / "sub" / "deeper").mkdir(parents=True)
    good = [folder / "a.dat", folder / "sub" / "b.bin", folder / "sub" / "deeper" / "c.npz"]
    write_events(good[0], events_factory(3000, SensorSize(100, 120), seed=1), SensorSize(100, 120))
    write_events(good[1], events_factory(2000, SensorSize(34, 34), seed=2), SensorSize(34, 34))
    write_events(good[2], events_factory(1000, SensorSize(480, 640), seed=3), SensorSize(480, 640))
    bad = [folder / "truncated.dat", folder / "sub" / "garbage.aedat4", folder / "empty.bin"]
    bad[0].write_bytes(good[0].read_bytes()[:-3])
    bad[1].write_bytes(b"this is not an event file\n" * 20)
    bad[2].write_bytes(b"")
    (folder / "notes.txt").write_text("not an event file, not ingested")
    return folder, good, bad


def ingest(paths, out: Path, **kwargs):
    return run(IngestConfig(paths=tuple(paths), out=out, progress=False, min_free_bytes=0, **kwargs))


def corpus_by_source(out: Path) -> dict[str, np.ndarray]:
    corpus = Corpus(out)
    return {r.metadata["source_path"]: corpus.events(i) for i, r in enumerate(corpus.recordings)}


def test_good_files_are_ingested_and_bad_ones_listed_with_a_reason(mixed_folder, tmp_path):
    folder, good, bad = mixed_folder
    out = tmp_path / "corpus"
    report = ingest([folder], out)
    assert sorted(e["path"] for e in report.ingested) == sorted(map(str, good))
    assert sorted(e["path"] for e in report.failed) == sorted(map(str, bad))
    assert all(e["reason"] for e in report.failed)
    assert not report.ok and report.stopped is None
    stored = corpus_by_source(out)
    assert sorted(stored) == sorted(str(p.resolve()) for p in good)
    for path in good:
        np.testing.assert_array_equal(stored[str(path.resolve())], read_events(path).events)
    assert report.events == sum(read_events(p).events.size for p in good)
    recs = Corpus(out).recordings
    assert {r.name for r in recs} == {"in:a.dat", "in:sub:b.bin", "in:sub:deeper:c.npz"}
    assert all(r.label is None and r.complete for r in recs)
    saved = json.loads(Path(report.report_path).read_text())
    assert Path(report.report_path).parent == out and Path(report.report_path).name.startswith("ingest-report-")
    assert saved["failed"] == report.failed and len(saved["ingested"]) == 3


def test_rerun_skips_what_is_already_ingested_and_picks_up_changed_files(mixed_folder, tmp_path, events_factory):
    folder, good, _ = mixed_folder
    out = tmp_path / "corpus"
    ingest([folder], out)
    again = ingest([folder], out)
    assert again.ingested == [] and len(again.skipped) == 3 and len(again.failed) == 3
    assert len(Corpus(out).recordings) == 3
    write_events(good[0], events_factory(777, SensorSize(100, 120), seed=9), SensorSize(100, 120))
    os.utime(good[0], ns=(1, 1))  # a different mtime, whatever the clock resolution
    third = ingest([folder], out)
    assert [e["path"] for e in third.ingested] == [str(good[0])]
    assert third.ingested[0]["name"] == "in:a.dat~2" and third.ingested[0]["events"] == 777
    assert len(Corpus(out).recordings) == 4


def test_real_files_are_ingested(data_dir, tmp_path):
    files = [
        next((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat")),
        data_dir / "nmnist-small" / "881.bs2",
        data_dir / "fixtures" / "inivation_sample.aedat4",
    ]
    report = ingest(files, tmp_path / "corpus")
    assert report.failed == [] and len(report.ingested) == 3
    stored = corpus_by_source(tmp_path / "corpus")
    for path in files:
        np.testing.assert_array_equal(stored[str(path.resolve())], read_events(path).events)


def test_dataset_layout_carries_labels(data_dir, tmp_path):
    root = tmp_path / "ncars"
    expected = {}
    for split, n in (("train", 3), ("val", 1)):
        for cls in ("cars", "background"):
            (root / split / cls).mkdir(parents=True)
            for real in sorted((data_dir / "ncars-dev" / split / cls).glob("*.dat"))[:n]:
                link = root / split / cls / real.name
                link.symlink_to(real)
                expected[str(link.resolve())] = (cls, split)
    report = ingest([root], tmp_path / "corpus", dataset="ncars")
    assert report.failed == [] and len(report.ingested) == 8
    recs = Corpus(tmp_path / "corpus").recordings
    assert {r.metadata["source_path"]: (r.label, r.metadata["split"]) for r in recs} == expected
    assert {r.sensor for r in recs} == {SensorSize(100, 120)}
    assert Corpus(tmp_path / "corpus").describe()["labels"] == {"cars": 4, "background": 4}


def dataset_layout(root: Path, dataset: str, per_class: int) -> dict[str, tuple[str, str]]:
    """A ``dataset`` tree of tiny files under ``root``, ``per_class`` training samples of each of two classes (enough
    for the validation carve-out to leave guards) and a few test samples: {file: (class, shipped split)}."""
    sensor = {"ncars": SensorSize(100, 120), "nmnist": SensorSize(34, 34), "ncaltech101": SensorSize(180, 240)}[dataset]
    classes = {"ncars": ["background", "cars"], "nmnist": ["0", "1"], "ncaltech101": ["ant", "elephant"]}[dataset]
    expected = {}
    for split, n in (("train", per_class), ("test", 3)):
        for cls in classes:
            folder = {
                "ncars": root / f"n-cars_{split}" / cls,
                "nmnist": root / split.capitalize() / cls,
                "ncaltech101": root / cls,
            }[dataset]
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(n):
                path = folder / f"{split}{k}{'.dat' if dataset == 'ncars' else '.bin'}"
                write_events(path, synthetic_events(20, sensor, seed=k), sensor)
                expected[str(path.resolve())] = (cls, split)
    if dataset == "ncaltech101":  # its test split is drawn from all samples: the shipped split is what it drew
        from mem_core.datasets.ncaltech101 import ncaltech101_split

        test = {str((root / rel).resolve()) for rel, _ in ncaltech101_split(root)["test"]}
        expected = {path: (cls, "test" if path in test else "train") for path, (cls, _) in expected.items()}
    return expected


@pytest.mark.parametrize("dataset", ["ncars", "nmnist", "ncaltech101"])
def test_a_dataset_goes_in_whole_and_the_summary_accounts_for_every_file(tmp_path, dataset):
    """1,000 N-Cars files in gave 920 ingested, 0 failed, 0 skipped: the guards around the validation blocks the
    dataset carves for training were missing. Ingest keeps every file, with its label and shipped split."""
    root = tmp_path / dataset
    # enough samples that the carve-out leaves guards (N-Caltech101 carves from the 80 % its test split leaves)
    expected = dataset_layout(root, dataset, per_class=250 if dataset == "ncaltech101" else 200)
    write_events(root / "stray.dat", synthetic_events(20, SensorSize(100, 120)), SensorSize(100, 120))
    report = ingest([root], tmp_path / "corpus", dataset=dataset)
    assert report.failed == [] and report.skipped == []
    assert len(report.ingested) == len(expected)
    assert report.files == len(expected) + 1  # the stray file, left out
    assert report.left_out == [
        {"path": str(root / "stray.dat"), "reason": f"not a {dataset} sample (outside its layout)"}
    ]
    recs = Corpus(tmp_path / "corpus").recordings
    assert {r.metadata["source_path"]: (r.label, r.metadata["split"]) for r in recs} == expected


def test_every_path_under_a_dataset_root_is_accounted_for_with_its_reason(tmp_path):
    """Links to nowhere, FIFOs and link loops appeared nowhere; the files of a split without background/ were "outside
    its layout" without a why; a link in background/ to a file of cars/ ingested a car as background."""
    root = tmp_path / "ncars"
    dataset_layout(root, "ncars", per_class=2)
    train, test = root / "n-cars_train", root / "n-cars_test"
    for path in (test / "background").iterdir():
        path.unlink()
    (test / "background").rmdir()
    (train / "cars" / "gone.dat").symlink_to(tmp_path / "nowhere.dat")
    os.mkfifo(train / "cars" / "pipe.dat")
    (train / "background" / "loop.dat").symlink_to(train / "background" / "loop.dat")
    (train / "background" / "car.dat").symlink_to(train / "cars" / "train0.dat")
    report = ingest([root], tmp_path / "corpus", dataset="ncars")
    reasons = {Path(e["path"]).relative_to(root).as_posix(): e["reason"] for e in report.failed + report.left_out}
    assert reasons == {
        "n-cars_train/cars/gone.dat": f"a symbolic link to nowhere ({tmp_path / 'nowhere.dat'})",
        "n-cars_train/cars/pipe.dat": "not a regular file (a FIFO)",
        "n-cars_train/background/loop.dat": "a symbolic link in a loop",
        "n-cars_train/background/car.dat": f"a link to {train / 'cars' / 'train0.dat'}, which cars/ holds too: one "
        "file cannot be a sample of two classes",
        **{
            f"n-cars_test/cars/test{k}.dat": f"not a ncars sample ({test}: holds no background/ folder, and an N-Cars "
            "split holds cars/ and background/)"
            for k in range(3)
        },
    }
    assert report.files == len(list(root.rglob("*.dat"))) == len(report.ingested) + len(reasons) == 11
    labels = {
        Path(r.metadata["source_path"]).relative_to(root).as_posix(): r.label
        for r in Corpus(tmp_path / "corpus").recordings
    }
    assert labels == {f"n-cars_train/{cls}/train{k}.dat": cls for cls in ("cars", "background") for k in range(2)}


def test_the_ingest_summary_counts_every_file_found(tmp_path, monkeypatch, capsys):
    from app.cli import main

    root = tmp_path / "ncars"
    dataset_layout(root, "ncars", per_class=2)
    write_events(root / "stray.dat", synthetic_events(20, SensorSize(100, 120)), SensorSize(100, 120))
    monkeypatch.setattr(sys, "argv", ["mem", "ingest", str(root), "--dataset", "ncars", "--out", str(tmp_path / "c")])
    with pytest.raises(SystemExit) as done:
        main()
    shown = capsys.readouterr().out
    assert done.value.code == 0
    assert "found" in shown and "11 files" in shown and "10 files" in shown and "left out (not ncars samples)" in shown
    assert f"left out {root / 'stray.dat'}: not a ncars sample (outside its layout)" in shown


def test_wrong_dataset_layout_is_reported_and_unknown_dataset_refused(tmp_path):
    report = ingest([tmp_path], tmp_path / "corpus", dataset="ncars")
    assert len(report.failed) == 1 and "ncars" in report.failed[0]["reason"]
    with pytest.raises(RecorderError, match=r"unknown dataset 'ncras'.*ncars"):
        ingest([tmp_path], tmp_path / "corpus", dataset="ncras")


def test_random_bytes_behind_a_dat_header_are_a_bad_file_not_a_recording(data_dir, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    real = sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[0]
    (folder / "real.dat").symlink_to(real)
    header = real.read_bytes()[: real.read_bytes().index(b"\n% Date") + 1] + b"% Date 2017-10-31 11:27:54\n"
    noise = np.random.default_rng(3).integers(0, 256, 8 * 5000, dtype=np.uint8).tobytes()
    (folder / "noise.dat").write_bytes(header + bytes([0, 8]) + noise)
    report = ingest([folder], tmp_path / "corpus")
    assert [e["path"] for e in report.ingested] == [str(folder / "real.dat")]
    assert [e["path"] for e in report.failed] == [str(folder / "noise.dat")]
    assert "time steps back" in report.failed[0]["reason"] and report.failure() is None


def test_an_ingest_that_gives_nothing_is_a_failure_and_a_partial_one_is_not(mixed_folder, tmp_path):
    folder, _, bad = mixed_folder
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    for path in bad:
        path.rename(tmp_path / "bad" / path.name)
    missing = tmp_path / "missing"
    assert ingest([missing], tmp_path / "c1").failure() == f"{missing}: no such file or directory"
    assert not (tmp_path / "c1").exists()  # nothing to ingest: no corpus was made for it
    empty = ingest([tmp_path / "empty"], tmp_path / "c2").failure()
    assert empty.startswith(f"{tmp_path / 'empty'}: no event files (.dat, .bin")
    assert ingest([tmp_path / "bad"], tmp_path / "c3").failure().startswith("none of the 3 files could be ingested")
    assert (
        ingest([tmp_path / "bad"], tmp_path / "c4", dataset="ncars")
        .failure()
        .startswith(f"{tmp_path / 'bad'}: no ncars")
    )
    assert ingest([folder, missing], tmp_path / "c5").failure() == f"{missing}: no such file or directory"
    partial = ingest([folder, tmp_path / "bad"], tmp_path / "c6")
    assert partial.failure() is None and len(partial.ingested) == 3 and len(partial.failed) == 3
    assert ingest([folder], tmp_path / "c6").failure() is None  # everything already ingested: nothing went wrong


def test_special_files_given_or_found_are_never_opened(mixed_folder, tmp_path):
    folder, good, _ = mixed_folder
    os.mkfifo(tmp_path / "pipe.dat")  # opening it would wait for a writer for good
    os.mkfifo(folder / "pipe.dat")
    (folder / "zero.dat").symlink_to("/dev/zero")  # reading it would never end
    assert ingest([tmp_path / "pipe.dat"], tmp_path / "c1").failure() == (
        f"{tmp_path / 'pipe.dat'}: not a regular file or a folder"
    )
    report = ingest([folder], tmp_path / "c2")
    assert sorted(e["path"] for e in report.ingested) == sorted(map(str, good))
    reasons = {e["path"]: e["reason"] for e in report.failed}  # found, never opened, and said why
    assert reasons[str(folder / "pipe.dat")] == "not a regular file (a FIFO)"
    assert reasons[str(folder / "zero.dat")] == "not a regular file (a character device)"


def test_an_out_that_cannot_be_a_corpus_is_one_line_before_any_file_is_read(mixed_folder, tmp_path):
    folder, _, _ = mixed_folder
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(CorpusError, match=r"taken: exists and is not a directory, so it cannot hold a corpus"):
        ingest([folder], tmp_path / "taken")
    with pytest.raises(CorpusError, match=r"cannot hold a corpus \(File name too long\)"):
        ingest([folder], tmp_path.joinpath(*["d" * 200] * 21))


@pytest.mark.slow  # worker processes
def test_worker_processes_give_the_same_corpus(mixed_folder, tmp_path):
    folder, _, _ = mixed_folder
    one = ingest([folder], tmp_path / "one")
    two = ingest([folder], tmp_path / "two", workers=2)
    assert [e["name"] for e in two.ingested] == [e["name"] for e in one.ingested]
    assert two.failed == one.failed
    a, b = corpus_by_source(tmp_path / "one"), corpus_by_source(tmp_path / "two")
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_full_disk_stops_the_ingest_and_keeps_what_was_committed(tmp_path, events_factory, small_disk):
    folder = tmp_path / "in"
    folder.mkdir()
    sensor = SensorSize(480, 640)
    for k in range(12):
        write_events(folder / f"{k:02d}.npz", events_factory(400_000, sensor, seed=k), sensor)
    out = tmp_path / "corpus"
    small_disk(out, 45_000_000)  # 1.4 MB of ballast and 20 MB kept free: room for some of the 12 recordings
    config = IngestConfig(paths=(folder,), out=out, progress=False, min_free_bytes=20_000_000, flush_interval_s=0)
    report = run(config)
    assert report.stopped is not None and "min_free_bytes" in report.stopped and not report.ok
    committed = Corpus(out).recordings
    assert 0 < len(committed) < 12
    stored = corpus_by_source(out)
    for path, events in stored.items():
        np.testing.assert_array_equal(events, read_events(path).events)


def mem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_recorded_corpus_is_ingested_recording_by_recording_with_labels_and_metadata(tmp_path, events_factory):
    from mem_core.corpus import CorpusWriter

    recorded, sensor = tmp_path / "session", SensorSize(32, 48)
    with CorpusWriter(recorded, shard_max_events=3000) as writer:  # one long session cut into two segments
        writer.add_recording("walk", events_factory(5000, sensor, seed=1), sensor, metadata={"camera": "sim"})
        writer.add_recording("cap-1", events_factory(400, sensor, seed=2), sensor, label="car", metadata={"k": 1})
    source = Corpus(recorded)
    out = tmp_path / "merged"
    report = ingest([recorded], out)
    assert report.ok and report.events == 5400
    merged = Corpus(out)
    assert [r.name for r in merged.recordings] == [f"session:{r.name.replace('/', ':')}" for r in source.recordings]
    for i, (got, want) in enumerate(zip(merged.recordings, source.recordings, strict=True)):
        assert got.label == want.label and got.sensor == want.sensor
        assert got.metadata["format"] == "corpus" and all(got.metadata[k] == v for k, v in want.metadata.items())
        np.testing.assert_array_equal(merged.events(i), source.events(i))
    again = ingest([recorded], out)  # recognised by corpus and recording name
    assert again.ingested == [] and len(again.skipped) == len(source.recordings)
    before = sorted(out.iterdir())
    into_itself = ingest([out], out)
    assert into_itself.failure() == f"{out}: is the output corpus: ingest it into another folder"
    assert sorted(out.iterdir()) == before and into_itself.report_path is None  # no report, no provenance in it


def test_cli_lists_bad_files_and_exits_nonzero_only_with_strict(mixed_folder, tmp_path):
    folder, _, bad = mixed_folder
    out = tmp_path / "corpus"
    done = mem("ingest", str(folder), "--out", str(out), "--min-free-mb", "0")
    assert done.returncode == 0, done.stderr
    for path in bad:
        assert f"failed {path}: " in done.stdout
    strict = mem("ingest", str(folder), "--out", str(out), "--strict", "--min-free-mb", "0")
    assert strict.returncode == 1
    assert len(Corpus(out).recordings) == 3


@pytest.mark.parametrize("what", ["missing", "empty folder"])
def test_cli_exits_nonzero_when_an_input_gives_nothing(tmp_path, what):
    path = tmp_path / "input"
    if what == "empty folder":
        path.mkdir()
    done = mem("ingest", str(path), "--out", str(tmp_path / "corpus"), "--min-free-mb", "0")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {path}: "), done.stderr


def test_inspect_reports_an_ingested_corpus(mixed_folder, tmp_path):
    folder, _, _ = mixed_folder
    out = tmp_path / "corpus"
    ingest([folder], out)
    info = mem("inspect", str(out), "--json")
    assert info.returncode == 0, info.stderr
    summary = json.loads(info.stdout.strip().splitlines()[-1])
    described = Corpus(out).describe()
    assert summary["recordings"] == 3
    for key in ("recordings", "events", "t_min", "t_max"):
        assert summary[key] == described[key]


def test_inspect_opens_every_shard_and_verify_reads_every_event(mixed_folder, tmp_path):
    folder, _, _ = mixed_folder
    out = tmp_path / "corpus"
    ingest([folder], out)
    shard = out / "shard-00000.h5"
    with h5py.File(shard, "r+") as f:  # still valid HDF5, but the events go back in time
        f["t"][10] = f["t"][9] - 5000
    quick = mem("inspect", str(out), "--json")
    assert quick.returncode == 0, quick.stderr  # the counts agree: only reading the events tells
    full = mem("inspect", str(out), "--verify", "--json")
    assert full.returncode == 1
    assert json.loads(full.stdout.strip().splitlines()[-1])["damaged_shards"].keys() == {"shard-00000.h5"}
    assert f"{shard}: recording 'in:a.dat': event 10 " in full.stderr
    data = bytearray(shard.read_bytes())
    data[200:208] = bytes(8)
    shard.write_bytes(data)
    damaged = mem("inspect", str(out))
    assert damaged.returncode == 1 and f"{shard}: damaged shard" in damaged.stderr
    assert damaged.stderr.strip().splitlines()[-1] == f"error: 1 of 1 shards of {out} are damaged"
