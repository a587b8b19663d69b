"""N-Caltech101 (Orchard et al., 2015): 101 object classes (incl. background), ``.bin`` files, fixed 80/20 split."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from mem_core.datasets.base import (
    DatasetError,
    EventSource,
    FileSource,
    read_text,
    require_dir,
    sample_file,
    sorted_files,
)
from mem_core.datasets.splits import SPLIT_SEED, VAL_FRACTION, block_split, stratified_split
from mem_core.events import SensorSize
from mem_core.files import temp_beside

NCALTECH_SENSOR = SensorSize(180, 240)
NCALTECH_TEST_FRACTION = 0.2


def ncaltech101_split(root: Path, split_file: Path | None = None) -> dict[str, list[list]]:
    """The fixed split ``{"train"|"val"|"test": [[relative path, class name], ...]}``: read, or made once and written.

    Classes are the exact folder names (no substring matching); 20 % of every class is test (random, as it always
    was), and val is the last 10 % of the rest of every class in file order (a block: see ``datasets.splits``). The
    split is deterministic: every process of a distributed run makes the same, and the first (``RANK`` 0) writes it.
    """
    root = Path(root)
    split_file = Path(split_file) if split_file else root / "mem-split.json"
    if split_file.is_file():
        return _read_split(split_file)
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise DatasetError(f"{root}: no N-Caltech101 class folders")
    files, labels = [], []
    for label, cls in enumerate(classes):
        found = sorted_files(root / cls, (".bin",))
        files += found
        labels += [label] * len(found)
    labels_arr = np.asarray(labels)
    trainval, test = stratified_split(labels_arr, NCALTECH_TEST_FRACTION, SPLIT_SEED)
    train_rel, val_rel = block_split(labels_arr[trainval], VAL_FRACTION)  # trainval is in file order
    split = {
        name: [[str(files[i].relative_to(root)), classes[labels[i]]] for i in idx]
        for name, idx in (("train", trainval[train_rel]), ("val", trainval[val_rel]), ("test", test))
    }
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every process makes the same split, one writes it
        write_split(split_file, split)
    return split


def _read_split(path: Path) -> dict[str, list[list]]:
    """A split file written by ``write_split`` (or by hand): ``{split: [[relative path, class name], ...]}``."""
    text = read_text(path)
    try:
        table = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise DatasetError(f"{path}: not a split file ({e})") from None
    if not (isinstance(table, dict) and all(isinstance(v, list) and all(map(_is_pair, v)) for v in table.values())):
        raise DatasetError(f"{path}: not a split file ({{split: [[path, class], ...]}})")
    return table


def _is_pair(entry: object) -> bool:
    return isinstance(entry, list) and len(entry) == 2 and all(isinstance(v, str) for v in entry)


def write_split(split_file: Path, split: dict[str, list[list]]) -> None:
    """Write ``split`` to ``split_file`` through a temporary file renamed over it: a process reading it meanwhile
    finds no file or the whole file, never part of one."""
    if not os.access(split_file.parent, os.W_OK):
        raise DatasetError(f"cannot write the split file {split_file}: pass data.split_file=<writable path>")
    fd, tmp = temp_beside(split_file)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(split, f, indent=1)
        os.replace(tmp, split_file)
    except OSError as e:
        raise DatasetError(f"cannot write the split file {split_file}: {e.strerror or e}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def ncaltech101(root: Path, split: str, split_file: Path | None = None, held_out: bool = True) -> EventSource:
    """``split`` of the fixed split (``ncaltech101_split``). ``held_out=False``: test, and as train every other sample
    of the classes (val and the guards around it, which neither split uses, included); no val."""
    root = require_dir(Path(root), "N-Caltech101 root")
    table = ncaltech101_split(root, split_file)
    if split not in table or (split == "val" and not held_out):
        shipped = "train, val, test" if held_out else "train, test"
        raise DatasetError(f"N-Caltech101 has splits {shipped}, not {split!r}")
    classes = sorted({cls for entries in table.values() for _, cls in entries})
    index = {c: i for i, c in enumerate(classes)}
    if split == "train" and not held_out:
        test = {Path(rel).with_suffix("") for rel, _ in table["test"]}  # by name: a sample may have been packed since
        kept = [
            (path, cls)
            for cls in classes
            for path in sorted_files(root / cls, (".bin",))
            if path.relative_to(root).with_suffix("") not in test
        ]
        files, labels = [path for path, _ in kept], [index[cls] for _, cls in kept]
    else:
        files = [sample_file(root / rel) for rel, _ in table[split]]
        labels = [index[cls] for _, cls in table[split]]
    return FileSource("ncaltech101", files, labels, classes, NCALTECH_SENSOR)
