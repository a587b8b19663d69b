"""Model files: load a trained model from a run or an export directory, and export it for the live server.

An export directory holds ``model.safetensors`` + ``model.json`` (format version, task, architecture, classes,
input spec, head width, the window the model was trained on) and, when the model was pretrained with MEM,
``tokenizer.safetensors`` + ``tokenizer.json`` for the live token overlay. Safetensors and JSON only: nothing in an
export is executed. A JSON file of another format version than ``EXPORT_VERSION`` is refused, naming both.

``load_model`` takes an export directory or a finetune / segment run directory (the run's best checkpoint);
``load_tokenizer`` a tokenizer run or an export directory that carries one.

Loading trusts nothing in the files: the JSON is read only up to ``MAX_JSON_BYTES`` and checked against a schema
(``ModelMeta``, ``mem_core.schema``; the architecture and input as a training config's, ``mem_core.train.configs``),
the architecture is first built on PyTorch's "meta" device (no memory), and the weights file must hold exactly the
tensors (names, shapes) of that model, so the model that is then built is no larger than its weights file, plus the
buffers it computes itself (relative position indices), which may take at most ``MAX_DERIVED_BYTES``. One window
through that skeleton counts the work the model asks of the live server per window, at most ``MAX_WINDOW_FLOPS``.
Every failure is a ``RunError`` naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired

import torch
from pydantic import Field, StrictInt
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save
from torch.utils.flop_counter import FlopCounterMode
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.configuration import from_dict, to_dict
from mem_core.errors import MemError
from mem_core.files import file_problem, read_bounded
from mem_core.limits import (
    MAX_DERIVED_BYTES,
    MAX_EXPORT_WINDOW_EVENTS,
    MAX_EXPORT_WINDOW_MS,
    MAX_WEIGHTS_BYTES,
    MAX_WIDTH,
    MAX_WINDOW_FLOPS,
)
from mem_core.models import DiscreteVAE, MEMViT, SegmentationModel, TokenizerConfig, ViTConfig
from mem_core.models.cnn import VIT, Arch, build_cnn
from mem_core.models.sizes import check_model_sizes
from mem_core.representation import InputSpec
from mem_core.runs.lineage import MODEL_JSON, TOKENIZER_LINK, read_json, tokenizer_of
from mem_core.runs.rundir import (
    CONFIG_FILE,
    CORPUS_MANIFEST,
    RunDir,
    RunError,
    atomic_write_bytes,
    json_safe,
    load_checkpoint,
    make_dir,
)
from mem_core.schema import ClassNames, SchemaError, Text, check, class_names_problem

EXPORT_VERSION = 2
MODEL_FILE, TOKENIZER_FILE = "model.safetensors", "tokenizer.safetensors"
TOKENIZER_JSON = TOKENIZER_LINK  # an export's tokenizer description (in a pretraining run, the link to its tokenizer)
TASKS = {"finetune": "classification", "segment": "segmentation"}  # training stage -> task of its model
# what building or running a described model raises when the description is inconsistent (timm asserts input sizes)
_BUILD_ERRORS = (MemError, ValueError, TypeError, ZeroDivisionError, OverflowError, RuntimeError, KeyError)
_RUN_ERRORS = (*_BUILD_ERRORS, AssertionError, IndexError)


class TrainingWindow(TypedDict):
    """The window a model was trained on: ``events`` (its ``n_max``) and ``ms``, the span every sample had, or None."""

    events: Annotated[StrictInt, Field(ge=1, le=MAX_EXPORT_WINDOW_EVENTS)]
    ms: Annotated[float, Field(gt=0, le=MAX_EXPORT_WINDOW_MS, allow_inf_nan=False)] | None


class ModelMeta(TypedDict):
    """A model's description (``model.json`` less its ``format_version``); ``architecture`` is a ``ViTConfig`` and
    ``input`` an ``InputSpec``, checked as a training config's; ``arch`` other than "vit" (a classifier only) is the
    timm CNN the model is instead."""

    task: Literal["classification", "segmentation"]
    classes: ClassNames
    arch: NotRequired[Arch]
    architecture: dict[str, Any]
    input: dict[str, Any]
    head_channels: Annotated[StrictInt, Field(ge=1, le=MAX_WIDTH)] | None
    training_window: TrainingWindow
    source_run: NotRequired[Text | None]


def build_task_model(meta: dict[str, Any]) -> torch.nn.Module:
    """An untrained classifier or segmenter with the architecture, classes and head that ``meta`` describes."""
    if meta.get("arch", VIT) != VIT:
        spec = from_dict(InputSpec, meta["input"])
        return build_cnn(meta["arch"], spec.in_chans, len(meta["classes"]))
    arch = from_dict(ViTConfig, meta["architecture"])
    if meta["task"] == "classification":
        return MEMViT(arch, len(meta["classes"]))
    if meta["task"] == "segmentation":
        return SegmentationModel(MEMViT(arch), len(meta["classes"]), channels=meta["head_channels"])
    raise ValueError(f"task must be classification or segmentation, got {meta['task']!r}")


def load_model(path: Path | str, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode, meta) from an export directory or a finetune / segment run directory.

    ``meta`` holds ``task``, ``architecture``, ``classes``, ``input`` (an ``InputSpec`` dict), ``head_channels``,
    ``training_window`` (``{"events", "ms"}``, see ``training_window``) and ``window_flops``: the floating-point
    operations of one window through the model (what a live server's warm-up runs; see ``limits.warm_up_timeout_s``).
    """
    path = Path(path)
    # a file there in any form is read: one that is no regular file (a FIFO) is refused naming it
    if os.path.lexists(path / MODEL_JSON):
        description = path / MODEL_JSON
        meta = _read_versioned(description)
        check_meta(meta, description)
        weights_file = path / MODEL_FILE
        weights = _read_safetensors(weights_file)
    elif os.path.lexists(path / CONFIG_FILE):
        run = RunDir(path)
        description = run.config_path
        meta, weights_file = _run_model(run)
        weights = _checkpoint_model(weights_file)
    else:
        raise RunError(f"{path}: not a MEM run directory (no config.json) nor an export directory (no {MODEL_JSON})")
    window = _task_window(meta)
    model, meta["window_flops"] = _load_checked(
        lambda: build_task_model(meta), weights, weights_file, description, window
    )
    return model.to(device).eval(), meta


