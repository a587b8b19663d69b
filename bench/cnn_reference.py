"""A supervised CNN from scratch on exactly a preset's finetuning input (``mem bench cnn-reference``): the yardstick
for what that input allows with these labels, against which MEM's ViT is read (docs/RESULTS.md, section 3).

The windows, event augmentations (shifts, flips, EventDrop when set), histograms and label subset are the
finetuning stage's own (``WindowDataset``, ``batch_preprocess``, ``train_indices``); only the model (a timm CNN) and
its optimiser (AdamW, one-cycle, label smoothing 0.1) differ. Validation is the deterministic centred window, every
``round(1 / labels)`` epochs, so runs on a label fraction validate as often per step as runs on all labels.

Run: ``uv run mem bench cnn-reference --dataset ncars --data path/to/n-cars --preset cpu-small
--labels 1.0 --epochs 30 --json out.json``
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import timm
import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader

from mem_core.datasets.windows import WindowDataset, collate_windows
from mem_core.representation.pipeline import batch_preprocess
from mem_core.train.common import open_split, train_indices
from mem_core.train.configs import stage_config
from mem_core.train.engine import progress_bar


class _Epoch(torch.utils.data.Dataset):
    """A ``WindowDataset`` seen in one epoch: index -> that epoch's augmented window."""

    def __init__(self, windows: WindowDataset, epoch: int) -> None:
        self.windows, self.epoch = windows, epoch

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int):
        return self.windows[(i, self.epoch)]


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
    batch_size: int = 64,
) -> list[dict]:
    """Train ``arch`` from scratch on the preset's finetuning input; print and return the validation rows."""
    values = {"data.dataset": dataset, "data.labels": labels, "data.label_seed": seed, "seed": seed}
    if data is not None:
        values["data.path"] = str(data)
    cfg = stage_config("finetune", preset=preset, values=values)
    torch.manual_seed(seed)
    train_source, val_source = open_split(cfg, "train"), open_split(cfg, "val")
    train = WindowDataset(train_source, cfg.input, train=True, seed=seed, indices=train_indices(cfg, train_source))
    val = WindowDataset(val_source, cfg.input, train=False)
    n_classes = int(np.max(train_source.labels)) + 1

    def collate(items):
        return collate_windows(items, train_source.sensor)

    model = timm.create_model(arch, in_chans=cfg.input.in_chans, num_classes=n_classes, drop_path_rate=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    steps = epochs * math.ceil(len(train) / batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps, pct_start=0.1)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    generator = torch.Generator().manual_seed(seed)  # random crops of the histograms, as in finetuning
    every = max(1, round(1 / labels))
    workers = cfg.data.num_workers
    rows: list[dict] = []
    console = Console()
    console.print(
        f"{arch} from scratch, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"{len(train)} training samples, {len(val)} validation samples, {epochs} epochs"
    )

    def train_epoch(epoch: int) -> dict | None:
        """One epoch of training; the validation row on the epochs that validate, else None."""
        start = time.perf_counter()
        model.train()
        correct = seen = 0
        order = torch.Generator().manual_seed(seed * 1000 + epoch)
        loader = DataLoader(
            _Epoch(train, epoch), batch_size, shuffle=True, collate_fn=collate, generator=order, num_workers=workers
        )
        for batch, target, _ in loader:
            logits = model(batch_preprocess(batch, cfg.input, train=True, generator=generator))
            loss = loss_fn(logits, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            correct += int((logits.argmax(1) == target).sum())
            seen += len(target)
        if (epoch + 1) % every and epoch != epochs - 1:
            return None
        model.eval()
        hits = 0
        with torch.no_grad():
            for batch, target, _ in DataLoader(_Epoch(val, 0), 256, collate_fn=collate, num_workers=workers):
                hits += int((model(batch_preprocess(batch, cfg.input, train=False)).argmax(1) == target).sum())
        seconds = time.perf_counter() - start
        return {"epoch": epoch + 1, "train_acc": correct / seen, "val_top1": hits / len(val), "epoch_seconds": seconds}

    with progress_bar() as bar:
        task = bar.add_task(f"{arch} epochs", total=epochs, rate="", info="")
        for epoch in range(epochs):
            row = train_epoch(epoch)
            if row is not None:
                rows.append(row)
                console.print(json.dumps({k: round(v, 4) for k, v in row.items()}))
                bar.update(task, info=f"val top-1 {row['val_top1']:.3f}")
            bar.advance(task)
    table = Table(title=f"{arch} from scratch on {preset}'s finetuning input, {labels:g} of the labels, seed {seed}")
    for column in ("epoch", "train acc", "val top-1"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["epoch"]), f"{row['train_acc']:.3f}", f"{row['val_top1']:.3f}")
    console.print(table)
    if json_path is not None:
        setup = {"arch": arch, "dataset": dataset, "preset": preset, "labels": labels, "seed": seed, "epochs": epochs}
        sizes = {"train_samples": len(train), "val_samples": len(val), "lr": lr, "batch_size": batch_size}
        json_path.write_text(json.dumps({**setup, **sizes, "rows": rows}, indent=2))
    return rows
