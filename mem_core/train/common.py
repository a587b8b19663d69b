"""A stage's setup: its runtime and run directory, the model input's geometry, a step's generator, the wrapped model
(DDP, compiled blocks). What it trains on is ``train.data``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from mem_core.configuration import to_dict
from mem_core.models.vit import compile_blocks
from mem_core.runs.rundir import RunDir
from mem_core.train.runtime import Runtime, setup_runtime


def start_run(stage: str, cfg, out: Path | str, *, resume: bool) -> tuple[Runtime, RunDir]:
    """Runtime (device, DDP) and the run directory holding the resolved config."""
    runtime = setup_runtime(cfg.device, cfg.amp, cfg.cpu_bf16)
    defaults = to_dict(type(cfg)())  # what a run started before a setting existed ran with
    run = RunDir.create(out, stage, to_dict(cfg), resume=resume, defaults=defaults) if runtime.is_main else RunDir(out)
    if runtime.distributed:
        torch.distributed.barrier()
    return runtime, run


def fit_input(cfg):
    """Derive the model's input geometry (channels, size) from the input spec, so the two never disagree."""
    spec = cfg.input
    if spec.size[0] != spec.size[1]:
        raise ValueError(f"input.size must be square for the ViT, got {spec.size}")
    model = dataclasses.replace(cfg.model, img_size=spec.size[0], in_chans=spec.in_chans)  # ViT or tokenizer
    return dataclasses.replace(cfg, model=model)


def batch_generator(cfg, runtime: Runtime, epoch: int, step: int) -> torch.Generator:
    """The CPU generator of one step's batched randomness (random crop, RandAugment's draws), whatever the device:
    a CUDA generator cannot drive the CPU draws (``torch.randint(..., generator=...)`` rejects it)."""
    g = torch.Generator()
    g.manual_seed(((cfg.seed * 1_000_003 + epoch) * 1_000_003 + step) * 64 + runtime.rank)
    return g


def device_generator(g: torch.Generator, device: torch.device) -> torch.Generator:
    """``g`` itself on the CPU; elsewhere a generator on ``device`` seeded from ``g`` (for noise drawn there)."""
    if device.type == "cpu":
        return g
    return torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=g)))


def wrap_model(model: torch.nn.Module, cfg, runtime: Runtime) -> torch.nn.Module:
    """DDP (and optionally torch.compile) around ``model`` for training; ``model`` itself stays the saved one.

    ``cfg.compile = true``: the DDP-wrapped model is the one compiled, the order torch supports: the compiled graph is
    split at DDP's gradient buckets, so their all-reduce overlaps the backward (around a compiled model DDP reduces
    after it). ``"blocks"``, on a GPU only: each transformer block of ``model`` is compiled on its own, in place
    (``models.vit.compile_blocks``), validation included; a model without such blocks is compiled whole. Elsewhere
    the model stays eager: the paper presets ask for blocks, and on a CPU inductor's C++ compilation of them takes
    minutes (a paper preset's first steps at tiny size: 2 min against 20 s).
    """
    sync_batch_norm(model, runtime)
    runtime.place(model)
    whole = cfg.compile is True
    if cfg.compile == "blocks" and runtime.device.type == "cuda":
        whole = compile_blocks(model) == 0
    train_model = model
    if runtime.distributed:
        device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        train_model = torch.nn.parallel.DistributedDataParallel(train_model, device_ids=device_ids)
    if whole:
        train_model = torch.compile(train_model)
    return train_model


def sync_batch_norm(model: torch.nn.Module, runtime: Runtime) -> None:
    """Under DDP on GPUs, make the BatchNorm layers inside ``model`` (segmentation head, convolutional stems)
    SyncBatchNorm: statistics over the global batch, as one process computes them. The weights and buffers are the
    same, so checkpoints load into BatchNorm. gloo on CPUs has no SyncBatchNorm: each process normalises its share."""
    if runtime.distributed and runtime.device.type == "cuda":
        torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # replaces the layers inside model
