"""The epoch loop every stage shares: loaders, schedules, resume, checkpoints, metrics, plots, model selection."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from mem_core.adapters import shutdown_loader_workers
from mem_core.cores import usable_cores
from mem_core.datasets import EventSource, WindowDataset, collate_windows
from mem_core.errors import MemError
from mem_core.limits import is_int
from mem_core.runs.rundir import RunDir, RunError, load_checkpoint, load_state
from mem_core.train.engine import EpochBatchSampler, StepResult, seed_everything, train_one_epoch
from mem_core.train.plots import plot_curves
from mem_core.train.runtime import Runtime

PLOT_EVERY_S = 30.0  # the longest curves.png lags behind metrics.jsonl


MAX_AUTO_WORKERS = 8  # on a many-core host, not dozens of processes each holding its own readers and buffers


def loader_workers(num_workers: int, world_size: int = 1) -> int:
    """The loader processes of one training process: ``num_workers``, or for -1 (auto) the cores this machine
    gives the process (the cores it may run on, shared by ``world_size`` processes), at most ``MAX_AUTO_WORKERS``."""
    if num_workers >= 0:
        return num_workers
    return max(1, min(MAX_AUTO_WORKERS, usable_cores() // max(1, world_size)))


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
    epoch_samples: int = 0,
) -> tuple[DataLoader, EpochBatchSampler]:
    """A DataLoader of padded event windows; ``batch_size`` is global (split over the DDP processes);
    ``num_workers`` -1 is ``loader_workers``' automatic count; ``epoch_samples`` (training): the samples an epoch
    draws, in passes over the dataset (``EpochBatchSampler``)."""
    num_workers = loader_workers(num_workers, runtime.world_size)
    dataset = WindowDataset(source, spec, train=train, seed=seed, indices=indices)
    sampler = EpochBatchSampler(
        len(dataset),
        batch_size,
        seed=seed,
        shuffle=train,
        drop_last=train,
        rank=runtime.rank,
        world_size=runtime.world_size,
        epoch_samples=epoch_samples,
    )
    loader = _Loader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=_Collate(source.sensor),
        pin_memory=runtime.device.type == "cuda",
        persistent_workers=num_workers > 0,  # the sampler lives in this process: workers can stay
        # Starting workers draws their base seed; from torch's global generator that draw would shift dropout, drop
        # path and masking in the epoch the workers start - epoch 0 in a run, the resumed epoch after --resume.
        generator=torch.Generator().manual_seed(seed),
    )
    return loader, sampler


def worker_error(exc: BaseException) -> MemError | None:
    """The library's error behind a DataLoader worker's wrapped exception, as the one line it was, or None.

    A worker's exception reaches the main process re-raised by torch with a "Caught ... in DataLoader worker process
    N" preamble and the worker's traceback in the message (or as a RuntimeError when the type cannot be rebuilt from
    one string); a damaged corpus shard or event file should read as it does without workers."""
    first, _, rest = str(exc).partition("\n")
    if not (first.startswith("Caught ") and "in DataLoader worker process" in first):
        return None
    name, _, message = rest.strip().splitlines()[-1].partition(": ")
    return MemError(message) if name.startswith("mem_core.") and message else None


class _Loader(DataLoader):
    """A DataLoader whose workers' library errors surface as they would in this process (see ``worker_error``)."""

    def __iter__(self) -> Iterator[Any]:
        batches = super().__iter__()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as exc:
                original = worker_error(exc)
                if original is None:
                    raise
                raise original from None
            yield batch

    def close(self) -> None:
        """Stop the persistent workers now. Left to the garbage collector (a stage's loaders sit in reference
        cycles), the workers' queues can be torn down before the iterator tells the workers to stop, and torch
        then waits its 5 s join timeout for each worker: seconds of stall at a random later moment."""
        shutdown_loader_workers(self)


def build_stage_loaders(cfg, runtime: Runtime, train_src: EventSource, val_src: EventSource, indices=None):
    """The training loader (random windows, augmented), its sampler, and the validation loader (deterministic)."""
    common = {"seed": cfg.seed, "batch_size": cfg.batch_size, "runtime": runtime, "num_workers": cfg.data.num_workers}
    loader, sampler = build_loader(
        train_src, cfg.input, train=True, indices=indices, epoch_samples=cfg.data.epoch_samples, **common
    )
    val_loader, _ = build_loader(val_src, cfg.input, train=False, **common)
    return loader, sampler, val_loader


class _Collate:
    """Picklable collate for worker processes."""

    def __init__(self, sensor):
        self.sensor = sensor

    def __call__(self, items):
        return collate_windows(items, self.sensor)


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
    loader: DataLoader
    sampler: EpochBatchSampler
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
    last_plot = last_checkpoint = -math.inf
    started = time.monotonic()
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
