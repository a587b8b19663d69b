"""N-ImageNet (Kim et al., ICCV 2021): ImageNet shown to an event camera, 640 x 480, ``.npz`` per sample."""

from __future__ import annotations

from pathlib import Path

from mem_core.datasets.base import DatasetError, EventSource, FileSource, require_dir, sorted_files
from mem_core.events import SensorSize

NIMAGENET_SENSOR = SensorSize(480, 640)


def nimagenet(root: Path, split: str) -> EventSource:
    root = require_dir(Path(root), "N-ImageNet root")
    folder = next((root / n for n in (split, f"extracted_{split}") if (root / n).is_dir()), None)
    if folder is None:
        raise DatasetError(f"{root}: no N-ImageNet split {split!r} ({split}/ or extracted_{split}/)")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    files, labels = [], []
    for label, cls in enumerate(classes):
        found = sorted_files(folder / cls, (".npz",))
        files += found
        labels += [label] * len(found)
    return FileSource("nimagenet", files, labels, classes, NIMAGENET_SENSOR)
