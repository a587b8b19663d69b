"""Evaluate a trained run (or an export) on any split of any dataset, with deterministic windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mem_core.configuration import from_dict
from mem_core.export import load_model
from mem_core.representation import InputSpec
from mem_core.train.common import open_for_input
from mem_core.train.finetune import evaluate_classifier
from mem_core.train.fit import build_loader
from mem_core.train.rundir import RunError, json_safe
from mem_core.train.runtime import setup_runtime
from mem_core.train.segment import evaluate_segmenter


def evaluate_run(
    run_path: Path | str,
    dataset: str,
    data: Path | str | None,
    split: str,
    *,
    batch_size: int = 64,
    num_workers: int = 0,
    device: str = "auto",
) -> dict[str, Any]:
    """Metrics of a run's best model on ``split``: classification top1 / n / confusion, or mIoU / mAcc / aAcc / n."""
    runtime = setup_runtime(device, amp=True)
    model, meta = load_model(run_path, runtime.device)
    spec = from_dict(InputSpec, meta["input"])
    source = open_for_input(dataset, data, split, spec)
    classification = meta["task"] == "classification"
    classes = source.classes if classification else source.mask_classes
    if classes != meta["classes"]:
        raise RunError(
            f"{dataset} {split} has classes {classes}, but the model in {run_path} was trained on {meta['classes']}"
        )
    loader, _ = build_loader(
        source, spec, train=False, seed=0, batch_size=batch_size, runtime=runtime, num_workers=num_workers
    )
    evaluate = evaluate_classifier if classification else evaluate_segmenter
    result = evaluate(model, loader, spec, runtime, len(classes))
    return json_safe({"run": str(run_path), "dataset": dataset, "split": split, "classes": classes, **result})
