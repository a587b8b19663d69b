"""Writing exports: a model (and its tokenizer) as safetensors + JSON, written atomically, refused before it is
written when ``load_model`` would refuse it; a run's best model exported for the live server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from mem_core.configuration import from_dict, to_dict
from mem_core.models import DiscreteVAE
from mem_core.models.cnn import VIT
from mem_core.representation import InputSpec
from mem_core.runs.export.load import load_model, load_tokenizer
from mem_core.runs.export.meta import EXPORT_VERSION, MODEL_FILE, TOKENIZER_FILE, TOKENIZER_JSON, check_meta
from mem_core.runs.lineage import MODEL_JSON, tokenizer_of
from mem_core.runs.onnx_model import ONNX_MODEL_FILE
from mem_core.runs.rundir import CONFIG_FILE, CORPUS_MANIFEST, RunError, atomic_write_bytes, json_safe, make_dir


def export_model(
    model: torch.nn.Module,
    out: Path | str,
    *,
    task: str,
    architecture: dict[str, Any],
    classes: list[str],
    input_spec: InputSpec,
    arch: str = VIT,
    head_channels: int | None = None,
    tokenizer: DiscreteVAE | None = None,
    source_run: str | None = None,
    window_ms: float | None = None,
) -> Path:
    """Write ``model.safetensors`` + ``model.json`` (and ``tokenizer.*`` when given) to ``out``; ``RunError`` naming
    ``model.json`` when ``load_model`` would refuse it. ``window_ms`` is the time span of the training samples, if
    they all had one (see ``training_window``)."""
    out = Path(out)
    meta = {
        "format_version": EXPORT_VERSION,
        "task": task,
        "arch": arch,
        "architecture": architecture,
        "classes": classes,
        "input": to_dict(input_spec),
        "head_channels": head_channels,
        "training_window": {"events": input_spec.n_max, "ms": window_ms},
        "source_run": source_run,
    }
    check_meta(meta, out / MODEL_JSON)
    prepare_export_dir(out)
    _write_safetensors(out / MODEL_FILE, model)
    atomic_write_bytes(out / MODEL_JSON, (json.dumps(json_safe(meta), indent=2) + "\n").encode())
    if tokenizer is not None:
        export_tokenizer(tokenizer, out)
    else:
        for name in (TOKENIZER_FILE, TOKENIZER_JSON):
            (out / name).unlink(missing_ok=True)
    return out


def prepare_export_dir(out: Path, export_format: str = "safetensors") -> None:
    """Create the export directory ``out``; ``RunError`` naming it when it cannot be one (see ``rundir.make_dir``)
    or holds a run, a corpus or an export of the other ``export_format`` (safetensors or onnx), whose files an export
    would overwrite (a pretraining run's ``tokenizer.json``, an export's ``model.json``)."""
    make_dir(out, "an export")
    other = (MODEL_FILE, "a safetensors export") if export_format == "onnx" else (ONNX_MODEL_FILE, "an ONNX export")
    for name, what in ((CONFIG_FILE, "a run"), (CORPUS_MANIFEST, "a corpus"), other):
        if (out / name).exists():
            raise RunError(f"{out}: holds {what} ({name}): export into a folder of its own")


def _write_safetensors(path: Path, module: torch.nn.Module) -> None:
    """``module``'s weights as a safetensors file, written atomically: an export being replaced (``mem serve
    --watch`` loads the new one) is never seen half written, and a failed write keeps the old file."""
    atomic_write_bytes(path, save({k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}))


def export_tokenizer(tokenizer: DiscreteVAE, out: Path | str) -> Path:
    """Write ``tokenizer.safetensors`` + ``tokenizer.json`` to ``out`` (``load_tokenizer(out)`` reads them back)."""
    out = Path(out)
    prepare_export_dir(out)
    _write_safetensors(out / TOKENIZER_FILE, tokenizer)
    meta = {"format_version": EXPORT_VERSION, "architecture": to_dict(tokenizer.config)}
    atomic_write_bytes(out / TOKENIZER_JSON, (json.dumps(meta, indent=2) + "\n").encode())
    return out


def export_run(run_path: Path | str, out: Path | str) -> Path:
    """Export a finetune / segment run's best model for the live server (see ``export_model``).

    When the run was initialised from a MEM pretraining run, its tokenizer is exported beside it so the live
    server can show the token overlay.
    """
    prepare_export_dir(Path(out))  # before the model loads: a bad --out is refused at once
    model, meta = load_model(run_path)
    tokenizer_run = tokenizer_of(run_path)
    return export_model(
        model,
        out,
        task=meta["task"],
        architecture=meta["architecture"],
        classes=meta["classes"],
        input_spec=from_dict(InputSpec, meta["input"]),
        arch=meta["arch"],
        head_channels=meta["head_channels"],
        tokenizer=load_tokenizer(tokenizer_run) if tokenizer_run is not None else None,
        source_run=str(Path(run_path).resolve()),
        window_ms=meta["training_window"]["ms"],
    )
