"""A supervised CNN from scratch on exactly a preset's finetuning input (``mem bench cnn-reference``): the yardstick
for what that input allows with these labels, against which MEM's ViT is read (docs/RESULTS.md, section 3).

It is the finetuning stage with ``arch`` set to a timm CNN (``mem_core.train.finetune.yardstick_config``, the
label-efficiency experiment's yardstick arm): the same windows, event augmentations (shifts, flips, EventDrop when
set), histograms, label subset, loaders, epoch loop, validation and best-epoch choice. Only the model and its
optimiser settings differ: no layer decay (a CNN has no token blocks to decay over), AdamW at ``lr`` with betas
(0.9, 0.999) and a cosine schedule after a 10 % warm-up. On a fraction of the labels it takes the steps of a run on
all of them (``--epochs`` times the ratio of steps per epoch), as the label-efficiency experiment's finetuning runs
do. The run directory it leaves (``--out``) is evaluated and exported like any finetuning run's.

Run: ``uv run mem bench cnn-reference --dataset ncars --data path/to/n-cars --preset cpu-small
--label-fraction 1.0 --epochs 20 --json-out out.json``
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mem_core.runs.rundir import RunDir
from mem_core.train import finetune
from mem_core.train.configs import stage_config
from mem_core.train.experiment import equal_steps, training_split


def main(
    json_path: Path | None,
    dataset: str,
    data: Path | None,
    preset: str,
    labels: float,
    seed: int,
    epochs: int,
    arch: str = "resnet18",
    lr: float = 2e-3,
    out: Path | None = None,
) -> dict:
    """Train ``arch`` from scratch on the preset's finetuning input into ``out`` (a temporary folder when None);
    print the validation curve and return the result."""
    values = {"data.dataset": dataset, "data.label_fraction": labels, "data.label_seed": seed, "seed": seed}
    if data is not None:
        values["data.path"] = str(data)
    base = stage_config("finetune", preset=preset, values=values, overrides=[f"epochs={epochs}", "eval_every=2"])
    cfg = dataclasses.replace(finetune.yardstick_config(base, arch), lr=lr)
    cfg = equal_steps(cfg, training_split(cfg))
    with tempfile.TemporaryDirectory(prefix="cnn-reference-") as scratch:
        run = finetune.run(cfg, out or Path(scratch) / "run")
        result = json.loads((run.path / "result.json").read_text())
        curve = [r for r in RunDir(run.path).metrics() if "val_top1" in r]
    console = Console()
    table = Table(title=f"{arch} from scratch on {preset}'s finetuning input, {labels:g} of the labels, seed {seed}")
    for column in ("epoch", "train acc", "val top-1"):
        table.add_column(column, justify="right")
    for row in curve:
        table.add_row(str(row["epoch"] + 1), f"{row['train_acc']:.3f}", f"{row['val_top1']:.3f}")
    console.print(table)
    report = {
        "arch": arch,
        "dataset": dataset,
        "preset": preset,
        "labels": labels,
        "seed": seed,
        "epochs": cfg.epochs,
        "lr": lr,
        "train_samples": result["train_samples"],
        "val_samples": result["n"],
        "final_top1": curve[-1]["val_top1"],
        "best_top1": result["top1"],
        "best_epoch": result["best_epoch"],
        "rows": [{"epoch": r["epoch"] + 1, "train_acc": r["train_acc"], "val_top1": r["val_top1"]} for r in curve],
    }
    console.print(
        f"final top-1 {report['final_top1']:.4f}, best {report['best_top1']:.4f} (epoch {result['best_epoch']})"
    )
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2))
    return report
