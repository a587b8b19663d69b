"""ONNX models: ``mem export --format onnx`` writes them, ``mem serve --model model.onnx`` runs them in onnxruntime,
without torch.

An ONNX export folder holds ``model.onnx`` (input ``input``: (batch, C, H, W) float32; output ``logits``: (batch, K)
for a classifier, (batch, K, H, W) for a segmenter), ``model.json`` (the export's description, ``"format": "onnx"``)
and, for a model pretrained with MEM, ``tokenizer.onnx`` (the tokenizer's encoder: ``input`` at the tokenizer's size
-> ``tokens`` (batch, h, w) int64 ids, for the live token overlay). Each ONNX file carries what serving needs in its
``metadata_props``, one JSON value per key, so that the file alone is a served model.

Opening one checks it as ``load_model`` checks an export: a regular file within ``MAX_WEIGHTS_BYTES``, a graph
onnxruntime loads, MEM's metadata, and a graph whose input and output fit that metadata. Each failure is one
``RunError`` naming the file. Imports onnxruntime only to open a model, and never torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mem_core.errors import RunError
from mem_core.files import file_problem, open_bounded
from mem_core.limits import MAX_CHANNELS, MAX_INPUT_SIDE, MAX_JSON_BYTES, MAX_NUM_TOKENS, MAX_WEIGHTS_BYTES
from mem_core.representation.spec import InputSpec
from mem_core.runs.served import check_served

if TYPE_CHECKING:
    import onnxruntime

ONNX_FORMAT_VERSION = 1
ONNX_MODEL_FILE, ONNX_TOKENIZER_FILE = "model.onnx", "tokenizer.onnx"
TORCH_MODEL_FILE = "model.safetensors"  # a folder holding it is a torch export (mem_core.runs.export)
INPUT, LOGITS, TOKENS = "input", "logits", "tokens"  # the graphs' input and output names
MODEL_KEYS = ("format_version", "task", "classes", "input", "training_window")  # metadata a model must carry
SERVED_KEYS = ("task", "classes", "input", "training_window", "source_run")  # what serving reads (``ServedMeta``)
TOKENIZER_KEYS = ("format_version", "num_tokens", "img_size", "in_chans")
EXPORT_HINT = "export it with `mem export --format onnx`"


@dataclass
class OnnxModel:
    """An opened ONNX file: its onnxruntime session and its metadata (JSON values)."""

    path: Path
    session: onnxruntime.InferenceSession
    meta: dict[str, Any]


def metadata_props(values: dict[str, Any]) -> dict[str, str]:
    """``values`` as an ONNX file's ``metadata_props``: each value JSON-encoded under its key."""
    return {key: json.dumps(value) for key, value in values.items()}


def onnx_model_file(path: Path | str) -> Path | None:
    """The ONNX model that ``mem serve --model PATH`` serves: ``PATH`` when it is a file (or names none), the
    folder's ``model.onnx`` when it holds one and no torch export; None for a torch export or a run."""
    path = Path(path)
    if not path.is_dir():
        return path
    if (path / ONNX_MODEL_FILE).exists() and not (path / TORCH_MODEL_FILE).exists():
        return path / ONNX_MODEL_FILE
    return None


def open_model(path: Path | str, threads: int | None = None) -> tuple[OnnxModel, InputSpec]:
    """The model ``path`` in onnxruntime (``threads``: its intra-op threads, None: onnxruntime's choice) and its
    input spec, once its metadata and graph fit together."""
    model = _open(Path(path), MODEL_KEYS, threads)
    where, meta = model.path, model.meta
    _check_version(meta["format_version"], where)
    spec = check_served({key: meta[key] for key in SERVED_KEYS if key in meta}, where)
    classes = len(meta["classes"])
    _check_io(model, INPUT, [spec.in_chans, *spec.size], f"its metadata's input ({spec.channels}, {spec.size})")
    want = [classes] if meta["task"] == "classification" else [classes, *spec.size]
    _check_io(model, LOGITS, want, f"a {meta['task']} model of {classes} classes on {spec.size}", output=True)
    return model, spec