def window_flops(meta: dict[str, Any], where: Path = Path(MODEL_JSON)) -> int:
    """The floating-point operations of one live window through the model that ``meta`` (checked by ``check_meta``)
    describes, counted on PyTorch's meta device: nothing is computed or allocated. ``RunError`` naming ``where``
    beyond ``MAX_WINDOW_FLOPS``."""
    with torch.device("meta"):
        skeleton = build_task_model(meta)
    return _window_flops(skeleton.eval(), _task_window(meta), where)


def _task_window(meta: dict[str, Any]) -> Callable[[torch.nn.Module], Any]:
    """What the live server runs a task model on: one (1, C, H, W) input of the model's ``InputSpec``."""
    spec = from_dict(InputSpec, meta["input"])
    return lambda model: model(torch.zeros(1, spec.in_chans, *spec.size))


def training_window(config: dict[str, Any]) -> dict[str, Any]:
    """The window a training run's samples had: ``events``, the input's ``n_max``, and ``ms``, the time span of the
    dataset's samples where every sample spans the same (``mem_core.datasets.sample_span_us``), else None.

    The live server uses it as its default window, so a model is served on windows like those it learned from.
    """
    from mem_core.datasets import sample_span_us  # lazy: the datasets (and their readers) are only needed here

    span_us = sample_span_us(config.get("data", {}).get("dataset"))
    events = config.get("input", {}).get("n_max", InputSpec.n_max)
    return {"events": events, "ms": None if span_us is None else span_us / 1000}


def _read_versioned(path: Path) -> dict[str, Any]:
    """The JSON object of an export file, refused unless it is of ``EXPORT_VERSION``."""
    meta = read_json(path)
    version = meta.get("format_version")
    if version != EXPORT_VERSION:
        raise RunError(
            f"{path}: export format version {version!r}, this MEM reads version {EXPORT_VERSION} "
            "(export the model again with `mem export`)"
        )
    return meta


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


