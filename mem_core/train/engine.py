"""One epoch of training: the optimisation step (micro-batches, autocast, gradient clipping, a check that the loss is
finite), the evaluation batches and the progress bar. Every epoch reseeds torch (``seed_everything``), so a run
resumed from an epoch checkpoint reproduces the uninterrupted run; the batches come from ``train.data``."""

from __future__ import annotations

import collections
import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from mem_core.errors import MemError
from mem_core.representation import batch_preprocess
from mem_core.train.runtime import Runtime, all_reduce_sum

CHECK_EVERY_S = 0.5  # how often the loop reads the device back: loss finiteness, progress bar
PROGRESS_EVERY_S = 10.0  # without a terminal (a log file, a pipe): a progress line at least this often
PACE_WINDOW_S = 60.0  # the estimates of what is left follow the pace of this much of the recent past


class Pace:
    """Steps per second over the last ``PACE_WINDOW_S`` (the machine's pace now, not the average since the start:
    a machine that got busy, or quiet, shows in the estimate within a minute)."""

    def __init__(self, window_s: float = PACE_WINDOW_S) -> None:
        self.window_s = window_s
        self.points: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, t: float, steps: int) -> None:
        self.points.append((t, steps))
        while len(self.points) > 2 and t - self.points[1][0] >= self.window_s:
            self.points.popleft()

    def rate(self) -> float | None:
        """Steps per second, or None before two points a moment apart."""
        if len(self.points) < 2 or self.points[-1][0] - self.points[0][0] <= 0:
            return None
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        return (s1 - s0) / (t1 - t0)


def duration(seconds: float) -> str:
    """``seconds`` as people read it: 45 s, 12 min, 3 h 20 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 / 60:.0f} min"


def progress_line(description: str, epoch: int, epochs: int, step: int, steps: int, samples_per_s: float | None,
                  steps_per_s: float | None) -> str:  # fmt: skip
    """The line a stage prints while an epoch runs without a terminal: where it is, its pace and what is left."""
    line = f"{description} epoch {epoch + 1}/{epochs}: step {step}/{steps}"
    if samples_per_s is not None:
        line += f", {samples_per_s:.0f} samples/s"
    if steps_per_s:
        epoch_left = (steps - step) / steps_per_s
        run_left = epoch_left + (epochs - epoch - 1) * steps / steps_per_s
        line += f"; the epoch ends in {duration(epoch_left)}, the run in about {duration(run_left)}"
    return line


class NonFiniteLossError(MemError, FloatingPointError):
    """The loss became NaN or infinite: the run stops instead of training on garbage."""


def seed_everything(seed: int, epoch: int, rank: int | None = None) -> None:
    """Reseed torch's global generator at the start of an epoch: dropout and drop path.

    Each DDP process (``rank``; by default the process group's) draws its own: with one seed every process would drop
    the same units and paths of its samples. The data order and the augmentations have their own seeds, which do
    not depend on the number of processes.
    """
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    torch.manual_seed((seed * 100_003 + epoch + rank * 2_654_435_761) % 2**32)  # the CPU generator keeps 32 bits


def progress_bar(main: bool = True) -> Progress:
    """A rich progress bar with rate and ETA on the main process (``main``), when stderr is a terminal (logs get
    one line per epoch from ``fit`` instead of a redrawn bar). Its tasks take the fields ``rate`` and ``info``."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        disable=not (main and sys.stderr.isatty()),
        transient=False,
        refresh_per_second=4,
    )


@dataclass
class StepResult:
    """One step's loss, its metrics (tensors on the device or floats: never read back within the step) and size."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor | float]
    n: int


class MetricMeter:
    """Sample-weighted means of per-step metrics, kept on the device (reading a GPU value stalls the step until the
    GPU has caught up) and read back only by ``current`` and ``reduce``."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def update(self, metrics: dict[str, torch.Tensor | float], n: int) -> None:
        for k, v in metrics.items():
            value = v.detach().double() if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)
            self.sums[k] = self.sums[k] + value * n if k in self.sums else value * n
        self.count += n

    def current(self) -> dict[str, float]:
        return {k: v.item() / max(self.count, 1) for k, v in self.sums.items()}

    def reduce(self, runtime: Runtime) -> dict[str, float]:
        """The means over all processes (every rank must hold the same metrics)."""
        keys = sorted(self.sums)
        count = torch.tensor(float(self.count), dtype=torch.float64)
        packed = torch.stack([*(self.sums[k].to(runtime.device) for k in keys), count.to(runtime.device)])
        packed = all_reduce_sum(packed, runtime).cpu()
        total = max(packed[-1].item(), 1.0)
        return {k: packed[i].item() / total for i, k in enumerate(keys)}


@torch.no_grad()
def eval_batches(model: torch.nn.Module, loader: Iterable, spec, runtime: Runtime) -> Iterator[tuple]:
    """(model output, labels on the device, label images or None) per batch of ``loader``: eval mode, deterministic
    inputs; label images (masks) go through the inputs' resize and crop."""
    model.eval()
    for events, labels, masks in loader:
        if masks is None:
            x = batch_preprocess(events, spec, train=False, device=runtime.device)
        else:
            x, masks = batch_preprocess(events, spec, train=False, device=runtime.device, labels=masks)
        with runtime.autocast():
            out = model(x)
        yield out, labels.to(runtime.device, non_blocking=True), masks


