"""The epoch loop every stage shares: loaders, schedules, resume, checkpoints, metrics, plots, model selection."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from mem_core.datasets import EventSource, WindowDataset, collate_windows
from mem_core.train.engine import EpochBatchSampler, StepResult, seed_everything, train_one_epoch
from mem_core.train.plots import plot_curves
from mem_core.train.rundir import RunDir, load_checkpoint
from mem_core.train.runtime import Runtime

PLOT_EVERY_S = 30.0  # the longest curves.png lags behind metrics.jsonl between validation epochs


def build_loader(
    source: EventSource,
    spec,
    *,
    train: bool,
    seed: int,
    batch_size: int,
    runtime: Runtime,
    num_workers: int,
    indices: np.ndarray | None = None,
) -> tuple[DataLoader, EpochBatchSampler]:
    """A DataLoader of padded event windows; ``batch_size`` is global (split over the DDP processes)."""
    dataset = WindowDataset(source, spec, train=train, seed=seed, indices=indices)
    sampler = EpochBatchSampler(
        len(dataset),
        batch_size,
        seed=seed,
        shuffle=train,
        drop_last=train,
        rank=runtime.rank,
        world_size=runtime.world_size,
    )
    if not train:
        runtime.per_rank_batch(batch_size)
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=_Collate(source.sensor),
        pin_memory=runtime.device.type == "cuda",
        persistent_workers=num_workers > 0,  # the sampler lives in this process: workers can stay
    )
    return loader, sampler


def build_stage_loaders(cfg, runtime: Runtime, train_src: EventSource, val_src: EventSource, indices=None):
    """The training loader (random windows, augmented), its sampler, and the validation loader (deterministic)."""
    common = {"seed": cfg.seed, "batch_size": cfg.batch_size, "runtime": runtime, "num_workers": cfg.data.num_workers}
    loader, sampler = build_loader(train_src, cfg.input, train=True, indices=indices, **common)
    val_loader, _ = build_loader(val_src, cfg.input, train=False, **common)
    return loader, sampler, val_loader


class _Collate:
    """Picklable collate for worker processes."""

    def __init__(self, sensor):
        self.sensor = sensor

    def __call__(self, items):
        return collate_windows(items, self.sensor)


def build_scheduler(cfg, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
    """timm's cosine (per step, with warm-up) or exponential (per epoch) schedule; None for a constant lr."""
    from timm.scheduler import CosineLRScheduler, StepLRScheduler

    warmup = cfg.warmup_steps if cfg.warmup_steps > 0 else round(cfg.warmup_epochs * steps_per_epoch)
    if cfg.schedule == "cosine":
        total = max(cfg.schedule_epochs, cfg.epochs) * steps_per_epoch
        return CosineLRScheduler(
            optimizer,
            t_initial=max(total, 1),
            lr_min=cfg.min_lr,
            warmup_t=min(warmup, max(total - 1, 0)),
            warmup_lr_init=cfg.min_lr,
            t_in_epochs=False,
        )
    if cfg.schedule == "exponential":
        return StepLRScheduler(optimizer, decay_t=1, decay_rate=cfg.lr_gamma, t_in_epochs=True)
    return None


def _print_epoch(description: str, epoch: int, epochs: int, record: dict[str, Any]) -> None:
    from rich.console import Console

    shown = {k: v for k, v in record.items() if isinstance(v, float) and k not in ("epoch_seconds", "train_grad_norm")}
    values = "  ".join(f"{k} {v:.4g}" for k, v in shown.items())
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[bold]{description}[/] epoch {epoch + 1}/{epochs}  {values}  ({record['epoch_seconds']:.1f} s)"
    )


@dataclass
class FitResult:
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None