def check_meta(meta: dict[str, Any], where: Path) -> None:
    """Raise ``RunError`` naming ``where`` unless ``meta`` describes a model MEM can build and serve within its
    limits: ``ModelMeta``, distinct class names, an architecture and input a training config could have."""
    try:
        check(ModelMeta, meta)
    except SchemaError as e:
        raise RunError(f"{where}: {e}") from None
    problem = class_names_problem(meta["classes"])
    if problem is not None:
        raise RunError(f"{where}: {problem}")
    if meta["task"] == "segmentation" and meta["head_channels"] is None:
        raise RunError(f"{where}: head_channels: a segmentation model needs its head's width")
    if meta["task"] == "segmentation" and meta.get("arch", VIT) != VIT:
        raise RunError(f"{where}: arch: a segmentation model is a ViT, not {meta['arch']!r}")
    try:
        check_model_sizes(from_dict(ViTConfig, meta["architecture"], "architecture."), "architecture.")
        from_dict(InputSpec, meta["input"], "input.")  # its fields' bounds checked as it is built
    except ValueError as e:  # a ConfigError, or a __post_init__ finding the sizes inconsistent
        raise RunError(f"{where}: {e}") from None


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, read from a regular file of at most ``MAX_WEIGHTS_BYTES`` (safetensors'
    ``load_file`` opens any path, and blocked for good on a FIFO, holding the GIL)."""
    try:
        data = read_bounded(path, MAX_WEIGHTS_BYTES)
    except OSError as e:
        raise RunError(f"{path}: {file_problem(e)}") from None
    try:
        return load_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise RunError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from e


def _load_checked(
    build: Callable[[], torch.nn.Module],
    weights: dict[str, Any],
    weights_file: Path,
    description: Path,
    window: Callable[[torch.nn.Module], Any],
) -> tuple[torch.nn.Module, int]:
    """``build()`` with ``weights`` loaded, and the floating-point operations of ``window(model)`` (one live window),
    once a skeleton on the meta device shows that the weights fit it exactly and that the window's work is within
    ``MAX_WINDOW_FLOPS`` (a model the file ``description`` describes; ``RunError`` naming the file otherwise)."""
    try:
        with torch.device("meta"):
            skeleton = build()
    except _BUILD_ERRORS as e:
        raise RunError(f"{weights_file}: the model it belongs to cannot be built ({type(e).__name__}: {e})") from e
    expected = skeleton.state_dict()
    problem = _mismatch(expected, weights)
    if problem is None:
        derived = sum(b.numel() * b.element_size() for n, b in skeleton.named_buffers() if n not in expected)
        if derived > MAX_DERIVED_BYTES:
            problem = f"its model would compute {derived} bytes of buffers (limit {MAX_DERIVED_BYTES})"
    if problem is not None:
        raise RunError(f"{weights_file}: the weights do not fit the model described beside them: {problem}")
    flops = _window_flops(skeleton.eval(), window, description)
    model = build()
    model.load_state_dict(weights)
    return model, flops


def _window_flops(skeleton: torch.nn.Module, window: Callable[[torch.nn.Module], Any], description: Path) -> int:
    """The floating-point operations of ``window(skeleton)``, counted on the meta device (nothing is computed)."""
    counter = FlopCounterMode(display=False)
    try:
        with torch.device("meta"), torch.no_grad(), counter:
            window(skeleton)
    except _RUN_ERRORS as e:
        raise RunError(f"{description}: the model cannot run on its own input ({type(e).__name__}: {e})") from e
    flops = counter.get_total_flops()
    if flops > MAX_WINDOW_FLOPS:
        raise RunError(
            f"{description}: one window through this model takes {flops:.3g} FLOP (floating-point operations), "
            f"at most {MAX_WINDOW_FLOPS:.3g}"
        )
    return flops


def _mismatch(expected: dict[str, torch.Tensor], weights: dict[str, Any]) -> str | None:
    """What keeps ``weights`` from loading into a model with state ``expected`` (names, shapes, kinds), or None."""
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    if missing or unexpected:
        return f"missing {missing[:3]}{'...' * (len(missing) > 3)}, unexpected {unexpected[:3]}{'...' * (len(unexpected) > 3)}"
    for key, want in expected.items():
        got = weights[key]
        if not isinstance(got, torch.Tensor):
            return f"{key} is a {type(got).__name__}, not a tensor"
        if got.shape != want.shape or got.is_floating_point() != want.is_floating_point():
            return f"{key} is {got.dtype} {tuple(got.shape)}, the model needs {want.dtype} {tuple(want.shape)}"
    return None


def load_tokenizer(path: Path | str, device: torch.device | str = "cpu") -> DiscreteVAE:
    """A frozen tokenizer (eval mode) from a tokenizer run directory or an export directory that carries one."""
    path = Path(path)
    if os.path.lexists(path / TOKENIZER_JSON):  # as in load_model
        description = path / TOKENIZER_JSON
        config = _tokenizer_config(_read_versioned(description).get("architecture"), description)
        weights_file = path / TOKENIZER_FILE
        weights = _read_safetensors(weights_file)
    elif os.path.lexists(path / CONFIG_FILE):
        run = RunDir(path)
        info = run.read_config()
        if info.get("stage") != "tokenizer":
            raise RunError(f"{run.path} is a {info.get('stage')!r} run, not a tokenizer run")
        stored = info.get("config")
        description = run.config_path
        config = _tokenizer_config(stored.get("model") if isinstance(stored, dict) else None, description)
        weights_file = run.checkpoint_path
        weights = _checkpoint_model(weights_file)
    else:
        raise RunError(f"{path}: neither a tokenizer run nor an export directory with a tokenizer")
    window = torch.zeros(1, config.in_chans, config.img_size, config.img_size)  # what the live token overlay runs on
    model, _ = _load_checked(
        lambda: DiscreteVAE(config), weights, weights_file, description, lambda m: m.token_ids(window)
    )
    return model.to(device).eval().requires_grad_(False)


def _tokenizer_config(values: Any, where: Path) -> TokenizerConfig:
    """A stored tokenizer architecture, checked as a training config's."""
    if not isinstance(values, dict):
        raise RunError(f"{where}: architecture: expected an object, got {type(values).__name__}")
    try:
        config = from_dict(TokenizerConfig, values, "architecture.")
        check_model_sizes(config, "architecture.")
    except ValueError as e:  # a ConfigError, or a __post_init__ finding the sizes inconsistent
        raise RunError(f"{where}: {e}") from None
    return config


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


def prepare_export_dir(out: Path) -> None:
    """Create the export directory ``out``; ``RunError`` naming it when it cannot be one (see ``rundir.make_dir``)
    or holds a run or a corpus, whose files an export would overwrite (a pretraining run's ``tokenizer.json``)."""
    make_dir(out, "an export")
    for name, what in ((CONFIG_FILE, "a run"), (CORPUS_MANIFEST, "a corpus")):
        if (out / name).exists():
            raise RunError(f"{out}: holds {what} ({name}), not an export: export into a folder of its own")


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
