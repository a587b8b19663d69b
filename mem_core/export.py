"""Model files: load a trained model from a run or an export directory, and export it for the live server.

An export directory holds ``model.safetensors`` + ``model.json`` (format version, task, architecture, classes,
input spec, head width, the window the model was trained on) and, when the model was pretrained with MEM,
``tokenizer.safetensors`` + ``tokenizer.json`` for the live token overlay. Safetensors and JSON only: nothing in an export is executed.

``load_model`` takes an export directory or a finetune / segment run directory (the run's best checkpoint);
``load_tokenizer`` a tokenizer run or an export directory that carries one.

Loading trusts nothing in the files: the JSON is read only up to ``MAX_JSON_BYTES`` and every value is checked,
the architecture is first built on PyTorch's "meta" device (no memory) with at most ``MAX_DEPTH`` blocks, and the
weights file must hold exactly the tensors (names, shapes) of that model, so the model that is then built is no
larger than its weights file, plus the buffers it computes itself (relative position indices), which may take at
most ``MAX_DERIVED_BYTES``. Every failure is a ``RunError`` naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mem_core.configuration import from_dict, to_dict
from mem_core.errors import MemError
from mem_core.lineage import MODEL_JSON, TOKENIZER_LINK, read_json, tokenizer_of
from mem_core.models import DiscreteVAE, MEMViT, SegmentationModel, TokenizerConfig, ViTConfig
from mem_core.representation import InputSpec
from mem_core.train.rundir import RunDir, RunError, atomic_write_bytes, json_safe, load_checkpoint

EXPORT_VERSION = 1
MODEL_FILE, TOKENIZER_FILE = "model.safetensors", "tokenizer.safetensors"
TOKENIZER_JSON = TOKENIZER_LINK  # an export's tokenizer description (in a pretraining run, the link to its tokenizer)
TASKS = {"finetune": "classification", "segment": "segmentation"}  # training stage -> task of its model
# Limits on what a model file may describe (the paper's models are far inside them).
MAX_DEPTH = 256  # transformer blocks, tokenizer layers and residual blocks: bounds the time to build the skeleton
MAX_CLASSES = 100_000
MAX_INPUT_SIDE = 4096  # pixels of the model input (the paper: 224)
MAX_N_MAX = 1 << 24  # events per input window (the paper: 30 000)
MAX_DERIVED_BYTES = 2 << 30  # buffers a model computes itself: ViT-B/16 at 224 px needs 4 MB, at 512 px 100 MB
_BUILD_ERRORS = (MemError, ValueError, TypeError, ZeroDivisionError, OverflowError, RuntimeError, KeyError)
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
        meta = read_json(path / MODEL_JSON)
        if meta.get("format_version") != EXPORT_VERSION:
            raise RunError(f"{path / MODEL_JSON}: unsupported export format {meta.get('format_version')!r}")
        check_meta(meta, path / MODEL_JSON)
        weights_file = path / MODEL_FILE
        weights = _read_safetensors(weights_file)
    elif (path / "config.json").is_file():
        meta, weights_file = _run_model(RunDir(path))
        weights = _checkpoint_model(weights_file)
    else:
        raise RunError(f"{path}: not a MEM run directory (no config.json) nor an export directory (no {MODEL_JSON})")
    meta.setdefault("training_window", {"events": meta["input"].get("n_max", InputSpec.n_max), "ms": None})
    model = _load_checked(lambda: build_task_model(meta), weights, weights_file, _from_legacy_layout)
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
    """Raise ``RunError`` naming ``where`` unless ``meta`` describes a model MEM can build within its limits."""

    def require(ok: bool, problem: str) -> None:
        if not ok:
            raise RunError(f"{where}: {problem}")

    task, classes, head = meta.get("task"), meta.get("classes"), meta.get("head_channels")
    require(task in TASKS.values(), f"task must be classification or segmentation, got {task!r}")
    require(
        isinstance(classes, list) and 1 <= len(classes) <= MAX_CLASSES and all(isinstance(c, str) for c in classes),
        f"classes must be a list of 1..{MAX_CLASSES} names",
    )
    if task == "segmentation":
        require(_is_int(head) and 1 <= head <= 1 << 16, f"head_channels must be an integer in 1..65536, got {head!r}")
    vit = _parse(ViTConfig, meta.get("architecture"), where, "architecture")
    sizes = (vit.img_size, vit.patch_size, vit.embed_dim, vit.num_heads, vit.depth, vit.in_chans)
    require(min(sizes) >= 1, f"architecture sizes must be >= 1, got {sizes}")
    require(vit.depth <= MAX_DEPTH, f"architecture depth {vit.depth} > {MAX_DEPTH}")
    require(vit.img_size <= MAX_INPUT_SIDE, f"architecture img_size {vit.img_size} > {MAX_INPUT_SIDE}")
    spec = _parse(InputSpec, meta.get("input"), where, "input")
    sides = (*spec.size, *(spec.resize_to or ()))
    require(
        max(sides) <= MAX_INPUT_SIDE and spec.n_max <= MAX_N_MAX,
        f"input beyond {MAX_INPUT_SIDE} px or {MAX_N_MAX} events",
    )
    require(spec.temporal_bins <= 64, f"input temporal_bins {spec.temporal_bins} > 64")
    window = meta.get("training_window", {"events": spec.n_max, "ms": None})  # absent in exports before it existed
    events, ms = (window.get("events"), window.get("ms")) if isinstance(window, dict) else (None, None)
    require(
        _is_int(events)
        and 1 <= events <= MAX_N_MAX
        and (ms is None or (isinstance(ms, int | float) and not isinstance(ms, bool) and 0 < ms <= 1e7)),
        f"training_window must be {{'events': 1..{MAX_N_MAX}, 'ms': null or a positive number}}, got {window!r}",
    )


def _parse(cls: type, values: Any, where: Path, what: str) -> Any:
    if not isinstance(values, dict):
        raise RunError(f"{where}: {what} must be an object, got {type(values).__name__}")
    try:
        return from_dict(cls, values, f"{what}.")
    except ZeroDivisionError as e:  # a 0 where the config divides (patch size, heads)
        raise RunError(f"{where}: {what} sizes must be >= 1 ({e})") from e
    except (MemError, ValueError, TypeError, OverflowError) as e:
        raise RunError(f"{where}: {e}") from e


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise RunError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from e


def _load_checked(
    build: Callable[[], torch.nn.Module],
    weights: dict[str, Any],
    weights_file: Path,
    adapt: Callable[[torch.nn.Module, dict[str, Any]], dict[str, Any]] = lambda model, weights: weights,
) -> torch.nn.Module:
    """``build()`` with ``weights`` loaded, once a skeleton on the meta device shows they fit it exactly.

    ``adapt(model, weights)`` may rename the weights (and change the model) for an older layout.
    """
    try:
        with torch.device("meta"):
            skeleton = build()
    except _BUILD_ERRORS as e:
        raise RunError(f"{weights_file}: the model it belongs to cannot be built ({type(e).__name__}: {e})") from e
    adapted = adapt(skeleton, weights)  # may add modules to the skeleton (the legacy token norm)
    expected = skeleton.state_dict()
    problem = _mismatch(expected, adapted)
    if problem is None:
        derived = sum(b.numel() * b.element_size() for n, b in skeleton.named_buffers() if n not in expected)
        if derived > MAX_DERIVED_BYTES:
            problem = f"its model would compute {derived} bytes of buffers (limit {MAX_DERIVED_BYTES})"
    if problem is not None:
        raise RunError(f"{weights_file}: the weights do not fit the model described beside them: {problem}")
    model = build()
    model.load_state_dict(adapt(model, weights))
    return model


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
    if (path / TOKENIZER_JSON).is_file():
        where = path / TOKENIZER_JSON
        config = _tokenizer_config(read_json(where).get("architecture"), where)
        weights_file = path / TOKENIZER_FILE
        weights = _read_safetensors(weights_file)
    elif (path / "config.json").is_file():
        run = RunDir(path)
        info = run.read_config()
        if info.get("stage") != "tokenizer":
            raise RunError(f"{run.path} is a {info.get('stage')!r} run, not a tokenizer run")
        stored = info.get("config")
        config = _tokenizer_config(stored.get("model") if isinstance(stored, dict) else None, run.config_path)
        weights_file = run.checkpoint_path
        weights = _checkpoint_model(weights_file)
    else:
        raise RunError(f"{path}: neither a tokenizer run nor an export directory with a tokenizer")
    model = _load_checked(lambda: DiscreteVAE(config), weights, weights_file)
    return model.to(device).eval().requires_grad_(False)


def _tokenizer_config(values: Any, where: Path) -> TokenizerConfig:
    """A stored tokenizer architecture, checked (runs and exports before November 2026 call ``img_size``
    ``image_size``)."""
    if isinstance(values, dict):
        values = {("img_size" if k == "image_size" else k): v for k, v in values.items()}
    config = _parse(TokenizerConfig, values, where, "architecture")
    counts = (config.num_layers, config.num_resnet_blocks, config.num_tokens, config.codebook_dim, config.hidden_dim)
    if min(*counts, config.in_chans) < 1 or max(config.num_layers, config.num_resnet_blocks) > MAX_DEPTH:
        raise RunError(f"{where}: tokenizer architecture sizes must be >= 1 with at most {MAX_DEPTH} layers")
    if config.img_size > MAX_INPUT_SIDE:
        raise RunError(f"{where}: tokenizer img_size {config.img_size} > {MAX_INPUT_SIDE}")
    return config


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
