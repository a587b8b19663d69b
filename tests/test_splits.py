"""Validation splits the product carves itself are contiguous blocks per class, never random samples.

Sample ids run in recording order, so a random carve-out puts recording neighbours of every validation sample into
training and overstates accuracy on unseen recordings (docs/RESULTS.md); a block per class does not.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from mem_core.datasets import open_source
from mem_core.datasets.base import sorted_files
from mem_core.datasets.splits import block_split


def ids(files) -> list[int]:
    return [int(re.findall(r"\d+", Path(f).name)[0]) for f in files]


def assert_val_is_the_last_block_of_each_class(source_all_ids: dict[int, list[int]], train, val) -> None:
    """Per class: val ids are the largest ids of that class (one contiguous run of its samples), train the rest."""
    for label, all_ids in source_all_ids.items():
        v = sorted(np.asarray(ids(val.files))[val.labels == label])
        t = sorted(np.asarray(ids(train.files))[train.labels == label])
        assert v and t and sorted(all_ids) == sorted(t + v)
        assert max(t) < min(v), f"class {label}: validation ids {v} are not a block after the training ids"


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_ncars_carves_validation_as_a_block_per_class(tmp_path):
    by_class = {0: list(range(0, 100, 2)), 1: list(range(1, 100, 2))}  # ids of both classes interleaved, as in N-Cars
    for label, cls in enumerate(("background", "cars")):
        for i in by_class[label]:
            touch(tmp_path / "n-cars_train" / cls / f"obj_{i:06d}_td.dat")
    train, val = open_source("ncars", tmp_path, "train"), open_source("ncars", tmp_path, "val")
    assert (len(train), len(val)) == (90, 10)
    assert_val_is_the_last_block_of_each_class(by_class, train, val)


def test_nmnist_carves_validation_as_a_block_per_class(tmp_path):
    by_class = {d: list(range(d * 1000 + 1, d * 1000 + 21)) for d in range(10)}
    for d, numbers in by_class.items():
        for i in numbers:
            touch(tmp_path / "Train" / str(d) / f"{i}.bin")  # unpadded names: file order is numeric order
    train, val = open_source("nmnist", tmp_path, "train"), open_source("nmnist", tmp_path, "val")
    assert (len(train), len(val)) == (180, 20)
    assert_val_is_the_last_block_of_each_class(by_class, train, val)


def test_ncaltech101_val_is_a_block_of_each_class_in_what_is_not_test(tmp_path):
    for cls in ("ant", "elephant"):
        for i in range(1, 41):
            touch(tmp_path / cls / f"image_{i:04d}.bin")
    open_source("ncaltech101", tmp_path, "train")
    split = json.loads((tmp_path / "mem-split.json").read_text())
    for cls in ("ant", "elephant"):
        train = [int(rel[-8:-4]) for rel, c in split["train"] if c == cls]
        val = [int(rel[-8:-4]) for rel, c in split["val"] if c == cls]
        assert len(val) == 3 and max(train) < min(val)  # 10 % of the 32 non-test files: the last 3 of them


def test_files_are_listed_in_numeric_order(tmp_path):
    for i in (1, 2, 10, 100):
        touch(tmp_path / f"{i}.bin")
    assert [p.name for p in sorted_files(tmp_path, (".bin",))] == ["1.bin", "2.bin", "10.bin", "100.bin"]


def test_block_split_takes_the_tail_of_each_class_in_order():
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    kept, taken = block_split(labels, 0.4)
    np.testing.assert_array_equal(taken, [6, 7, 8, 9])
    np.testing.assert_array_equal(kept, [0, 1, 2, 3, 4, 5])
