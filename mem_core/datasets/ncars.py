"""N-Cars (Sironi et al., CVPR 2018): 100 ms Prophesee ``.dat`` samples (or ``.evz`` packed from them) of cars and
background, 120 x 100 ATIS."""

from __future__ import annotations

from pathlib import Path

from mem_core.datasets.base import DatasetError, EventSource, FileSource, require_dir, sorted_files
from mem_core.datasets.splits import carve
from mem_core.events import SensorSize

NCARS_CLASSES = ["background", "cars"]
NCARS_SENSOR = SensorSize(100, 120)
NCARS_SAMPLE_US = 100_000  # every sample is 100 ms of events (Sironi et al., 2018)


def ncars(root: Path, split: str, held_out: bool = True) -> EventSource:
    """``split`` of the N-Cars layout under ``root``; without a ``val/`` folder val is carved from train (10 % in
    blocks, with guards that neither split uses). ``held_out=False``: the splits as shipped, nothing carved."""
    root = require_dir(Path(root), "N-Cars root")
    official = {"train": "n-cars_train", "test": "n-cars_test"}
    carved = False
    if (root / split).is_dir():
        folder = root / split
    elif split in official and (root / official[split]).is_dir():
        folder = root / official[split]
    elif held_out and split == "val" and ((root / "train").is_dir() or (root / "n-cars_train").is_dir()):
        folder, carved = (root / "train" if (root / "train").is_dir() else root / "n-cars_train"), True
    elif all((root / cls).is_dir() for cls in NCARS_CLASSES):  # the class folders one level too high
        raise DatasetError(f"{root}: holds cars/ and background/ directly; N-Cars wants them inside train/ and test/")
    else:
        folders = f"{split}/" + (f" or {official[split]}/" if split in official else "")
        raise DatasetError(f"{root}: no N-Cars split {split!r} (a {folders} folder holding cars/ and background/)")
    files, labels = [], []
    for label, cls in enumerate(NCARS_CLASSES):
        if not (folder / cls).is_dir():
            raise DatasetError(
                f"{folder}: holds no {cls}/ folder, and an N-Cars split holds cars/ and background/", folder
            )
        found = sorted_files(folder / cls, (".dat",))
        files += found
        labels += [label] * len(found)
    if carved or (held_out and split == "train" and not (root / "val").is_dir()):
        files, labels = carve(files, labels, "val" if carved else "train")
    return FileSource("ncars", files, labels, NCARS_CLASSES, NCARS_SENSOR)
