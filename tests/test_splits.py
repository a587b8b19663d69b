"""Validation splits the product carves itself are contiguous blocks per class spread over the data, each with a
guard that neither split uses, never random samples and never one corner of the data.

Sample ids run in recording order, so a random carve-out puts recording neighbours of every validation sample into
training and overstates accuracy on unseen recordings; a single block at the end covers too few recordings to rank
models as unseen recordings do (docs/RESULTS.md, section 2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from mem_core.datasets import open_source
from mem_core.datasets.base import sorted_files
from mem_core.datasets.splits import GUARD, TRAIN, VAL, block_split, held_out_blocks


def ids(files) -> list[int]:
    return [int(re.findall(r"\d+", Path(f).name)[0]) for f in files]


def runs(positions: np.ndarray) -> list[np.ndarray]:
    """Maximal runs of consecutive positions."""
    return np.split(positions, np.flatnonzero(np.diff(positions) > 1) + 1) if len(positions) else []


def assert_val_is_guarded_blocks_spread_over_each_class(by_class: dict[int, list[int]], train, val, blocks: int):
    """Per class, in id order: ``blocks`` runs of validation ids, one in each of ``blocks`` equal stretches of the
    ids, no training id next to a validation id (the guard), and every id in at most one split."""
    for label, all_ids in by_class.items():
        order = sorted(all_ids)
        v = np.searchsorted(order, sorted(np.asarray(ids(val.files))[val.labels == label]))
        t = np.searchsorted(order, sorted(np.asarray(ids(train.files))[train.labels == label]))
        assert len(v) and len(t) and not set(v) & set(t)
        assert len(runs(v)) == blocks, f"class {label}: validation positions {v} are not {blocks} blocks"
        stretches = [r[0] * blocks // len(order) for r in runs(v)]
        assert stretches == list(range(blocks)), f"class {label}: {v} is not one block in each of {blocks} stretches"
        assert not set(np.concatenate([v - 1, v + 1])) & set(t), f"class {label}: a training id touches {v}"


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_ncars_carves_validation_as_guarded_blocks_spread_over_each_class(tmp_path):
    by_class = {0: list(range(0, 400, 2)), 1: list(range(1, 400, 2))}  # ids of both classes interleaved, as in N-Cars
    for label, cls in enumerate(("background", "cars")):
        for i in by_class[label]:
            touch(tmp_path / "n-cars_train" / cls / f"obj_{i:06d}_td.dat")
    train, val = open_source("ncars", tmp_path, "train"), open_source("ncars", tmp_path, "val")
    assert (len(train), len(val)) == (320, 40)  # 10 blocks of 2 per class, each with 1 guard id on both sides
    assert_val_is_guarded_blocks_spread_over_each_class(by_class, train, val, blocks=10)


def test_nmnist_carves_validation_as_guarded_blocks_spread_over_each_class(tmp_path):
    by_class = {d: list(range(d * 1000 + 1, d * 1000 + 201)) for d in range(10)}
    for d, numbers in by_class.items():
        for i in numbers:
            touch(tmp_path / "Train" / str(d) / f"{i}.bin")  # unpadded names: file order is numeric order
    train, val = open_source("nmnist", tmp_path, "train"), open_source("nmnist", tmp_path, "val")
    assert (len(train), len(val)) == (1600, 200)
    assert_val_is_guarded_blocks_spread_over_each_class(by_class, train, val, blocks=10)


def test_ncaltech101_val_is_guarded_blocks_of_each_class_in_what_is_not_test(tmp_path):
    for cls in ("ant", "elephant"):
        for i in range(1, 41):
            touch(tmp_path / cls / f"image_{i:04d}.bin")
    open_source("ncaltech101", tmp_path, "train")
    split = json.loads((tmp_path / "mem-split.json").read_text())
    for cls in ("ant", "elephant"):
        train = [int(rel[-8:-4]) for rel, c in split["train"] if c == cls]
        val = [int(rel[-8:-4]) for rel, c in split["val"] if c == cls]
        assert len(val) == 3 and len(train) == 29  # 10 % of the 32 non-test files: 3 blocks of 1, too small to guard
        assert min(val) < 15 and max(val) > 25 and not set(val) & set(train)


def test_files_are_listed_in_numeric_order(tmp_path):
    for i in (1, 2, 10, 100):
        touch(tmp_path / f"{i}.bin")
    assert [p.name for p in sorted_files(tmp_path, (".bin",))] == ["1.bin", "2.bin", "10.bin", "100.bin"]


def test_block_split_holds_out_guarded_blocks_of_every_class():
    labels = np.tile([0, 1], 200)  # 200 samples per class, interleaved
    kept, taken = block_split(labels, 0.1)
    for c in (0, 1):
        positions = np.flatnonzero(np.isin(np.flatnonzero(labels == c), taken))  # in the class's own order
        assert [len(r) for r in runs(positions)] == [2] * 10
        assert [r[0] // 20 for r in runs(positions)] == list(range(10))  # one block in each tenth
    assert len(kept) == 400 - 40 - 40  # a guard of 1 on both sides of each block, in neither split
    assert not set(kept) & set(taken)


def test_held_out_blocks_keep_training_data_in_small_sequences():
    assert list(held_out_blocks(2, 0.1)) == [VAL, TRAIN]
    assert list(held_out_blocks(1, 0.1)) == [TRAIN]  # nothing to validate on without losing all training data
    roles = held_out_blocks(40, 0.1)
    assert list(roles).count(VAL) == 4 and GUARD not in roles  # blocks of one sample: no guard
    roles = held_out_blocks(100, 0.2)
    assert list(roles).count(VAL) == 20 and list(roles).count(GUARD) == 20  # blocks of 2, a guard of 1 each side
    for n in range(2, 60):
        roles = held_out_blocks(n, 0.3)
        assert (roles == TRAIN).sum() >= (roles == VAL).sum() >= 1
