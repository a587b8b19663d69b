"""Model files: load a trained model from a run or an export directory, and export it for the live server.

An export directory holds ``model.safetensors`` + ``model.json`` (format version, task, architecture, classes,
input spec, head width, the window the model was trained on) and, when the model was pretrained with MEM,
``tokenizer.safetensors`` + ``tokenizer.json`` for the live token overlay. Safetensors and JSON only: nothing in an export is executed.

``load_model`` takes an export directory or a finetune / segment run directory (the run's best checkpoint);
``load_tokenizer`` a tokenizer run or an export directory that carries one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from mem_core.configuration import from_dict, to_dict
from mem_core.models import DiscreteVAE, MEMViT, SegmentationModel, TokenizerConfig, ViTConfig
from mem_core.representation import InputSpec
from mem_core.train.rundir import RunDir, RunError, atomic_write_bytes, json_safe, load_checkpoint

EXPORT_VERSION = 1
MODEL_FILE, MODEL_JSON = "model.safetensors", "model.json"
TOKENIZER_FILE, TOKENIZER_JSON = "tokenizer.safetensors", "tokenizer.json"
TASKS = {"finetune": "classification", "segment": "segmentation"}  # training stage -> task of its model
NCARS_SAMPLE_US = 100_000  # every N-Cars sample is 100 ms of events (Sironi et al., 2018)


def build_task_model(meta: dict[str, Any]) -> torch.nn.Module:
    """An untrained classifier or segmenter with the architecture, classes and head that ``meta`` describes."""
    arch = from_dict(ViTConfig, meta["architecture"])
    if meta["task"] == "classification":
        return MEMViT(arch, len(meta["classes"]))
    if meta["task"] == "segmentation":
        return SegmentationModel(MEMViT(arch), len(meta["classes"]), channels=meta["head_channels"])
    raise ValueError(f"task must be classification or segmentation, got {meta['task']!r}")


def load_model(path: Path | str, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode, meta) from an export directory or a finetune / segment run directory.

    ``meta`` holds ``task``, ``architecture``, ``classes``, ``input`` (an ``InputSpec`` dict), ``head_channels`` and
    ``training_window`` (``{"events", "ms"}``, see ``training_window``; for exports written before it was recorded:
    the input's ``n_max`` events and no time span).
    """
    path = Path(path)
    if (path / MODEL_JSON).is_file():
        meta = json.loads((path / MODEL_JSON).read_text())
        if meta.get("format_version") != EXPORT_VERSION:
            raise RunError(f"{path / MODEL_JSON}: unsupported export format {meta.get('format_version')!r}")
        weights = load_file(str(path / MODEL_FILE))
    elif (path / "config.json").is_file():
        meta, weights = _run_model(RunDir(path))
    else:
        raise RunError(f"{path}: not a MEM run directory (no config.json) nor an export directory (no {MODEL_JSON})")
    meta.setdefault("training_window", {"events": meta["input"].get("n_max", InputSpec.n_max), "ms": None})
    model = build_task_model(meta)
    model.load_state_dict(_from_legacy_layout(model, weights))
    return model.to(device).eval(), meta


def training_window(config: dict[str, Any]) -> dict[str, Any]:
    """The window a training run's samples had: ``events``, the input's ``n_max``, and ``ms``, the time span of the
    dataset's samples where every sample spans the same (N-Cars 100 ms, sim 50 ms, DSEC-Semantic 50 ms), else None.

    The live server uses it as its default window, so a model is served on windows like those it learned from.
    """
    from mem_core.datasets.dsec_semantic import DSEC_WINDOW_US  # lazy: the datasets are only needed here
    from mem_core.datasets.sim import SIM_DURATION_US

    span_us = {"ncars": NCARS_SAMPLE_US, "sim": SIM_DURATION_US, "dsec-semantic": DSEC_WINDOW_US}
    dataset = config.get("data", {}).get("dataset")
    events = config.get("input", {}).get("n_max", InputSpec.n_max)
    return {"events": events, "ms": span_us[dataset] / 1000 if dataset in span_us else None}


