"""The epoch loop of a stage: schedules, resume, checkpoints, metrics, plots, the kept model."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from mem_core.limits import is_int
from mem_core.runs.rundir import RunDir, RunError, load_checkpoint, load_state
from mem_core.train.data import EpochBatchSampler, EpochStream
from mem_core.train.engine import StepResult, seed_everything, train_one_epoch
from mem_core.train.plots import plot_curves
from mem_core.train.runtime import Runtime

PLOT_EVERY_S = 30.0  # the longest curves.png lags behind metrics.jsonl


def build_scheduler(cfg, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
    """timm's cosine (per step, with warm-up) or exponential (per epoch) schedule; None for a constant lr.

    timm's schedules give every parameter group its ``lr_scale`` (layer-wise lr decay); a constant lr gets it here.
    """
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
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr * group.get("lr_scale", 1.0)
    return None


def _print_epoch(description: str, epoch: int, epochs: int, record: dict[str, Any]) -> None:
    from rich.console import Console

    shown = {k: v for k, v in record.items() if isinstance(v, float) and k not in ("epoch_seconds", "train_grad_norm")}
    values = "  ".join(f"{k} {v:.4g}" for k, v in shown.items())
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[bold]{description}[/] epoch {epoch + 1}/{epochs}  {values}  ({record['epoch_seconds']:.1f} s)"
    )


@dataclass
class Training:
    """What the epoch loop needs: the saved ``model`` and its trained wrapper (DDP / compiled), optimizer, data,
    ``step(batch, epoch, step)``, ``evaluate(epoch)`` and optionally the metric to ``select`` by and an EMA."""

    model: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: DataLoader | EpochStream  # an epoch's batches, after ``sampler.set_epoch``
    sampler: EpochBatchSampler | EpochStream
    step: Callable[[Any, int, int], StepResult]
    evaluate: Callable[[int], dict[str, Any]]
    select: str | None = None
    ema: Any = None
    description: str = "train"


@dataclass
class FitResult:
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    cut_short: bool = False  # stopped by ``time_limit_s`` before its last epoch


def fit(run: RunDir, cfg, runtime: Runtime, training: Training, *, resume: bool = False) -> FitResult:
    """Train for ``cfg.epochs`` epochs.

    Each epoch: reseed, train, step the schedules, evaluate every ``cfg.eval_every`` epochs (and at the last), log
    one JSON line, write the checkpoint atomically; with ``training.select`` (a metric to maximise) also keep
    ``best.pt`` (the latest of equally good epochs). With ``resume`` the run continues after its last checkpointed
    epoch and reproduces the uninterrupted run.
    """
    t = training
    steps_per_epoch = len(t.sampler)
    scheduler = build_scheduler(cfg, t.optimizer, steps_per_epoch)
    start_epoch, best = _restore(run, t, scheduler, resume, cfg.epochs)
    result = FitResult(history=run.metrics(), best=best)

    def on_update(num_updates: int) -> None:
        if scheduler is not None and not scheduler.t_in_epochs:
            scheduler.step_update(num_updates)
        if t.ema is not None:
            t.ema.update(t.model, step=num_updates)

    if scheduler is not None:  # put the lr where the (possibly resumed) run stands
        if scheduler.t_in_epochs:
            scheduler.step(start_epoch)
        else:
            scheduler.step_update(start_epoch * steps_per_epoch)
    last_checkpoint = -math.inf
    started = last_plot = time.monotonic()  # a run shorter than PLOT_EVERY_S draws its curves once, at the end
    for epoch in range(start_epoch, cfg.epochs):
        seed_everything(cfg.seed, epoch)
        t.sampler.set_epoch(epoch)
        start = time.perf_counter()
        stats = train_one_epoch(
            model=t.train_model,
            loader=t.loader,
            step_fn=lambda batch, step, e=epoch: t.step(batch, e, step),
            optimizer=t.optimizer,
            runtime=runtime,
            epoch=epoch,
            epochs=cfg.epochs,
            steps_per_epoch=steps_per_epoch,
            grad_clip=cfg.grad_clip,
            accum_steps=cfg.accum_steps,
            on_update=on_update,
            description=t.description,
        )
        if scheduler is not None and scheduler.t_in_epochs:
            scheduler.step(epoch + 1)
        record: dict[str, Any] = {"epoch": epoch, **{f"train_{k}": v for k, v in stats.items()}}
        record["epoch_seconds"] = time.perf_counter() - start
        out_of_time = 0 < cfg.time_limit_s <= time.monotonic() - started
        last = epoch == cfg.epochs - 1 or out_of_time
        evaluated = (epoch + 1) % cfg.eval_every == 0 or last
        if evaluated:
            metrics = t.evaluate(epoch)
            record.update({f"val_{k}": v for k, v in metrics.items() if isinstance(v, float)})
        key = f"val_{t.select}"
        # ties go to the later epoch: with a validation split of a few samples (the label-a-few loop holds out 3
        # captures) many epochs read 100 %, and the first of them is the least trained
        if t.select is not None and key in record and (best is None or record[key] >= best[key]):
            best = {"epoch": epoch, key: record[key]}
            if runtime.is_main:
                weights = t.ema.module.state_dict() if t.ema is not None else t.model.state_dict()
                run.save_checkpoint({"model": weights, "epoch": epoch, "best": best}, best=True)
        if runtime.is_main:
            _print_epoch(t.description, epoch, cfg.epochs, record)
            run.log(record)
            if last or time.monotonic() - last_checkpoint >= cfg.checkpoint_every_s:
                run.save_checkpoint(_state(t, scheduler, epoch, best))
                last_checkpoint = time.monotonic()
            # a plot costs 0.15-0.7 s: curves.png is redrawn at the end and at most every PLOT_EVERY_S, so a run of
            # short epochs with a validation each does not spend its time drawing
            if last or time.monotonic() - last_plot >= PLOT_EVERY_S:
                try:
                    plot_curves(run)
                except OSError as e:  # a full disk: the checkpoint of this epoch is written, --resume goes on
                    raise RunError(f"{run.path}: cannot write the curves ({e.strerror or e})") from None
                last_plot = time.monotonic()
        result.history.append(record)
        if out_of_time and epoch < cfg.epochs - 1:
            result.cut_short = True
            if runtime.is_main:
                _print_cut(t.description, epoch, cfg)
            break
    result.best = best
    return result


def _print_cut(description: str, epoch: int, cfg) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[bold]{description}[/] stopped after epoch {epoch + 1}/{cfg.epochs}: its {cfg.time_limit_s:g} s "
        "time limit has passed (time_limit_s)"
    )


def _restore(run: RunDir, t: Training, scheduler, resume: bool, epochs: int) -> tuple[int, dict[str, Any] | None]:
    """With ``resume`` and a checkpoint: load it into the training state; (first epoch to run, best so far).

    Records of epochs after the checkpoint are dropped (all of them without one): a run stopped between logging an
    epoch and saving its checkpoint (a full disk) trains that epoch again, and logs it once.
    """
    if not resume:
        return 0, None
    if not run.checkpoint_path.exists():
        run.truncate_metrics(-1)
        return 0, None
    path = run.checkpoint_path
    state = load_checkpoint(path)
    epoch, best = state.get("epoch"), state.get("best")
    scores = best is None or (isinstance(best, dict) and all(isinstance(v, int | float) for v in best.values()))
    if not (is_int(epoch) and 0 <= epoch < epochs and scores):
        raise RunError(f"{path}: does not hold this run's training state (its epoch or best epoch is not one of it)")
    load_state(t.model, state.get("model"), path, "model")
    load_state(t.optimizer, state.get("optimizer"), path, "optimizer")
    if scheduler is not None and state.get("scheduler"):
        load_state(scheduler, state["scheduler"], path, "schedule")
    if t.ema is not None and state.get("ema"):
        load_state(t.ema, state["ema"], path, "EMA")
    run.truncate_metrics(epoch)
    return epoch + 1, best


def _state(t: Training, scheduler, epoch: int, best: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint of the finished ``epoch``: everything ``_restore`` needs to continue after it."""
    return {
        "model": t.model.state_dict(),
        "optimizer": t.optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else {},
        "ema": t.ema.state_dict() if t.ema is not None else {},
        "epoch": epoch,
        "best": best,
    }
