"""The skeleton every training stage fills in: open the data, build the model, fit, judge the kept model, write
``result.json``.

A stage (tokenizer, pretrain, finetune, segment) is a ``Stage`` subclass: it says how to build its model, what one
training step computes and how to evaluate a model on the validation loader; ``run_stage`` does everything else the
same way for all of them (run directory, DDP, loaders, optimizer, the epoch loop of ``fit``, the final result).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from timm.optim import create_optimizer_v2
from torch.utils.data import DataLoader

from mem_core.configuration import ConfigError, from_dict
from mem_core.datasets import EventSource
from mem_core.models import MEMViT, ViTConfig, load_pretrained_backbone
from mem_core.representation import EventBatch, batch_preprocess
from mem_core.runs.lineage import INIT_LINK
from mem_core.runs.rundir import RunDir, RunError, discarded_if_it_fails_unstarted, load_checkpoint, load_state
from mem_core.train.common import batch_generator, fit_input, start_run, wrap_model
from mem_core.train.data import EpochStream, build_stage_loaders, open_split, open_training, train_indices
from mem_core.train.engine import StepResult
from mem_core.train.fit import Training, fit
from mem_core.train.runtime import Runtime, interruptible, teardown_runtime

# in the config file of a run that read unlabeled recordings (``data.unlabeled``): what it was trained on; in a run
# finetuned from such a run, under ``PRETRAINED_ON``, the same with the pretraining run's path; in a student distilled
# on unlabeled recordings, under ``DISTILLATION_DATA``, what it read
PRETRAINING_DATA, PRETRAINED_ON, DISTILLATION_DATA = "pretraining_data", "pretrained_on", "distillation_data"


class Stage(ABC):
    """One training stage. ``run_stage`` calls ``configure`` before anything is written, creates the stage in the
    run directory, then calls, in order: ``prepare`` (with the opened data), ``build_model`` and ``initialize``,
    ``build_ema``, ``build_optimizer``, then ``step`` and ``evaluate`` (+ ``after_validation``) from the epoch
    loop, and ``finish`` with the final metrics.

    Class attributes: ``name`` (the run directory's stage), ``select`` (the validation metric to maximise: the best
    epoch's weights go to ``best.pt`` and into the result; None: the last epoch is the result).
    """

    name: ClassVar[str]
    select: ClassVar[str | None] = None
    read_unlabeled: ClassVar[str] = PRETRAINING_DATA  # the config entry that names the unlabeled recordings read

    def __init__(self, cfg, runtime: Runtime, run: RunDir) -> None:
        self.cfg, self.runtime, self.run = cfg, runtime, run
        self.classes: list[str] = []  # the class names the model learns, when it learns classes
        self.steps_per_epoch = 0  # set once the loaders exist

    @classmethod
    def configure(cls, cfg, **inputs: Any):
        """The config the stage runs with, derived from the one it was given (before anything is written)."""
        return fit_input(cfg)

    @property
    def description(self) -> str:
        """Label of the progress bar and the epoch lines."""
        return self.name

    def prepare(self, train_src: EventSource, val_src: EventSource, indices: np.ndarray) -> None:  # noqa: B027
        """Check the data and note what the model needs from it (class names); optional."""

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """The untrained model (on the CPU; the skeleton moves it)."""

    def initialize(self, model: torch.nn.Module) -> None:  # noqa: B027
        """Prepare the model built for training (pretrained weights, frozen parts); optional."""

    @property
    def layer_decay(self) -> float | None:
        """The layer-wise lr decay of ``build_optimizer``: the config's, where it has one."""
        return getattr(self.cfg, "layer_decay", None)

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """AdamW through timm, with ``layer_decay``; on a GPU the fused kernel (one launch for all parameters)."""
        cfg = self.cfg
        fused = {"fused": True} if self.runtime.device.type == "cuda" else {}
        return create_optimizer_v2(
            model,
            "adamw",
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            layer_decay=self.layer_decay,
            betas=cfg.betas,
            **fused,
        )

    def build_ema(self, model: torch.nn.Module):
        """An EMA of the weights (timm's ``ModelEmaV3``) that validation and ``best.pt`` then use; None: no EMA."""
        return None

    @abstractmethod
    def step(self, model: torch.nn.Module, batch, epoch: int, step: int) -> StepResult:
        """One training step's loss and metrics; ``model`` is the trained (DDP / compiled) model."""

    def train_inputs(
        self, events: EventBatch, epoch: int, step: int, masks: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Generator]:
        """A training batch of windows as model inputs on the device; its label images (``masks``) carried through
        the same resize and crop; and the step's CPU generator that drew the crop and RandAugment."""
        g = batch_generator(self.cfg, self.runtime, epoch, step)
        device = self.runtime.device
        if masks is None:
            return batch_preprocess(events, self.cfg.input, train=True, generator=g, device=device), None, g
        x, masks = batch_preprocess(events, self.cfg.input, train=True, generator=g, device=device, labels=masks)
        return x, masks, g

    @abstractmethod
    def evaluate(self, model: torch.nn.Module, loader: DataLoader) -> dict[str, Any]:
        """Metrics of ``model`` on the validation ``loader`` (all processes); the float ones are logged per epoch."""

    def after_validation(self, model: torch.nn.Module, batch) -> None:  # noqa: B027
        """Pictures of the model's work on ``batch``, the validation's first, drawn on the main process after each
        validation; optional."""

    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        """Write what belongs beside ``result.json`` (main process) and return fields to add to it."""
        return {}


class KeepFirst:
    """Iterates ``loader`` as it is and keeps its first batch, so the pictures drawn after a validation need no
    pass of their own (which restarted the workers' iteration and prefetched batches only to drop them)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader, self.first = loader, None

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i == 0:
                self.first = batch
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


def run_stage(stage_cls: type[Stage], cfg, out: Path | str, *, resume: bool = False, **inputs: Any) -> RunDir:
    """Train one stage into the run directory ``out`` (continued from its checkpoint with ``resume``).

    ``inputs`` go to the stage's constructor (a tokenizer run, a pretraining run to start from). SIGINT stops it,
    even in a process started with SIGINT ignored (a background job of a script). A run that fails before its first
    checkpoint leaves no run directory behind unless it was there before (``discarded_if_it_fails_unstarted``).
    """
    with interruptible(), discarded_if_it_fails_unstarted(out):
        return _run_stage(stage_cls, cfg, out, resume, inputs)


def _run_stage(stage_cls: type[Stage], cfg, out: Path | str, resume: bool, inputs: dict[str, Any]) -> RunDir:
    cfg = stage_cls.configure(cfg, **inputs)
    runtime, run = start_run(stage_cls.name, cfg, out, resume=resume)
    stage = stage_cls(cfg, runtime, run, **inputs)
    train_src, read = open_training(cfg)
    val_src = open_split(cfg, cfg.data.val_split)
    if read is not None and runtime.is_main:  # what the run read beside its training split
        run.note_in_config(stage.read_unlabeled, read)
    indices = train_indices(cfg, train_src)
    stage.prepare(train_src, val_src, indices)
    loader, sampler, val_loader = build_stage_loaders(cfg, runtime, train_src, val_src, indices)
    stage.steps_per_epoch = len(sampler)
    torch.manual_seed(cfg.seed)
    model = stage.build_model()
    stage.initialize(model)
    runtime.place(model)
    ema = stage.build_ema(model)

    def evaluate(epoch: int) -> dict[str, Any]:
        judged = ema.module if ema is not None else model
        batches = KeepFirst(val_loader)
        metrics = stage.evaluate(judged, batches)
        if runtime.is_main and batches.first is not None:
            stage.after_validation(judged, batches.first)
        return metrics

    try:
        training = Training(
            model=model,
            train_model=wrap_model(model, cfg, runtime),
            optimizer=stage.build_optimizer(model),
            loader=(stream := EpochStream(loader, sampler)),
            sampler=stream,
            step=lambda batch, epoch, step: stage.step(training.train_model, batch, epoch, step),
            evaluate=evaluate,
            select=stage.select,
            ema=ema,
            description=stage.description,
        )
        outcome = fit(run, cfg, runtime, training, resume=resume)
        if stage.select is None:  # the last epoch is the result: its validation is in the last record
            metrics = {k.removeprefix("val_"): v for k, v in outcome.history[-1].items() if k.startswith("val_")}
            kept = {"epoch": outcome.history[-1]["epoch"]}
        else:  # the best epoch's model, evaluated in full (confusion matrix and all) by every process
            if runtime.distributed:
                torch.distributed.barrier()  # best.pt is written by the main process
            best = stage.build_model()
            load_state(best, load_checkpoint(run.best_path).get("model"), run.best_path, "model")
            metrics = stage.evaluate(runtime.place(best), val_loader)
            kept = {"best_epoch": outcome.best["epoch"] if outcome.best else None}
        if runtime.is_main:
            result = {"stage": stage.name, "split": cfg.data.val_split, **kept, "train_samples": len(indices)}
            result["epochs_run"] = outcome.history[-1]["epoch"] + 1
            result["cut_short"] = outcome.cut_short
            result |= {"classes": stage.classes} if stage.classes else {}
            result |= metrics
            result |= stage.finish(result)
            run.write_json("result.json", result)
    finally:
        loader.close()  # the workers stop now, not when the garbage collector finds the loaders
        val_loader.close()
    teardown_runtime()
    return run


# ------------------------------------------------------------------------------------ stages that learn labels

# What makes two ViTs the same network: not drop path (a training setting of each stage), nor the input size
# (position tables are resized to another patch grid when the pretrained weights are loaded).
ARCH_FIELDS = tuple(f.name for f in dataclasses.fields(ViTConfig) if f.name not in ("drop_path", "img_size"))


def pretraining_run(run_path: Path | str) -> tuple[RunDir, ViTConfig]:
    """A pretraining run (``finetune`` / ``segment --init``) and the architecture of its ViT."""
    run = RunDir(run_path)
    info = run.read_config()
    if info.get("stage") != "pretrain":
        raise RunError(f"{run.path} is a {info.get('stage')!r} run, not a pretraining run")
    config = info.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        raise RunError(f"{run.config_path}: not a pretraining run's config (no model table)")
    try:
        arch = from_dict(ViTConfig, model, "model.")
    except ValueError as e:
        raise RunError(f"{run.config_path}: not a pretraining run's config ({e})") from None
    if not run.checkpoint_path.exists():
        raise RunError(f"{run.path}: the pretraining run has no {run.checkpoint_path.name} yet (nothing to start from)")
    return run, arch


class TaskStage(Stage):
    """A stage that learns labels (classification, segmentation), from scratch or from a pretraining run ``init``.

    The architecture is the config's: a pretraining run whose ViT differs is an error naming the fields, never a
    silent replacement.
    """

    def __init__(self, cfg, runtime: Runtime, run: RunDir, init: Path | str | None = None) -> None:
        super().__init__(cfg, runtime, run)
        self.init = init
        if init is not None:
            run.write_json(INIT_LINK, {"path": str(Path(init).resolve())})
            pretrained = RunDir(init).read_config().get(PRETRAINING_DATA)
            if pretrained is not None and runtime.is_main:
                run.note_in_config(PRETRAINED_ON, {"run": str(Path(init).resolve()), **pretrained})

    @classmethod
    def learns_without_labels(cls, cfg) -> bool:
        """Whether the config's run learns from something other than labels (a teacher), and so may read
        ``data.unlabeled``."""
        return False

    @classmethod
    def configure(cls, cfg, init: Path | str | None = None):
        if cfg.data.unlabeled and not cls.learns_without_labels(cfg):
            raise ConfigError(
                f"data.unlabeled: {cls.name} learns from labels; pretrain on unlabeled recordings (mem pretrain "
                "--unlabeled PATH), then finetune from that run (--init) or distil a finetune run on them (--teacher)"
            )
        cfg = fit_input(cfg)
        if init is not None:
            _, pretrained = pretraining_run(init)
            differ = [f for f in ARCH_FIELDS if getattr(cfg.model, f) != getattr(pretrained, f)]
            if differ:
                settings = ", ".join(f"{f}={getattr(pretrained, f)}" for f in differ)
                mine = ", ".join(f"{f}={getattr(cfg.model, f)}" for f in differ)
                hint = " (in_chans follows input.channels)" if "in_chans" in differ else ""
                raise RunError(
                    f"{init} was pretrained with {settings}, this {cls.name} run would build {mine}: use the same "
                    f"preset and model settings as the pretraining run{hint}"
                )
        return cfg

    def vit(self, model: torch.nn.Module) -> MEMViT:
        """The ViT inside the task model, where the pretrained weights go."""
        return model

    def initialize(self, model: torch.nn.Module) -> None:
        if self.init is not None:
            run, _ = pretraining_run(self.init)
            weights = load_checkpoint(run.checkpoint_path).get("model")
            try:
                report = load_pretrained_backbone(self.vit(model), weights)
            except (ValueError, TypeError, AttributeError, RuntimeError) as e:  # not a dict of tensors of this ViT
                raise RunError(f"{run.checkpoint_path}: no pretrained weights of this ViT ({e})") from None
            if report.missing:
                raise RunError(f"{self.init}: pretrained weights lack {', '.join(report.missing)}")