def open_tokenizer(path: Path | str, spec: InputSpec, threads: int | None = None) -> OnnxModel:
    """The tokenizer encoder ``path`` for a model of input ``spec``, once it takes that input's channels."""
    model = _open(Path(path), TOKENIZER_KEYS, threads)
    meta, where = model.meta, model.path
    _check_version(meta["format_version"], where)
    for key, low, high in (
        ("num_tokens", 2, MAX_NUM_TOKENS),
        ("img_size", 1, MAX_INPUT_SIDE),
        ("in_chans", 1, MAX_CHANNELS),
    ):
        if not isinstance(meta[key], int) or isinstance(meta[key], bool) or not low <= meta[key] <= high:
            raise RunError(f"{where}: metadata {key}: expected an integer in [{low}, {high}], got {meta[key]!r}")
    if meta["in_chans"] != spec.in_chans:
        raise RunError(
            f"{where}: the tokenizer takes {meta['in_chans']} input channels, the model input ({spec.channels}) has "
            f"{spec.in_chans}"
        )
    size = meta["img_size"]
    _check_io(model, INPUT, [spec.in_chans, size, size], f"its metadata's input ({spec.in_chans}, {size}, {size})")
    outputs = {o.name: o for o in model.session.get_outputs()}
    if TOKENS not in outputs or len(outputs[TOKENS].shape) != 3 or outputs[TOKENS].type != "tensor(int64)":
        raise RunError(f"{where}: no output {TOKENS!r} of int64 token ids (batch, h, w): {EXPORT_HINT}")
    return model


def session_options(threads: int | None) -> onnxruntime.SessionOptions:
    """onnxruntime's options for one live window at a time: ``threads`` intra-op threads, one inter-op thread."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


def _open(path: Path, keys: tuple[str, ...], threads: int | None) -> OnnxModel:
    """``path`` as an onnxruntime session with its metadata decoded; ``RunError`` naming it for a file that is
    missing, no regular file, too large, not an ONNX model onnxruntime runs, or without the metadata ``keys``."""
    import onnxruntime

    try:
        open_bounded(path, MAX_WEIGHTS_BYTES).close()  # a FIFO or /dev/zero is refused before onnxruntime opens it
    except OSError as e:
        raise RunError(f"{path}: {file_problem(e)}") from None
    try:
        session = onnxruntime.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    except _runtime_errors() as e:
        reason = str(e).split(" : ")[-1].strip()[:300]
        raise RunError(f"{path}: not an ONNX model onnxruntime can run ({reason})") from None
    props = session.get_modelmeta().custom_metadata_map
    missing = [key for key in keys if key not in props]
    if missing:
        raise RunError(f"{path}: no MEM metadata {', '.join(missing)} in the ONNX file: {EXPORT_HINT}")
    meta = {}
    for key, text in props.items():
        if len(text) > MAX_JSON_BYTES:
            raise RunError(f"{path}: metadata {key}: larger than {MAX_JSON_BYTES} bytes")
        try:
            meta[key] = json.loads(text)
        except ValueError:
            if key in keys:
                raise RunError(f"{path}: metadata {key}: not JSON ({text[:60]!r}): {EXPORT_HINT}") from None
    return OnnxModel(path, session, meta)


def _check_version(version: Any, where: Path) -> None:
    if version != ONNX_FORMAT_VERSION:
        raise RunError(
            f"{where}: MEM ONNX format version {version!r}, this MEM reads version {ONNX_FORMAT_VERSION}: "
            f"{EXPORT_HINT} again"
        )


def _check_io(model: OnnxModel, name: str, shape: list[int], what: str, *, output: bool = False) -> None:
    """Refuse ``model`` unless its graph's input (or output) ``name`` is float32 of (batch, *shape)."""
    ends = model.session.get_outputs() if output else model.session.get_inputs()
    found = {e.name: e for e in ends}
    kind = "output" if output else "input"
    if name not in found:
        raise RunError(f"{model.path}: no {kind} named {name!r} (it has {sorted(found)}): {EXPORT_HINT}")
    end = found[name]
    if end.type != "tensor(float)" or len(end.shape) != len(shape) + 1 or list(end.shape[1:]) != shape:
        got = f"{end.type} {tuple(end.shape)}"
        raise RunError(f"{model.path}: {kind} {name!r} is {got}, which does not fit {what}: (batch, {shape})")


def _runtime_errors() -> tuple[type[Exception], ...]:
    """What onnxruntime raises for a model it cannot load (its exception types derive from Exception directly)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))
