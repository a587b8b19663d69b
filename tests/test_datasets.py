"""The dataset registry: layouts, splits, labels, label fractions and the windows a DataLoader gets."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import synthetic_events

from mem_core.corpus import CorpusError, CorpusWriter
from mem_core.datasets import DatasetError, WindowDataset, collate_windows, label_subset, open_source
from mem_core.events import SensorSize
from mem_core.io import write_events
from mem_core.io.pack import pack_folder
from mem_core.representation import InputSpec

SPEC = InputSpec(n_max=500, size=(32, 32))


def test_ncars_dev_splits_on_real_files(data_dir):
    train = open_source("ncars", data_dir / "ncars-dev", "train")
    val = open_source("ncars", data_dir / "ncars-dev", "val")
    assert (len(train), len(val)) == (3000, 1000)
    assert train.classes == ["background", "cars"] and train.sensor == SensorSize(100, 120)
    assert np.bincount(train.labels).tolist() == [1500, 1500]
    assert set(map(str, train.files)).isdisjoint(map(str, val.files))
    events = train.load(0)
    assert len(events) > 0 and events["x"].max() < 120 and events["y"].max() < 100
    assert "cars" in str(train.files[int(np.flatnonzero(train.labels == 1)[0])])


def test_ncars_official_layout_carves_a_fixed_validation_split(tmp_path, data_dir):
    for split in ("n-cars_train", "n-cars_test"):
        for cls in ("cars", "background"):
            (tmp_path / split / cls).mkdir(parents=True)
            for src in sorted((data_dir / "ncars-dev" / "val" / cls).glob("*.dat"))[:20]:
                (tmp_path / split / cls / src.name).symlink_to(src)
    train, val, test = (open_source("ncars", tmp_path, s) for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (36, 4, 40)
    assert set(map(str, train.files)).isdisjoint(map(str, val.files))
    assert open_source("ncars", tmp_path, "val").files == val.files  # the same carve-out every time


def test_nmnist_list_files(data_dir):
    test = open_source("nmnist", data_dir / "nmnist-small", "test")
    train = open_source("nmnist", data_dir / "nmnist-small", "train")
    val = open_source("nmnist", data_dir / "nmnist-small", "val")
    assert len(test) == 100 and len(val) == 100 and len(train) == 900  # blocks of 1 sample per class: no guard
    assert test.classes == [str(d) for d in range(10)] and test.sensor == SensorSize(34, 34)
    assert len(test.load(3)) > 0


def make_ncaltech(root, classes=("Faces_easy", "ant", "elephant", "BACKGROUND_Google"), per_class=10):
    sensor = SensorSize(180, 240)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            ev = synthetic_events(50, SensorSize(100, 200), seed=100 * c + i)
            write_events(root / name / f"image_{i:04d}.bin", ev, sensor)


def test_ncaltech101_split_is_written_once_and_exact(tmp_path):
    make_ncaltech(tmp_path)
    train = open_source("ncaltech101", tmp_path, "train")
    split = json.loads((tmp_path / "mem-split.json").read_text())
    assert {k: len(v) for k, v in split.items()} == {"train": 28, "val": 4, "test": 8}
    # exact class names: 'ant' is not matched inside 'elephant'
    assert train.classes == ["BACKGROUND_Google", "Faces_easy", "ant", "elephant"]
    for rel, cls in split["train"] + split["test"]:
        assert rel.split("/")[0] == cls
    # every class is in every split, and the splits do not overlap
    names = {k: {rel for rel, _ in v} for k, v in split.items()}
    assert not (names["train"] & names["test"]) and not (names["val"] & names["test"])
    test = open_source("ncaltech101", tmp_path, "test")
    assert sorted(set(test.labels.tolist())) == [0, 1, 2, 3]
    # the written file is the truth from now on, even if files are added
    write_events(tmp_path / "ant" / "image_9999.bin", synthetic_events(50, SensorSize(100, 200)), SensorSize(180, 240))
    assert open_source("ncaltech101", tmp_path, "train").files == train.files


def test_nimagenet_layout(tmp_path):
    sensor = SensorSize(480, 640)
    for wnid in ("n01440764", "n01443537"):
        for split in ("train", "val"):
            (tmp_path / split / wnid).mkdir(parents=True)
            write_events(tmp_path / split / wnid / "a.npz", synthetic_events(80, sensor), sensor)
    src = open_source("nimagenet", tmp_path, "val")
    assert src.classes == ["n01440764", "n01443537"] and len(src) == 2 and len(src.load(1)) == 80


def make_dsec(root, n_labels=3):
    from PIL import Image

    seq = root / "train" / "zurich_city_00_a"
    sensor = SensorSize(480, 640)
    rng = np.random.default_rng(0)
    n = 20_000
    t = np.sort(rng.integers(0, 400_000, n))
    ev = synthetic_events(n, sensor)
    ev["t"] = t
    (seq / "events" / "left").mkdir(parents=True)
    write_events(seq / "events" / "left" / "events.h5", ev, sensor)
    labels = seq / "semantic" / "left" / "11classes"
    (labels / "data").mkdir(parents=True)
    stamps = []
    for i in range(n_labels):
        mask = rng.integers(0, 11, (440, 640)).astype(np.uint8)
        Image.fromarray(mask).save(labels / "data" / f"{i:06d}.png")
        stamps.append(100_000 + i * 100_000)
    (labels / "timestamps.txt").write_text("\n".join(map(str, stamps)) + "\n")
    return ev, stamps


def test_dsec_semantic_gives_50ms_before_each_label(tmp_path):
    ev, stamps = make_dsec(tmp_path)
    src = open_source("dsec-semantic", tmp_path, "train")
    assert len(src) == 3 and len(src.classes) == 11 and src.sensor == SensorSize(440, 640)
    got = src.load(1)
    expected = ev[(ev["t"] >= stamps[1] - 50_000) & (ev["t"] < stamps[1]) & (ev["y"] < 440)]
    assert np.array_equal(got["t"], expected["t"]) and np.array_equal(got["x"], expected["x"])
    assert src.mask(1).shape == (440, 640)


def test_dsec_semantic_refuses_an_events_file_that_keeps_a_column_elsewhere(tmp_path):
    make_dsec(tmp_path)
    events = tmp_path / "train" / "zurich_city_00_a" / "events" / "left" / "events.h5"
    secret = tmp_path / "secret.txt"
    secret.write_bytes(bytes(20_000))
    with h5py.File(events, "r+") as f:  # events/p read from another file, as a hostile download could declare it
        del f["events/p"]
        f["events"].create_dataset("p", shape=(20_000,), dtype="u1", external=[(str(secret), 0, 20_000)])
    src = open_source("dsec-semantic", tmp_path, "train")
    with pytest.raises(DatasetError, match=r"events\.h5: refused: dataset events/p keeps its data in external files"):
        src.load(0)


def test_corpus_source_with_labels_and_slots(tmp_path):
    sensor = SensorSize(32, 48)
    with CorpusWriter(tmp_path) as writer:
        writer.add_recording("long", synthetic_events(100_000, sensor), sensor)
        for k, label in enumerate(["cars", "background", "cars", "background"]):
            writer.add_recording(f"r{k}", synthetic_events(500, sensor, seed=k + 1), sensor, label=label)
    everything = open_source("corpus", tmp_path, "all")
    assert len(everything) == 3 + 4  # 100 000 events make three 30 000-event slots, plus four short recordings
    assert everything.classes == ["background", "cars"]
    assert sorted(everything.labels.tolist()) == [-1, -1, -1, 0, 0, 1, 1]
    train, val = open_source("corpus", tmp_path, "train"), open_source("corpus", tmp_path, "val")
    assert len(train) + len(val) == len(everything)  # too few slots and sessions for a guard
    held_out = [(val.corpus.recordings[int(rec)].name, int(lo)) for rec, lo in val.samples[:, :2]]
    assert held_out == [("long", 30_000), ("r0", 0), ("r1", 0)]  # the long one's middle slot, each class's first
    window = everything.load_window(0, 1000, np.random.default_rng(0))
    assert len(window) == 1000 and np.all(np.diff(window["t"]) >= 0)


def test_corpus_epoch_reads_every_event_once_in_model_windows(tmp_path):
    """With the model's window, an epoch holds a sample per window of the corpus, not one per 30 000-event slot, and
    a training window never leaves its slot (so never crosses into the validation slots)."""
    sensor = SensorSize(32, 48)
    events = synthetic_events(100_000, sensor)
    with CorpusWriter(tmp_path) as writer:
        writer.add_recording("long", events, sensor)
    slots = open_source("corpus", tmp_path, "all")
    windows = open_source("corpus", tmp_path, "all", window=5000)
    assert len(slots) == 3 and len(windows) == 6 + 6 + 8  # the last slot holds 40 000 events
    covered = np.concatenate([windows.load(i)["t"] for i in range(len(windows))])
    assert np.array_equal(covered, events["t"])  # evaluation samples tile the corpus
    train = open_source("corpus", tmp_path, "train", window=5000)
    assert len(train) == 6 + 8  # the middle slot is validation
    rng = np.random.default_rng(0)
    starts = {int(train.load_window(0, 5000, rng)["t"][0]) for _ in range(50)}
    assert len(starts) > 10  # fresh windows every epoch
    for i in range(len(train)):
        window = train.load_window(i, 5000, rng)["t"]
        assert window[-1] <= events["t"][29_999] or window[0] >= events["t"][60_000]


def corpus_with_a_damaged_shard(root: Path) -> Path:
    """Three shards of two recordings each; the middle shard's metadata is damaged. Returns that shard."""
    sensor = SensorSize(32, 48)
    with CorpusWriter(root) as writer:
        for k in range(6):
            writer.add_recording(f"r{k}", synthetic_events(5000, sensor, seed=k), sensor)
            if k % 2:
                writer.rotate()
    shard = root / "shard-00001.h5"
    data = bytearray(shard.read_bytes())
    data[200:208] = bytes(8)
    shard.write_bytes(data)
    return shard


