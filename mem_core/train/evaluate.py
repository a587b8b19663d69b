"""Evaluate a trained run on any split, and export it for the live server (safetensors + JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from mem_core.configuration import from_dict, to_dict
from mem_core.models import DiscreteVAE, MEMClassifier, MEMViT, SegmentationModel, TokenizerConfig, ViTConfig
from mem_core.representation import InputSpec
from mem_core.train.common import open_for_input
from mem_core.train.fit import build_loader
from mem_core.train.rundir import RunDir, RunError, atomic_write_bytes, json_safe
from mem_core.train.runtime import setup_runtime

EXPORT_VERSION = 1
MODEL_FILE, MODEL_JSON = "model.safetensors", "model.json"
TOKENIZER_FILE, TOKENIZER_JSON = "tokenizer.safetensors", "tokenizer.json"


def load_task_model(run_path: Path | str, device="cpu"):
    """(model, info) of a finetuning or segmentation run; ``info`` has stage, config, classes, input spec."""
    stage = RunDir(run_path).read_config().get("stage")
    if stage == "finetune":
        from mem_core.train.finetune import load_classifier

        model, info = load_classifier(run_path, device)
    elif stage == "segment":
        from mem_core.train.segment import load_segmenter

        model, info = load_segmenter(run_path, device)
    else:
        raise RunError(f"{run_path} is a {stage!r} run: evaluate/export take a finetune or segment run")
    info["stage"] = stage
    info["input"] = from_dict(InputSpec, info["config"]["input"])
    return model, info


def evaluate_run(
    run_path: Path | str,
    dataset: str,
    data: Path | str | None,
    split: str,
    *,
    batch_size: int = 64,
    num_workers: int = 0,
    device: str = "auto",
) -> dict[str, Any]:
    """Metrics of a run's best model on ``split``: classification top1 / n / confusion, or mIoU / mAcc / aAcc / n."""
    runtime = setup_runtime(device, amp=True)
    model, info = load_task_model(run_path, runtime.device)
    source = open_for_input(dataset, data, split, info["input"])
    classes = source.classes if info["stage"] == "finetune" else source.mask_classes
    if classes != info["classes"]:
        raise RunError(
            f"{dataset} {split} has classes {classes}, but the model in {run_path} was trained on {info['classes']}"
        )
    loader, _ = build_loader(
        source, info["input"], train=False, seed=0, batch_size=batch_size, runtime=runtime, num_workers=num_workers
    )
    if info["stage"] == "finetune":
        from mem_core.train.finetune import evaluate_classifier

        result = evaluate_classifier(model, loader, info["input"], runtime, len(info["classes"]))
    else:
        from mem_core.train.segment import evaluate_segmenter

        result = evaluate_segmenter(model, loader, info["input"], runtime, len(info["classes"]))
    return json_safe({"run": str(run_path), "dataset": dataset, "split": split, "classes": info["classes"], **result})


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
) -> Path:
    """Write ``model.safetensors`` + ``model.json`` (and ``tokenizer.*`` when given) to ``out``."""
    if task not in ("classification", "segmentation"):
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
        "source_run": source_run,
    }
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(out / MODEL_FILE))
    atomic_write_bytes(out / MODEL_JSON, (json.dumps(json_safe(meta), indent=2) + "\n").encode())
    if tokenizer is not None:
        state = {k: v.detach().cpu().contiguous() for k, v in tokenizer.state_dict().items()}
        save_file(state, str(out / TOKENIZER_FILE))
        tok_meta = {"format_version": EXPORT_VERSION, "architecture": to_dict(tokenizer.config)}
        atomic_write_bytes(out / TOKENIZER_JSON, (json.dumps(tok_meta, indent=2) + "\n").encode())
    else:
        for name in (TOKENIZER_FILE, TOKENIZER_JSON):
            (out / name).unlink(missing_ok=True)
    return out


def export_run(run_path: Path | str, out: Path | str) -> Path:
    """Export a finetune/segment run's best model for the live server (see ``export_model``).

    When the run was initialised from a MEM pretraining run, its tokenizer is exported beside it so the live
    server can show the token overlay.
    """
    model, info = load_task_model(run_path, "cpu")
    return export_model(
        model,
        out,
        task=_task(info["stage"]),
        architecture=info["config"]["model"],
        classes=info["classes"],
        input_spec=info["input"],
        head_channels=info["config"].get("head_channels"),
        tokenizer=_run_tokenizer(Path(run_path), "cpu"),
        source_run=str(Path(run_path).resolve()),
    )


def _task(stage: str) -> str:
    return "classification" if stage == "finetune" else "segmentation"


def _run_tokenizer(run_path: Path, device) -> DiscreteVAE | None:
    """The tokenizer behind a finetune run (for the token overlay), loaded; None when it has none."""
    tokenizer_run = _tokenizer_of(run_path)
    if tokenizer_run is None:
        return None
    from mem_core.train.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_run, device)


def _tokenizer_of(run_path: Path) -> Path | None:
    """The tokenizer run behind a finetune run: finetune/init.json -> pretrain/tokenizer.json -> tokenizer run."""
    try:
        init = Path(json.loads((run_path / "init.json").read_text())["path"])
        return Path(json.loads((init / "tokenizer.json").read_text())["path"])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None


def load_export(path: Path | str, device="cpu") -> tuple[torch.nn.Module, dict[str, Any], DiscreteVAE | None]:
    """(model, meta, tokenizer or None) from an export directory, or from a run directory (exported on the fly)."""
    path = Path(path)
    if (path / "config.json").exists() and not (path / MODEL_JSON).exists():
        model, info = load_task_model(path, device)
        tok = _run_tokenizer(path, device)
        meta = {
            "task": _task(info["stage"]),
            "classes": info["classes"],
            "input": to_dict(info["input"]),
            "architecture": info["config"]["model"],
        }
        return model, meta, tok
    if not (path / MODEL_JSON).is_file():
        raise RunError(f"{path}: neither an export directory (no {MODEL_JSON}) nor a run directory")
    meta = json.loads((path / MODEL_JSON).read_text())
    if meta.get("format_version") != EXPORT_VERSION:
        raise RunError(f"{path / MODEL_JSON}: unsupported export format {meta.get('format_version')!r}")
    arch = from_dict(ViTConfig, meta["architecture"])
    if meta["task"] == "classification":
        model: torch.nn.Module = MEMClassifier(MEMViT(arch), len(meta["classes"]))
    else:
        model = SegmentationModel(MEMViT(arch), len(meta["classes"]), channels=meta["head_channels"])
    model.load_state_dict(load_file(str(path / MODEL_FILE)))
    tok = None
    if (path / TOKENIZER_JSON).is_file():
        tok_meta = json.loads((path / TOKENIZER_JSON).read_text())
        tok = DiscreteVAE(from_dict(TokenizerConfig, tok_meta["architecture"]))
        tok.load_state_dict(load_file(str(path / TOKENIZER_FILE)))
        tok.to(device).eval().requires_grad_(False)
    return model.to(device).eval(), meta, tok