def train_one_epoch(
    *,
    model: torch.nn.Module,
    loader: Iterable,
    step_fn: Callable[[object, int], StepResult],
    optimizer: torch.optim.Optimizer,
    runtime: Runtime,
    epoch: int,
    epochs: int,
    steps_per_epoch: int,
    grad_clip: float = 0.0,
    accum_steps: int = 1,
    on_update: Callable[[int], None] | None = None,
    description: str = "train",
) -> dict[str, float]:
    """One pass over ``loader``: forward in autocast, backward, clip, step, ``on_update``.

    ``step_fn(batch, draw)`` returns the loss and per-batch metrics (``draw`` seeds the batch's randomness: the step
    itself, or with ``accum_steps`` > 1 ``step * accum_steps + k`` for micro-batch ``k``); ``on_update(num_updates)``
    steps schedulers/EMA. With ``accum_steps`` each batch is split into that many micro-batches whose gradients,
    weighted by their share of the batch, add up to the whole batch's before the one optimizer step (under DDP
    only the last micro-batch synchronises them).
    Nothing is read back from the device within a step: the loss's finiteness and the progress bar are checked every
    ``CHECK_EVERY_S`` and at the end of the epoch, so a NaN stops the run within a second (before the epoch's
    checkpoint is written). Returns sample-weighted mean metrics over all processes.
    """
    model.train()
    meter = MetricMeter()
    losses: list[torch.Tensor] = []  # the steps' losses since the last check
    checked_at, checked_step = time.monotonic(), 0
    pace, said_at = Pace(), time.monotonic()
    pace.add(said_at, 0)
    with progress_bar(runtime.is_main) as bar:
        task = bar.add_task(f"{description} {epoch + 1}/{epochs}", total=steps_per_epoch, rate="", info="")
        for step, batch in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            parts = split_batch(batch, accum_steps)
            total = sum(size for _, size in parts)
            for k, (part, size) in enumerate(parts):
                last = k == len(parts) - 1
                no_sync = getattr(model, "no_sync", None)  # DDP: gradients are reduced once, after the last part
                with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
                    with runtime.train_autocast():
                        result = step_fn(part, step if accum_steps == 1 else step * accum_steps + k)
                    (result.loss if len(parts) == 1 else result.loss * (size / total)).backward()
                losses.append(result.loss.detach())
                if not last:
                    meter.update({"loss": result.loss, **result.metrics}, result.n)
            if grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                result.metrics.setdefault("grad_norm", grad_norm)
            optimizer.step()
            if on_update is not None:
                on_update(epoch * steps_per_epoch + step + 1)
            meter.update({"loss": result.loss, **result.metrics}, result.n)
            bar.advance(task)
            if time.monotonic() - checked_at >= CHECK_EVERY_S:
                _check_finite(losses, epoch, checked_step, accum_steps)
                losses, checked_at, checked_step = [], time.monotonic(), step + 1
                elapsed = bar.tasks[task].elapsed or 1e-9
                shown = {k: v for k, v in meter.current().items() if k != "grad_norm"}
                rate = f"{meter.count * runtime.world_size / elapsed:.0f} sa/s"
                bar.update(task, rate=rate, info=" ".join(f"{k} {v:.4g}" for k, v in shown.items()))
                pace.add(checked_at, step + 1)
                if runtime.is_main and bar.disable and checked_at - said_at >= PROGRESS_EVERY_S:
                    steps_per_s = pace.rate()
                    per_step = meter.count * runtime.world_size / max(step + 1, 1)
                    line = progress_line(description, epoch, epochs, step + 1, steps_per_epoch,
                                         None if steps_per_s is None else steps_per_s * per_step, steps_per_s)  # fmt: skip
                    print(line, file=sys.stderr, flush=True)
                    said_at = checked_at
        _check_finite(losses, epoch, checked_step, accum_steps)
    stats = meter.reduce(runtime)
    stats["lr"] = max(group["lr"] for group in optimizer.param_groups)
    return stats


def split_batch(batch: tuple, parts: int) -> list[tuple[tuple, int]]:
    """``batch`` (a tuple of an ``EventBatch`` or tensors, and Nones) as up to ``parts`` micro-batches of rows,
    as even as the batch allows, each with its number of samples."""
    n = len(batch[0])
    if parts == 1:
        return [(batch, n)]
    sizes = [n // parts + (k < n % parts) for k in range(parts)]
    bounds = np.cumsum([0, *sizes])
    return [
        (tuple(None if v is None else v[slice(a, b)] for v in batch), int(b - a))
        for a, b in itertools.pairwise(bounds)
        if b > a
    ]


def _check_finite(losses: list[torch.Tensor], epoch: int, first_step: int, per_step: int = 1) -> None:
    """Raise ``NonFiniteLossError`` naming the first step among ``losses`` (from ``first_step`` on, ``per_step``
    micro-batch losses a step) that was NaN/inf."""
    if not losses:
        return
    values = torch.stack([loss.float() for loss in losses])
    bad = (~torch.isfinite(values)).nonzero()
    if len(bad):
        k = int(bad[0])
        raise NonFiniteLossError(
            f"loss is {values[k].item()} at epoch {epoch}, step {first_step + k // per_step}: stopping "
            "(lower the learning rate, check grad_clip, or look for corrupt inputs)"
        )