def test_a_damaged_corpus_shard_stops_before_training_or_is_skipped(tmp_path, caplog):
    shard = corpus_with_a_damaged_shard(tmp_path)
    with pytest.raises(CorpusError, match=rf"^{shard}: damaged shard .*--skip-bad") as info:
        open_source("corpus", tmp_path, "all")
    assert "\n" not in str(info.value)
    source = open_source("corpus", tmp_path, "all", skip_bad=True)
    assert "left out the recordings of 1 damaged shard(s): " + str(shard) in caplog.text
    assert list(source.skipped) == ["shard-00001.h5"] and len(source) == 4
    read = {source.corpus.recordings[int(source.samples[i, 0])].name for i in range(len(source))}
    assert read == {"r0", "r1", "r4", "r5"}
    assert all(len(source.load(i)) == 5000 for i in range(len(source)))


@pytest.mark.slow
def test_training_on_a_damaged_corpus_stops_at_once_unless_told_to_skip_bad_shards(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from app.cli import app
    from mem_core.train import tokenizer
    from mem_core.train.data import open_split

    shard = corpus_with_a_damaged_shard(tmp_path)
    args = ["tokenizer", "--dataset", "corpus", "--data", str(tmp_path), "--out", str(tmp_path / "run")]
    stopped = CliRunner().invoke(app, args)
    assert isinstance(stopped.exception, CorpusError) and str(stopped.exception).startswith(f"{shard}: damaged shard")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    configs = []
    monkeypatch.setattr(tokenizer, "run", lambda cfg, out, resume: configs.append(cfg))
    CliRunner().invoke(app, [*args, "--skip-bad", "--verify"])
    assert configs[0].data.skip_bad and configs[0].data.verify
    assert list(open_split(configs[0], "train").skipped) == ["shard-00001.h5"]


def assert_same_samples(name: str, root: Path, packed: Path, split: str) -> None:
    """The dataset ``name`` reads the same samples (files by stem, order, labels, events) from ``packed`` as from
    ``root``."""
    a, b = open_source(name, root, split), open_source(name, packed, split)
    assert (a.classes, a.sensor, a.labels.tolist()) == (b.classes, b.sensor, b.labels.tolist())
    assert [p.relative_to(root).with_suffix("") for p in a.files] == [
        p.relative_to(packed).with_suffix("") for p in b.files
    ]
    assert all(p.suffix == ".evz" for p in b.files)
    for i in range(len(a)):
        np.testing.assert_array_equal(a.load(i), b.load(i))


def test_a_packed_ncars_folder_reads_as_the_original(data_dir, tmp_path):
    root = tmp_path / "ncars"
    for split in ("train", "val", "test"):
        for cls in ("cars", "background"):
            (root / split / cls).mkdir(parents=True)
            for real in sorted((data_dir / "ncars-dev" / split / cls).glob("*.dat"))[:4]:
                (root / split / cls / real.name).symlink_to(real)
    pack_folder(root, tmp_path / "packed", workers=1)
    for split in ("train", "val", "test"):
        assert_same_samples("ncars", root, tmp_path / "packed", split)


def test_a_sample_both_packed_and_not_is_refused(tmp_path):
    (tmp_path / "train" / "cars").mkdir(parents=True)
    for suffix in (".dat", ".evz"):
        write_events(tmp_path / "train" / "cars" / f"obj_1{suffix}", synthetic_events(10), SensorSize(100, 120))
    (tmp_path / "train" / "background").mkdir()
    with pytest.raises(DatasetError, match=r"sample 'obj_1' is there twice \(obj_1\.(dat|evz) and obj_1\.(evz|dat)\)"):
        open_source("ncars", tmp_path, "train")


def test_a_packed_nmnist_folder_reads_as_the_original(data_dir, tmp_path):
    root = tmp_path / "nmnist"
    root.mkdir()
    lists = {"train12.txt": list(range(1, 13)), "test4.txt": list(range(60001, 60005))}
    for name, ids in lists.items():
        (root / name).write_text("#sample #class\n" + "".join(f"{i} {i % 10}\n" for i in ids))
        for i in ids:
            (root / f"{i}.bs2").symlink_to(data_dir / "nmnist-small" / f"{i}.bs2")
    pack_folder(root, tmp_path / "packed", workers=1)
    for split in ("train", "val", "test"):
        assert_same_samples("nmnist", root, tmp_path / "packed", split)


def test_a_packed_ncaltech101_folder_reads_as_the_original(tmp_path):
    root, packed = tmp_path / "ncaltech", tmp_path / "packed"
    make_ncaltech(root)
    open_source("ncaltech101", root, "train")  # writes the split file, which the packed folder gets a copy of
    pack_folder(root, packed, workers=1)
    for split in ("train", "val", "test"):
        assert_same_samples("ncaltech101", root, packed, split)
    (packed / "mem-split.json").unlink()  # the split made anew from the packed files is the same
    for split in ("train", "val", "test"):
        assert_same_samples("ncaltech101", root, packed, split)


def test_unknown_names_and_bad_roots_are_clear_errors(tmp_path):
    with pytest.raises(DatasetError, match="unknown dataset 'ncar'"):
        open_source("ncar", tmp_path, "train")
    with pytest.raises(DatasetError, match="N-Cars root not found"):
        open_source("ncars", tmp_path / "missing", "train")
    with pytest.raises(DatasetError, match="no N-Cars split 'test'"):
        open_source("ncars", tmp_path, "test")


def test_label_subset_is_stratified_and_seeded():
    labels = np.repeat(np.arange(4), [100, 50, 30, 20])
    a = label_subset(labels, 0.1, seed=3)
    assert np.bincount(labels[a]).tolist() == [10, 5, 3, 2]
    assert np.array_equal(a, label_subset(labels, 0.1, seed=3))
    assert not np.array_equal(a, label_subset(labels, 0.1, seed=4))
    assert len(label_subset(labels, 1.0, seed=0)) == 200
    with pytest.raises(DatasetError, match="label fraction"):
        label_subset(labels, 0.0, seed=0)


def test_windows_are_random_at_train_and_fixed_at_evaluation():
    src = open_source("sim", None, "val")
    train = WindowDataset(src, SPEC, train=True, seed=0)
    evaluation = WindowDataset(src, SPEC, train=False)
    e0, label, mask = evaluation[(0, 0)]
    assert np.array_equal(e0, evaluation[(0, 5)][0])  # evaluation ignores the epoch
    assert len(e0) <= 500 and label == 0 and mask.shape == (128, 128)
    a, b = train[(0, 0)][0], train[(0, 1)][0]
    assert np.array_equal(a, train[(0, 0)][0]) and not np.array_equal(a, b)
    batch, labels, masks = collate_windows([evaluation[(i, 0)] for i in range(4)], src.sensor)
    assert len(batch) == 4 and labels.tolist() == [0, 1, 2, 3] and masks.shape == (4, 128, 128)


def ncars_files(data_dir: Path, per_class: int) -> tuple[list[Path], list[int]]:
    files, labels = [], []
    for label, cls in enumerate(("background", "cars")):
        found = sorted((data_dir / "ncars-dev" / "val" / cls).glob("*.dat"))[:per_class]
        files += found
        labels += [label] * len(found)
    return files, labels


@pytest.mark.slow  # a loader worker process
def test_a_loader_of_preloaded_files_draws_the_batches_it_draws_reading_them_at_every_epoch(data_dir):
    from mem_core.datasets import FileSource
    from mem_core.datasets.preload import PreloadedSource
    from mem_core.train.data import build_loader
    from mem_core.train.runtime import Runtime

    files, labels = ncars_files(data_dir, 12)
    source = FileSource("ncars", files, labels, ["background", "cars"], SensorSize(100, 120))
    spec = InputSpec(n_max=3000, size=(112, 112), event_drop_p=0.75, hflip_p=0.5, shift_px=15)
    indices = np.arange(2, 22)
    drawn = []
    for workers, preload_mib in ((0, 0), (1, 64)):  # a worker process forked after the preload shares it
        loader, sampler = build_loader(
            source,
            spec,
            train=True,
            seed=3,
            batch_size=8,
            runtime=Runtime(torch.device("cpu")),
            num_workers=workers,
            indices=indices,
            preload_mib=preload_mib,
        )
        assert isinstance(loader.dataset.source, PreloadedSource) == bool(preload_mib)
        batches = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            batches += [(b.t, b.x, b.y, b.p, b.lengths, y) for b, y, _ in loader]
        drawn.append(batches)
    assert len(drawn[0]) == 4
    for read, held in zip(*drawn, strict=True):
        for a, b in zip(read, held, strict=True):
            assert torch.equal(a, b)


def test_preloading_holds_copies_within_its_budget_and_says_when_the_files_are_read_instead(
    data_dir, tmp_path, monkeypatch
):
    from mem_core.datasets import FileSource
    from mem_core.datasets import preload as preloading
    from mem_core.datasets.preload import preload
    from mem_core.datasets.unlabeled import JoinedSource, open_unlabeled

    files, labels = ncars_files(data_dir, 4)
    labelled = FileSource("ncars", files, labels, ["background", "cars"], SensorSize(100, 120))
    folder = tmp_path / "recorded"
    folder.mkdir()
    for k in range(5):
        write_events(folder / f"r{k}.evz", synthetic_events(400, SensorSize(100, 120), seed=k), SensorSize(100, 120))
    joined = JoinedSource([labelled, open_unlabeled(folder, SensorSize(100, 120), 500)])
    said = []
    held = preload(joined, np.array([1, 3, 9, 11]), 2**20, say=said.append)
    assert [len(part.slot) for part in held.sources] == [8, 5] and held.name == joined.name
    assert (held.labels == -1).all() and len(held) == 13
    for i in range(13):  # held (1, 3, 9, 11) or read (the others), every sample is what its file holds
        np.testing.assert_array_equal(held.load(i), joined.load(i))
    window = held.load(9)
    window["x"] = 0  # what a loader does to a window never reaches the held events
    np.testing.assert_array_equal(held.load(9), joined.load(9))

    monkeypatch.setattr(preloading, "CHUNK_SAMPLES", 3)  # the samples held in three arrays
    chunked = preload(labelled, np.arange(8), 2**20)
    assert len(chunked.chunks) == 3
    for i in range(8):
        np.testing.assert_array_equal(chunked.load(i), labelled.load(i))

    events = sum(len(labelled.load(i)) for i in range(8)) * 13
    assert preload(labelled, np.arange(8), events // 2, say=said.append) is labelled
    assert len(said) == 1 and said[0].startswith("ncars: 8 samples read from their files at every epoch: about ")
