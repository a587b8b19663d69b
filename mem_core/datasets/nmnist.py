"""N-MNIST (Orchard et al., 2015): saccade recordings of MNIST digits, 34 x 34 ATIS, ``.bin`` / ``.bs2`` files (or
``.evz`` packed from them)."""

from __future__ import annotations

from pathlib import Path

from mem_core.datasets.base import DatasetError, EventSource, FileSource, read_text, require_dir, sorted_files
from mem_core.datasets.splits import carve
from mem_core.events import SensorSize
from mem_core.io.evz import EXTENSION as PACKED

NMNIST_SENSOR = SensorSize(34, 34)


def nmnist(root: Path, split: str, held_out: bool = True) -> EventSource:
    """``split`` of N-MNIST under ``root``: val is carved from train (10 % in blocks, with guards that neither split
    uses). ``held_out=False``: train and test as shipped, nothing carved (and no val)."""
    root = require_dir(Path(root), "N-MNIST root")
    if not held_out and split == "val":
        raise DatasetError("N-MNIST ships no val split (it is carved from train)")
    classes = [str(d) for d in range(10)]
    base = "test" if split == "test" else "train"
    official = root / base.capitalize()
    files: list[Path] = []
    labels: list[int] = []
    if official.is_dir():
        for label, cls in enumerate(classes):
            found = sorted_files(official / cls, (".bin", ".bs2")) if (official / cls).is_dir() else []
            files += found
            labels += [label] * len(found)
    else:
        lists = sorted(p for p in root.glob("*.txt") if p.name.lower().startswith(base))
        if not lists:
            raise DatasetError(f"{root}: no N-MNIST {base} list file ({base}*.txt with '<id> <class>' lines)")
        for n, line in enumerate(read_text(lists[0]).splitlines(), 1):
            parts = line.split()
            if len(parts) < 2 or line.lstrip().startswith("#"):
                continue
            sample, label = parts[0], parts[1]
            if label not in classes:  # compared as text: int() of 5,000 digits raised
                raise DatasetError(f"{lists[0]}: line {n}: class {label[:20]!r} is not a digit 0-9")
            label = int(label)
            path = next(
                (root / f"{sample}{ext}" for ext in (".bs2", ".bin", PACKED) if (root / f"{sample}{ext}").exists()),
                None,
            )
            if path is None:
                raise DatasetError(f"{lists[0]}: sample {sample} has no {sample}.bs2, .bin or {PACKED} in {root}")
            files.append(path)
            labels.append(label)
    if split in ("train", "val"):
        if held_out:
            files, labels = carve(files, labels, split)
    elif split != "test":
        raise DatasetError(f"N-MNIST has splits train, val, test, not {split!r}")
    return FileSource("nmnist", files, labels, classes, NMNIST_SENSOR)
