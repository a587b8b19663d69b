"""Finetuning on a few labelled captures (the label-a-few loop of the live viewer): ``mem train-labels``.

A capture corpus (``recorders.capture.LabelledCaptures``) holds tens of windows, each a recording with its class.
Training from it needs no preset to be chosen: the model and the input representation are the pretraining run's
(its ViT must be rebuilt exactly to take its weights), and the recipe is one for tens of samples (cpu-tiny's
optimiser settings, every sample in one batch, no RandAugment). The best epoch on the held-out captures is
exported for the live server, which loads it without a restart.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

from mem_core.corpus import Corpus, labels_problem
from mem_core.datasets.base import DatasetError
from mem_core.fields import TrainEpochs, check_value
from mem_core.train.configs import FinetuneStageConfig, stage_config
from mem_core.train.stage import pretraining_run

# what a pretraining run's input settings say about the representation (its augmentations are its own business)
REPRESENTATION_FIELDS = (
    "n_max",
    "size",
    "channels",
    "resize_to",
    "hot_pixel_std",
    "scale",
    "crop",
    "log_gain",
    "temporal_bins",
)
CAPTURE_RECIPE = (
    "batch_size=8",  # a few steps per epoch: tens of samples need hundreds of steps
    "warmup_epochs=5",
    "eval_every=5",
    "head_init_scale=1.0",
    "input.randaug_ops=0",
    "data.num_workers=0",
)


def capture_counts(labels: Path | str) -> dict[str, int]:
    """Captures per class in the labelled corpus ``labels``; a ``DatasetError`` when there is none."""
    labels = Path(labels)
    if not (labels / "manifest.json").is_file():
        raise DatasetError(f"{labels}: no labelled captures yet (capture windows in mem view first)")
    return Corpus(labels).label_counts()


def capture_window_ms(labels: Path | str) -> float | None:
    """The time span (ms) of the live window most captures in ``labels`` were taken on (of two as common, the
    newer), or None: no span, or captures that do not say (``LabelDesk.capture`` records ``served_window``)."""
    spans = collections.Counter()
    newest: dict[float | None, int] = {}
    for k, recording in enumerate(Corpus(labels).recordings):
        served = recording.metadata.get("served_window")
        if isinstance(served, dict) and "ms" in served:
            ms = served["ms"]
            ms = float(ms) if isinstance(ms, int | float) and not isinstance(ms, bool) and 0 < ms < math.inf else None
            spans[ms] += 1
            newest[ms] = k
    if not spans:
        return None
    return max(spans, key=lambda ms: (spans[ms], newest[ms]))


def captures_config(
    labels: Path | str, pretrain: Path | str, epochs: int, overrides: list[str] | tuple[str, ...] = ()
) -> FinetuneStageConfig:
    """The finetuning config for the capture corpus ``labels``: ``pretrain``'s model and representation, the
    capture recipe, ``epochs``, then ``overrides`` (``key=value``)."""
    run, _ = pretraining_run(pretrain)
    pretrained = run.read_config()["config"]
    values: dict[str, Any] = {
        "data.dataset": "corpus",
        "data.path": str(labels),
        "data.sample_ms": capture_window_ms(labels),
        "epochs": epochs,
        "model": pretrained["model"],
        "input": {k: pretrained["input"][k] for k in REPRESENTATION_FIELDS if k in pretrained["input"]},
    }
    return stage_config("finetune", preset="cpu-tiny", values=values, overrides=[*CAPTURE_RECIPE, *overrides])


def train_captures(
    labels: Path | str,
    pretrain: Path | str,
    out: Path | str,
    export: Path | str,
    *,
    epochs: int,
    overrides: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """Finetune ``pretrain`` on the captures in ``labels`` for ``epochs`` (``fields.TrainEpochs``) into the run
    ``out`` and export its best epoch to ``export``; returns the run's result (``top1`` on the held-out captures,
    ``n``, ``classes``, ...)."""
    from mem_core.runs.export import export_run, prepare_export_dir
    from mem_core.runs.rundir import make_dir
    from mem_core.train import finetune

    check_value("epochs", epochs, TrainEpochs)
    make_dir(Path(out), "a run")  # both outputs refused before training, not an export refused after it
    prepare_export_dir(Path(export))
    problem = labels_problem(capture_counts(labels))
    if problem is not None:
        raise DatasetError(f"{labels}: {problem}")
    cfg = captures_config(labels, pretrain, epochs, overrides)
    run = finetune.run(cfg, out, init=pretrain)
    export_run(run.path, export)
    return json.loads((run.path / "result.json").read_text())
