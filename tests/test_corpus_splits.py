"""The corpus dataset's validation split: guarded blocks of whole sessions, or of a session's slots, spread over the
corpus, never scattered slots, and windows that never cross from one split into the other; finetuning on a corpus
of short captures."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import synthetic_events

from mem_core.corpus import CorpusWriter
from mem_core.datasets import DatasetError
from mem_core.datasets.corpus import CorpusSource
from mem_core.events import SensorSize, make_events

SENSOR = SensorSize(16, 16)
SLOT = 100  # events per slot in these tests (the product's is 30 000)


def ramp(n: int, t0: int = 0) -> np.ndarray:
    """``n`` events whose times count up from ``t0``: a window's times say which events it read."""
    t = t0 + np.arange(n)
    return make_events(t, t % SENSOR.width, (t // SENSOR.width) % SENSOR.height, t % 2)


def build(root: Path, sessions: list[tuple[str, int, str | None]], segments: dict[str, int] | None = None) -> Path:
    """A corpus of ``(name, events, label)`` sessions, in that order; ``segments[name]`` cuts one into that many."""
    with CorpusWriter(root, min_free_bytes=0) as writer:
        t0 = 0
        for name, n, label in sessions:
            cuts = (segments or {}).get(name, 1)
            writer.begin_recording(name, SENSOR, label=label)
            for k, part in enumerate(np.array_split(ramp(n, t0), cuts)):
                if k:
                    writer.rotate()  # this part is a new segment (recording entry) of the same session
                writer.append(part)
            writer.end_recording()
            t0 += n
    return root


def held_out(root: Path, slot: int = SLOT) -> list[tuple[str, int, int]]:
    """(recording, first event, events) of every validation slot."""
    val = CorpusSource(root, "val", slot=slot)
    return [(val.corpus.recordings[rec].name, int(lo), int(n)) for rec, lo, n in val.samples[:, :3]]


def split_names(root: Path, split: str) -> list[str]:
    source = CorpusSource(root, split, slot=SLOT)
    return sorted({source.corpus.recordings[int(rec)].session for rec in source.samples[:, 0]})


def test_labelled_sessions_hold_out_a_tenth_of_each_class_in_guarded_blocks(tmp_path):
    sessions = [(f"c{k}", 50, "cars") for k in range(12)] + [(f"b{k}", 50, "background") for k in range(25)]
    order = sorted(sessions, key=lambda s: int(s[0][1:]))  # classes interleaved in corpus order
    root = build(tmp_path, order)
    # 1 of 12 cars, centred; 2 of 25 backgrounds (2.5 -> 2), one centred in each half; blocks of one: no guard
    assert split_names(root, "val") == ["b18", "b6", "c5"]
    assert set(split_names(root, "train")) == {name for name, _, _ in sessions} - {"b18", "b6", "c5"}


def test_a_labelled_session_of_several_segments_is_held_out_whole(tmp_path):
    root = build(tmp_path, [("c", 300, "x"), ("b", 300, "y"), ("a", 300, "x"), ("d", 300, "y")], {"c": 3})
    assert [name for name, _, _ in held_out(root)] == ["c", "c/1", "c/2", "b", "b", "b"]  # the first of 2 per class
    assert split_names(root, "train") == ["a", "d"]


def test_a_class_with_one_labelled_session_is_a_clear_error(tmp_path):
    root = build(tmp_path, [("a", 50, "cars"), ("b", 50, "background"), ("c", 50, "background")])
    message = "needs at least 2 labelled samples per class, one to train and one to validate; class 'cars' has 1"
    with pytest.raises(DatasetError, match=message):
        CorpusSource(root, "train", slot=SLOT)
    assert len(CorpusSource(root, "all", slot=SLOT)) == 3  # no split asked, nothing to refuse


def test_many_unlabelled_sessions_hold_out_a_twentieth_whole_in_blocks(tmp_path):
    root = build(tmp_path, [(f"s{k:02d}", 250, None) for k in range(40)])
    assert split_names(root, "val") == ["s09", "s29"]  # one centred in each half
    assert held_out(root) == [("s09", 0, 100), ("s09", 100, 150), ("s29", 0, 100), ("s29", 100, 150)]
    assert len(split_names(root, "train")) == 40 - 2


def test_few_unlabelled_sessions_hold_out_blocks_inside_each(tmp_path):
    # 45 slots -> 2 (5 %, rounded), slots 11 and 33, one centred in each half; 2 slots -> the first one; 1 slot ->
    # none. A session cut into segments is one stream: its slots run on through its segments (15 slots each).
    root = build(tmp_path, [("long", 4500, None), ("two", 200, None), ("one", 80, None)], {"long": 3})
    assert held_out(root) == [("long", 1100, 100), ("long/2", 300, 100), ("two", 0, 100)]
    train = CorpusSource(root, "train", slot=SLOT)
    assert len(train) == 45 - 2 + 1 + 1


def test_unlabelled_sessions_of_one_slot_each_hold_out_the_last_session(tmp_path):
    root = build(tmp_path, [("a", 80, None), ("b", 80, None), ("c", 80, None)])
    assert held_out(root) == [("c", 0, 80)]


def test_training_windows_never_reach_into_validation_or_guard_slots(tmp_path):
    """A window longer than its slot is centred on it, but stays on its side of the split (both ways), and never
    reads the guard slots around a validation block."""
    root = build(tmp_path, [("long", 40_000, None)])  # 400 slots: 20 held out, in 10 blocks of 2 with 1-slot guards
    train, val = CorpusSource(root, "train", slot=SLOT), CorpusSource(root, "val", slot=SLOT)
    blocks = sorted({lo // SLOT for _, lo, _ in held_out(root)})
    assert len(blocks) == 20 and len(train) == 400 - 20 - 20
    guarded = np.zeros(40_000, dtype=bool)  # events of validation slots and the slot on each side of a block
    for slot in blocks:
        guarded[(slot - 1) * SLOT : (slot + 2) * SLOT] = True
    rng = np.random.default_rng(0)
    for i in range(len(train)):
        for window in (train.load_window(i, 250, rng), train.load_window(i, 250, None)):
            t = window["t"]
            assert len(window) == 250 and not guarded[t].any(), f"training window {t.min()}..{t.max()}"
            assert t.max() - t.min() == 249  # one run of training slots, never across a held-out block
    window = val.load_window(0, 250, rng)["t"]
    first = blocks[0] * SLOT
    assert window.min() == first and window.max() == first + 2 * SLOT - 1  # its block alone, not its neighbours


def test_a_corpus_of_one_slot_is_shared_by_train_and_val_with_a_warning(tmp_path, caplog):
    root = build(tmp_path, [("only", 80, None)])
    with caplog.at_level(logging.WARNING, logger="mem_core.datasets.corpus"):
        train, val = CorpusSource(root, "train", slot=SLOT), CorpusSource(root, "val", slot=SLOT)
    assert len(train) == len(val) == 1
    assert "one 80-event slot: train and val share it" in caplog.text


@pytest.mark.slow
def test_finetune_from_a_pretrain_run_on_a_corpus_of_short_labelled_captures(tmp_path):
    """``mem finetune --dataset corpus --init PRETRAIN_RUN`` on captures of a few thousand events, one class each
    (what the live viewer saves): validation is the middle capture of each class, the others train."""
    from typer.testing import CliRunner

    from app.cli import app

    sensor = SensorSize(32, 32)
    corpus = tmp_path / "corpus"
    with CorpusWriter(corpus, min_free_bytes=0) as writer:
        for k in range(12):
            label = ("cars", "background")[k % 2]
            writer.add_recording(f"capture{k}", synthetic_events(2000 + 100 * k, sensor, seed=k), sensor, label=label)
    tiny = ["input.size=[32, 32]", "input.n_max=3000", "input.shift_px=2", "data.num_workers=0", "epochs=1"]
    vit = ["model.patch_size=8", "model.embed_dim=32", "model.depth=2", "model.num_heads=2", "batch_size=4"]
    tok = ["model.num_layers=3", "model.num_tokens=64", "model.hidden_dim=16", "model.codebook_dim=8", "batch_size=4"]
    common = ["--dataset", "corpus", "--data", str(corpus), "--preset", "cpu-tiny"]

    def stage(*args: str, sets: list[str]) -> None:
        result = CliRunner().invoke(app, [*args, *common, *[a for s in sets for a in ("--set", s)]])
        assert result.exit_code == 0, result.output + repr(result.exception)

    stage("tokenizer", "--out", str(tmp_path / "tok"), sets=tiny + tok)
    stage("pretrain", "--out", str(tmp_path / "pre"), "--tokenizer", str(tmp_path / "tok"), sets=tiny + vit)
    stage("finetune", "--out", str(tmp_path / "ft"), "--init", str(tmp_path / "pre"), sets=tiny + vit)
    result = json.loads((tmp_path / "ft" / "result.json").read_text())
    assert result["init"] == str(tmp_path / "pre")
    assert result["classes"] == ["background", "cars"]
    assert result["n"] == 2 and [sum(row) for row in result["confusion"]] == [1, 1]  # one held-out capture per class
    val = CorpusSource(corpus, "val", window=3000)
    assert [val.corpus.recordings[int(rec)].name for rec in val.samples[:, 0]] == ["capture4", "capture5"]
    train = json.loads((tmp_path / "ft" / "classes.json").read_text())
    assert train["train_samples"] == 12 - 2
