"""Evaluate a trained run (or an export) on any split of any dataset, with deterministic windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mem_core.configuration import from_dict
from mem_core.representation import InputSpec
from mem_core.runs.export import load_model
from mem_core.runs.rundir import RunDir, RunError, json_safe
from mem_core.train.data import build_loader, open_for_input
from mem_core.train.finetune import evaluate_classifier
from mem_core.train.runtime import setup_runtime, teardown_runtime
from mem_core.train.segment import evaluate_segmenter


def evaluate_run(run_path: Path | str, dataset: str, data: Path | str | None, split: str, **options) -> dict[str, Any]:
    """Metrics of a run's best model on ``split``: classification top1 / n / confusion, or mIoU / mAcc / aAcc / n;
    ``options`` as for ``evaluate_runs`` (batch size, loader workers, device).

    Under torchrun every process evaluates its share and the metrics are summed: each sample counts once. A run
    trained on the same dataset with a split file of its own (``data.split_file``) is evaluated on that split, one
    trained on its splits as shipped (``data.held_out`` false) on the splits as shipped.
    """
    (result,) = evaluate_runs([run_path], dataset, data, split, **options)
    return result


def evaluate_runs(
    run_paths: list[Path | str],
    dataset: str,
    data: Path | str | None,
    split: str,
    *,
    batch_size: int = 64,
    num_workers: int = 0,
    device: str = "auto",
) -> list[dict[str, Any]]:
    """``evaluate_run`` of each run, opening the split once for the runs that share an input and a split file (a
    simulated split is generated once, not once per run)."""
    runtime = setup_runtime(device, amp=True)
    sources: dict[tuple, Any] = {}
    results = []
    for run_path in run_paths:
        model, meta = load_model(run_path, runtime.device)
        spec = from_dict(InputSpec, meta["input"])
        split_file, held_out = _opened_as(Path(run_path), dataset)
        key = (spec, split_file, held_out)
        if key not in sources:
            sources[key] = open_for_input(dataset, data, split, spec, split_file=split_file, held_out=held_out)
        source = sources[key]
        classification = meta["task"] == "classification"
        classes = source.classes if classification else source.mask_classes
        if classification and classes != meta["classes"] and sorted(classes) == sorted(meta["classes"]):
            model = _ClassOrder(model, [meta["classes"].index(name) for name in classes])  # the same names, reordered
        elif classes != meta["classes"]:
            raise RunError(
                f"{dataset} {split} has classes {classes}, but the model in {run_path} was trained on {meta['classes']}"
            )
        loader, _ = build_loader(
            source, spec, train=False, seed=0, batch_size=batch_size, runtime=runtime, num_workers=num_workers
        )
        evaluate = evaluate_classifier if classification else evaluate_segmenter
        result = evaluate(model, loader, spec, runtime, len(classes))
        results.append(
            json_safe({"run": str(run_path), "dataset": dataset, "split": split, "classes": classes, **result})
        )
    teardown_runtime()
    return results


class _ClassOrder(torch.nn.Module):
    """A classifier whose outputs are reordered to a dataset's class order (``order[i]``: model id of class i); a
    model trained on captures knows its classes in alphabetical order."""

    def __init__(self, model: torch.nn.Module, order: list[int]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("order", torch.tensor(order, dtype=torch.long, device=next(model.parameters()).device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[:, self.order]


def _opened_as(path: Path, dataset: str) -> tuple[str, bool]:
    """The split file a run of ``dataset`` trained with and whether anything was held out of its training split
    (``("", True)`` for an export, another dataset or the defaults): the same split means the same samples."""
    if not (path / "config.json").is_file():
        return "", True
    data = RunDir(path).read_config()["config"].get("data", {})
    if data.get("dataset") != dataset:
        return "", True
    return data.get("split_file", ""), data.get("held_out", True)