def fit(
    *,
    run: RunDir,
    cfg,
    runtime: Runtime,
    model: torch.nn.Module,
    train_model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    sampler: EpochBatchSampler,
    step_fn: Callable[[Any, int, int], StepResult],
    evaluate: Callable[[int], dict[str, float]] | None = None,
    select: str | None = None,
    ema=None,
    extra_state: Callable[[], dict[str, Any]] | None = None,
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None,
    resume: bool = False,
    description: str = "train",
) -> FitResult:
    """Train ``model`` for ``cfg.epochs`` epochs (``train_model`` may be its DDP/compiled wrapper).

    Each epoch: reseed, train, step schedules, evaluate every ``cfg.eval_every`` epochs, log one JSON line, write
    the checkpoint atomically; with ``select`` (a metric to maximise) also keep ``best.pt``. With ``resume`` the run
    continues after its last checkpointed epoch and reproduces the uninterrupted run.
    """
    steps_per_epoch = len(sampler)
    scheduler = build_scheduler(cfg, optimizer, steps_per_epoch)
    start_epoch, best = 0, None
    if resume and run.checkpoint_path.exists():
        state = load_checkpoint(run.checkpoint_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state.get("scheduler"):
            scheduler.load_state_dict(state["scheduler"])
        if ema is not None and state.get("ema"):
            ema.load_state_dict(state["ema"])
        start_epoch, best = state["epoch"] + 1, state.get("best")
        run.truncate_metrics(state["epoch"])
    result = FitResult(history=run.metrics(), best=best)

    def on_update(num_updates: int) -> None:
        if scheduler is not None and not scheduler.t_in_epochs:
            scheduler.step_update(num_updates)
        if ema is not None:
            ema.update(model, step=num_updates)

    if scheduler is not None:  # put the lr where the (possibly resumed) run stands
        if scheduler.t_in_epochs:
            scheduler.step(start_epoch)
        else:
            scheduler.step_update(start_epoch * steps_per_epoch)
    last_plot = -math.inf
    for epoch in range(start_epoch, cfg.epochs):
        seed_everything(cfg.seed, epoch)
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        stats = train_one_epoch(
            model=train_model,
            loader=loader,
            step_fn=lambda batch, step, e=epoch: step_fn(batch, e, step),
            optimizer=optimizer,
            runtime=runtime,
            epoch=epoch,
            epochs=cfg.epochs,
            steps_per_epoch=steps_per_epoch,
            grad_clip=cfg.grad_clip,
            on_update=on_update,
            description=description,
        )
        if scheduler is not None and scheduler.t_in_epochs:
            scheduler.step(epoch + 1)
        record: dict[str, Any] = {"epoch": epoch, **{f"train_{k}": v for k, v in stats.items()}}
        record["epoch_seconds"] = time.perf_counter() - t0
        last = epoch == cfg.epochs - 1
        evaluated = evaluate is not None and ((epoch + 1) % cfg.eval_every == 0 or last)
        if evaluated:
            record.update({f"val_{k}": v for k, v in evaluate(epoch).items()})
        if on_epoch_end is not None:
            on_epoch_end(epoch, record)
        is_best = (
            select is not None
            and f"val_{select}" in record
            and (best is None or record[f"val_{select}"] > best[f"val_{select}"])
        )
        if is_best:
            best = {"epoch": epoch, f"val_{select}": record[f"val_{select}"]}
        if runtime.is_main:
            _print_epoch(description, epoch, cfg.epochs, record)
            run.log(record)
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else {},
                "ema": ema.state_dict() if ema is not None else {},
                "epoch": epoch,
                "best": best,
                **(extra_state() if extra_state else {}),
            }
            if is_best:
                weights = ema.module.state_dict() if ema is not None else model.state_dict()
                run.save_checkpoint({"model": weights, "epoch": epoch, "best": best}, best=True)
            run.save_checkpoint(state)
            # a plot costs ~0.15 s: short epochs redraw only with new validation numbers or every PLOT_EVERY_S
            if evaluated or last or time.monotonic() - last_plot >= PLOT_EVERY_S:
                plot_curves(run)
                last_plot = time.monotonic()
        result.history.append(record)
    result.best = best
    return result
