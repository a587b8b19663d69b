"""Loading a model to run it: from an export directory (JSON + safetensors) or a finetune / segment run (its best
checkpoint), and a tokenizer from an export or a tokenizer run; every file checked before it is trusted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes

from mem_core.files import FileTooLarge, file_problem, read_bounded
from mem_core.limits import MAX_WEIGHTS_BYTES
from mem_core.models import DiscreteVAE
from mem_core.models.cnn import VIT
from mem_core.runs.export.cost import load_checked, meta_skeleton, task_window, weights_bound
from mem_core.runs.export.meta import (
    MODEL_FILE,
    TASKS,
    TOKENIZER_FILE,
    TOKENIZER_JSON,
    build_task_model,
    check_meta,
    read_versioned,
    tokenizer_config,
    training_window,
)
from mem_core.runs.lineage import MODEL_JSON, read_json
from mem_core.runs.onnx_model import ONNX_MODEL_FILE
from mem_core.runs.rundir import CONFIG_FILE, RunDir, RunError, load_checkpoint


def load_model(path: Path | str, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode, meta) from an export directory or a finetune / segment run directory.

    ``meta`` holds ``task``, ``architecture``, ``classes``, ``input`` (an ``InputSpec`` dict), ``head_channels``,
    ``training_window`` (``{"events", "ms"}``, see ``training_window``) and ``window_flops``: the floating-point
    operations of one window through the model (what a live server's warm-up runs).
    """
    path = Path(path)
    skeleton = None  # the model built on the meta device, where it bounds the weights file before it is read
    # a file there in any form is read: one that is no regular file (a FIFO) is refused naming it
    if os.path.lexists(path / MODEL_JSON):
        description = path / MODEL_JSON
        meta = read_versioned(description)
        if meta.get("format") == "onnx":
            raise RunError(
                f"{path}: an ONNX export: mem serve runs its {ONNX_MODEL_FILE} with onnxruntime; torch reads exports of "
                f"{MODEL_FILE}"
            )
        check_meta(meta, description)
        weights_file = path / MODEL_FILE
        skeleton = meta_skeleton(lambda: build_task_model(meta), weights_file)
        weights = _read_safetensors(weights_file, weights_bound(skeleton), description)
    elif os.path.lexists(path / CONFIG_FILE):
        run = RunDir(path)
        description = run.config_path
        meta, weights_file = _run_model(run)
        weights = _checkpoint_model(weights_file)
    else:
        raise RunError(f"{path}: not a MEM run directory (no config.json) nor an export directory (no {MODEL_JSON})")
    window = task_window(meta)
    model, meta["window_flops"] = load_checked(
        lambda: build_task_model(meta), weights, weights_file, description, window, described=meta, skeleton=skeleton
    )
    return model.to(device).eval(), meta


def _run_model(run: RunDir) -> tuple[dict[str, Any], Path]:
    """The meta of a finetune / segment run (checked) and its best checkpoint."""
    info = run.read_config()
    stage = info.get("stage")
    if stage not in TASKS:
        raise RunError(f"{run.path} is a {stage!r} run: a model comes from a finetune or segment run")
    config = info.get("config")
    if not isinstance(config, dict):
        raise RunError(f"{run.config_path}: no 'config' object")
    classes = read_json(run.path / "classes.json")
    meta = {
        "task": TASKS[stage],
        "arch": config.get("arch", VIT),
        "architecture": config.get("model"),
        "classes": classes.get("classes"),
        "input": config.get("input"),
        "head_channels": config.get("head_channels"),
        "training_window": training_window(config),
    }
    check_meta(meta, run.config_path)
    return meta, run.best_path if run.best_path.exists() else run.checkpoint_path


def _checkpoint_model(path: Path) -> dict[str, Any]:
    """The model weights a checkpoint holds (``RunError`` naming it when there are none)."""
    weights = load_checkpoint(path).get("model")
    if not isinstance(weights, dict):
        raise RunError(f"{path}: the checkpoint holds no model weights (no 'model' dict)")
    return weights


def _read_safetensors(path: Path, bound: int, description: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, read from a regular file of at most ``bound`` bytes: what the model that
    ``description`` describes weighs (``weights_bound``; an 8 GiB sparse file in place of a ViT-S's weights grew the
    server by 5.6 GB). safetensors' ``load_file`` opens any path, and blocked for good on a FIFO, holding the GIL."""
    try:
        data = read_bounded(path, min(bound, MAX_WEIGHTS_BYTES))
    except FileTooLarge as e:
        raise RunError(f"{path}: {e}, more than the model {description.name} describes can weigh") from None
    except OSError as e:
        raise RunError(f"{path}: {file_problem(e)}") from None
    try:
        return load_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise RunError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from e


def load_tokenizer(path: Path | str, device: torch.device | str = "cpu") -> DiscreteVAE:
    """A frozen tokenizer (eval mode) from a tokenizer run directory or an export directory that carries one."""
    path = Path(path)
    skeleton = None  # as in load_model
    if os.path.lexists(path / TOKENIZER_JSON):  # as in load_model
        description = path / TOKENIZER_JSON
        config = tokenizer_config(read_versioned(description).get("architecture"), description)
        weights_file = path / TOKENIZER_FILE
        skeleton = meta_skeleton(lambda: DiscreteVAE(config), weights_file)
        weights = _read_safetensors(weights_file, weights_bound(skeleton), description)
    elif os.path.lexists(path / CONFIG_FILE):
        run = RunDir(path)
        info = run.read_config()
        if info.get("stage") != "tokenizer":
            raise RunError(f"{run.path} is a {info.get('stage')!r} run, not a tokenizer run")
        stored = info.get("config")
        description = run.config_path
        config = tokenizer_config(stored.get("model") if isinstance(stored, dict) else None, description)
        weights_file = run.checkpoint_path
        weights = _checkpoint_model(weights_file)
    else:
        raise RunError(f"{path}: neither a tokenizer run nor an export directory with a tokenizer")
    window = torch.zeros(1, config.in_chans, config.img_size, config.img_size)  # what the live token overlay runs on
    model, _ = load_checked(
        lambda: DiscreteVAE(config),
        weights,
        weights_file,
        description,
        lambda m: m.token_ids(window),
        skeleton=skeleton,
    )
    return model.to(device).eval().requires_grad_(False)