def _from_legacy_layout(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights saved before the task models used timm's own pooling head (November 2026), made loadable.

    A classifier then wrapped its ViT (``backbone.*`` keys) and normalized every token before pooling as well as
    after (``fc_norm``): that token norm is put back, so the model computes what it was trained to.
    """
    if isinstance(model, MEMViT) and "backbone.cls_token" in weights:
        model.norm = torch.nn.LayerNorm(model.embed_dim, eps=1e-6)  # timm's Beit norm
        return {key.removeprefix("backbone."): value for key, value in weights.items()}
    return weights


def _run_model(run: RunDir) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The meta and best weights of a finetune / segment run."""
    info = run.read_config()
    stage = info.get("stage")
    if stage not in TASKS:
        raise RunError(f"{run.path} is a {stage!r} run: a model comes from a finetune or segment run")
    config = info["config"]
    meta = {
        "task": TASKS[stage],
        "architecture": config["model"],
        "classes": json.loads((run.path / "classes.json").read_text())["classes"],
        "input": config["input"],
        "head_channels": config.get("head_channels"),
        "training_window": training_window(config),
    }
    path = run.best_path if run.best_path.exists() else run.checkpoint_path
    return meta, load_checkpoint(path)["model"]


def load_tokenizer(path: Path | str, device: torch.device | str = "cpu") -> DiscreteVAE:
    """A frozen tokenizer (eval mode) from a tokenizer run directory or an export directory that carries one."""
    path = Path(path)
    if (path / TOKENIZER_JSON).is_file():
        meta = json.loads((path / TOKENIZER_JSON).read_text())
        model = DiscreteVAE(_tokenizer_config(meta["architecture"]))
        model.load_state_dict(load_file(str(path / TOKENIZER_FILE)))
    elif (path / "config.json").is_file():
        run = RunDir(path)
        info = run.read_config()
        if info.get("stage") != "tokenizer":
            raise RunError(f"{run.path} is a {info.get('stage')!r} run, not a tokenizer run")
        model = DiscreteVAE(_tokenizer_config(info["config"]["model"]))
        model.load_state_dict(load_checkpoint(run.checkpoint_path)["model"])
    else:
        raise RunError(f"{path}: neither a tokenizer run nor an export directory with a tokenizer")
    return model.to(device).eval().requires_grad_(False)


def _tokenizer_config(values: dict[str, Any]) -> TokenizerConfig:
    """A stored tokenizer architecture (runs and exports before November 2026 call ``img_size`` ``image_size``)."""
    return from_dict(TokenizerConfig, {("img_size" if k == "image_size" else k): v for k, v in values.items()})


def tokenizer_of(path: Path | str) -> Path | None:
    """Where the tokenizer behind a model lives: the export directory itself when it carries one, or for a finetune
    run the chain init.json -> pretraining run -> tokenizer.json -> tokenizer run; None when there is none."""
    path = Path(path)
    if (path / TOKENIZER_JSON).is_file():
        return path
    try:
        init = Path(json.loads((path / "init.json").read_text())["path"])
        return Path(json.loads((init / "tokenizer.json").read_text())["path"])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None


def export_model(
    model: torch.nn.Module,
    out: Path | str,
    *,
    task: str,
    architecture: dict[str, Any],
    classes: list[str],
    input_spec: InputSpec,
    head_channels: int | None = None,
    tokenizer: DiscreteVAE | None = None,
    source_run: str | None = None,
    window_ms: float | None = None,
) -> Path:
    """Write ``model.safetensors`` + ``model.json`` (and ``tokenizer.*`` when given) to ``out``. ``window_ms`` is
    the time span of the training samples, if they all had one (see ``training_window``)."""
    if task not in TASKS.values():
        raise ValueError(f"task must be classification or segmentation, got {task!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "format_version": EXPORT_VERSION,
        "task": task,
        "architecture": architecture,
        "classes": classes,
        "input": to_dict(input_spec),
        "head_channels": head_channels,
        "training_window": {"events": input_spec.n_max, "ms": window_ms},
        "source_run": source_run,
    }
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(out / MODEL_FILE))
    atomic_write_bytes(out / MODEL_JSON, (json.dumps(json_safe(meta), indent=2) + "\n").encode())
    if tokenizer is not None:
        export_tokenizer(tokenizer, out)
    else:
        for name in (TOKENIZER_FILE, TOKENIZER_JSON):
            (out / name).unlink(missing_ok=True)
    return out


def export_tokenizer(tokenizer: DiscreteVAE, out: Path | str) -> Path:
    """Write ``tokenizer.safetensors`` + ``tokenizer.json`` to ``out`` (``load_tokenizer(out)`` reads them back)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tokenizer.state_dict().items()}, str(out / TOKENIZER_FILE))
    meta = {"format_version": EXPORT_VERSION, "architecture": to_dict(tokenizer.config)}
    atomic_write_bytes(out / TOKENIZER_JSON, (json.dumps(meta, indent=2) + "\n").encode())
    return out


def export_run(run_path: Path | str, out: Path | str) -> Path:
    """Export a finetune / segment run's best model for the live server (see ``export_model``).

    When the run was initialised from a MEM pretraining run, its tokenizer is exported beside it so the live
    server can show the token overlay.
    """
    model, meta = load_model(run_path)
    tokenizer_run = tokenizer_of(run_path)
    return export_model(
        model,
        out,
        task=meta["task"],
        architecture=meta["architecture"],
        classes=meta["classes"],
        input_spec=from_dict(InputSpec, meta["input"]),
        head_channels=meta["head_channels"],
        tokenizer=load_tokenizer(tokenizer_run) if tokenizer_run is not None else None,
        source_run=str(Path(run_path).resolve()),
        window_ms=meta["training_window"]["ms"],
    )


def export_random(
    out: Path | str,
    *,
    task: str = "classification",
    classes: tuple[str, ...] = ("background", "car"),
    architecture: ViTConfig | None = None,
    input_spec: InputSpec | None = None,
    tokenizer: TokenizerConfig | None = None,
    head_channels: int = 32,
    seed: int = 0,
    window_ms: float | None = None,
) -> Path:
    """Export a randomly initialised model (and tokenizer), for benchmarks, tests and trying the live path without
    training. ``architecture`` defaults to a ViT-B/16 and ``input_spec`` to 224 x 224 inputs of that model;
    ``window_ms`` is recorded as the training samples' time span."""
    arch = architecture or ViTConfig(drop_path=0.0)
    spec = input_spec or InputSpec(size=(arch.img_size, arch.img_size))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        meta = {"task": task, "architecture": to_dict(arch), "classes": list(classes), "head_channels": head_channels}
        model = build_task_model(meta)
        tok = DiscreteVAE(tokenizer) if tokenizer is not None else None
    return export_model(
        model,
        out,
        task=task,
        architecture=to_dict(arch),
        classes=list(classes),
        input_spec=spec,
        head_channels=head_channels if task == "segmentation" else None,
        tokenizer=tok,
        window_ms=window_ms,
    )
