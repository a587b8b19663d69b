"""``mem export --format onnx``: a trained model as one self-contained ONNX file that onnxruntime serves without torch
(``mem_core.runs.onnx_model`` describes the files, ``mem_core.onnx_inference`` serves them).

The graph comes from torch's exporter (``torch.onnx.export(dynamo=True)``, the ``torch.export`` path): standard
operators only (the relative position bias is a constant table read by GatherND), a dynamic batch, input ``input``,
output ``logits`` (``tokens`` for the tokenizer's encoder), as timm's and Ultralytics' exporters name and shape theirs.
Opset 18: the exporter's own opset (a lower one goes through onnx's version converter), with LayerNormalization as one
operator (opset 17+) and the resize antialias flag (18); onnxruntime loads it from 1.14 on. The legacy TorchScript
exporter cannot give a segmenter a dynamic batch (its adaptive pooling needs static sizes), hence the dynamo one.

Before the files are written, the ONNX model is checked against torch on real windows, each through the whole live
path: torch's input pipeline and model against ``representation.numpy_input`` and onnxruntime. The largest logit
difference is reported; above ``MAX_LOGIT_DIFFERENCE`` the export is refused.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mem_core.configuration import from_dict
from mem_core.errors import MemError
from mem_core.events import SensorSize, center_window, make_events
from mem_core.files import file_problem
from mem_core.io import EventFileError, read_events
from mem_core.models import DiscreteVAE
from mem_core.representation import InputSpec, histograms_to_input, input_histogram
from mem_core.representation.numpy_input import count_histogram, resize, window_input
from mem_core.runs.export.load import load_model, load_tokenizer
from mem_core.runs.export.meta import EXPORT_VERSION
from mem_core.runs.export.write import prepare_export_dir
from mem_core.runs.lineage import MODEL_JSON, read_json, source_run, tokenizer_of
from mem_core.runs.onnx_model import (
    INPUT,
    LOGITS,
    ONNX_FORMAT_VERSION,
    ONNX_MODEL_FILE,
    ONNX_TOKENIZER_FILE,
    TOKENS,
    metadata_props,
    open_model,
    open_tokenizer,
)
from mem_core.runs.rundir import CONFIG_FILE, RunError, atomic_write_bytes, json_safe

OPSET = 18
MAX_LOGIT_DIFFERENCE = 1e-4  # onnxruntime against torch on the same windows: float32 rounding is ~1e-6
CHECK_WINDOWS = 8


@dataclass
class OnnxExport:
    """What ``export_onnx`` wrote and how its model compares with torch's."""

    out: Path
    difference: float  # the largest |logit| difference, onnxruntime against torch
    windows: int  # windows compared
    checked_on: str  # where they came from
    tokens_equal: float | None  # the share of token ids both tokenizers agree on (None: no tokenizer)


def export_onnx(
    model_path: Path | str,
    out: Path | str,
    *,
    check_data: Path | str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> OnnxExport:
    """Export the model of a finetune / segment run or of a safetensors export (``model_path``), and its tokenizer,
    as ONNX into ``out``: ``model.onnx``, ``model.json`` and, with a tokenizer, ``tokenizer.onnx``.

    ``check_data``: an event file or a folder of them to check on; default: the validation split of the data the
    model was trained on, where it is at hand. ``progress`` is told each step. ``RunError`` naming the file when the
    ONNX model differs from torch's by more than ``MAX_LOGIT_DIFFERENCE``.
    """
    model_path, out = Path(model_path), Path(out)
    prepare_export_dir(out, "onnx")
    model, meta = load_model(model_path)
    spec = from_dict(InputSpec, meta["input"])
    tokenizer_run = tokenizer_of(model_path)
    tokenizer = load_tokenizer(tokenizer_run) if tokenizer_run is not None else None
    source = source_run(model_path) or model_path.resolve()
    described = {
        "task": meta["task"],
        "classes": meta["classes"],
        "input": meta["input"],
        "training_window": meta["training_window"],
        "source_run": str(source),
        "window_flops": meta["window_flops"],
    }
    progress(f"exporting {model_path} with torch.onnx (opset {OPSET})")
    model_bytes = _to_onnx(
        model, spec.in_chans, spec.size, LOGITS, {"format_version": ONNX_FORMAT_VERSION, **described}
    )
    tokenizer_bytes = None
    if tokenizer is not None:
        config = tokenizer.config
        tokenizer_meta = {
            "format_version": ONNX_FORMAT_VERSION,
            "num_tokens": config.num_tokens,
            "img_size": config.img_size,
            "in_chans": config.in_chans,
        }
        size = (config.img_size, config.img_size)
        tokenizer_bytes = _to_onnx(_TokenIds(tokenizer), config.in_chans, size, TOKENS, tokenizer_meta)
    windows, checked_on = check_windows(described, check_data, spec)
    progress(f"checking onnxruntime against torch on {len(windows)} windows of {checked_on}")
    staged = out / ".onnx-check"  # the files are checked where the server would read them, then moved in place
    staged.mkdir(exist_ok=True)
    try:
        atomic_write_bytes(staged / ONNX_MODEL_FILE, model_bytes)
        if tokenizer_bytes is not None:
            atomic_write_bytes(staged / ONNX_TOKENIZER_FILE, tokenizer_bytes)
        difference, tokens_equal = _compare(model, tokenizer, staged, spec, windows)
        if difference > MAX_LOGIT_DIFFERENCE:
            raise RunError(
                f"{out / ONNX_MODEL_FILE}: onnxruntime's logits differ from torch's by {difference:.3g} on "
                f"{checked_on} (at most {MAX_LOGIT_DIFFERENCE:g}): not written"
            )
        for name in (ONNX_MODEL_FILE, ONNX_TOKENIZER_FILE):
            if (staged / name).exists():
                (staged / name).replace(out / name)
            elif name == ONNX_TOKENIZER_FILE:
                (out / name).unlink(missing_ok=True)
    finally:
        for leftover in staged.iterdir():
            leftover.unlink()
        staged.rmdir()
    description = {
        "format_version": EXPORT_VERSION,
        "format": "onnx",
        "onnx_format_version": ONNX_FORMAT_VERSION,
        "opset": OPSET,
        "arch": meta["arch"],
        "architecture": meta["architecture"],
        "head_channels": meta["head_channels"],
        **described,
        "files": {"model": ONNX_MODEL_FILE, "tokenizer": ONNX_TOKENIZER_FILE if tokenizer is not None else None},
        "check": {"windows": len(windows), "data": checked_on, "max_logit_difference": difference},
    }
    atomic_write_bytes(out / MODEL_JSON, (json.dumps(json_safe(description), indent=2) + "\n").encode())
    return OnnxExport(out, difference, len(windows), checked_on, tokens_equal)


class _TokenIds(torch.nn.Module):
    """The tokenizer's encoder and its argmax: (B, C, S, S) -> (B, h, w) int64 token ids (``DiscreteVAE.token_ids``)."""

    def __init__(self, tokenizer: DiscreteVAE) -> None:
        super().__init__()
        self.encoder = tokenizer.encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).argmax(dim=1)


def _to_onnx(
    module: torch.nn.Module, channels: int, size: tuple[int, int], output: str, metadata: dict[str, Any]
) -> bytes:
    """``module`` (eval mode) as the bytes of an ONNX file: input ``input`` (batch, channels, *size), ``output``, a
    dynamic batch, opset ``OPSET``, ``metadata`` in its ``metadata_props``."""
    example = torch.zeros(2, channels, *size)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with warnings.catch_warnings():
        # torch.export traces timm's input-size assertions as guards on the static sizes: nothing to act on
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
        program = torch.onnx.export(
            module.eval(),
            (example,),
            input_names=[INPUT],
            output_names=[output],
            opset_version=OPSET,
            dynamo=True,
            dynamic_shapes=({0: batch},),
            external_data=False,
            verbose=False,
        )
    proto = program.model_proto
    proto.producer_name, proto.doc_string = "mem", f"MEM {metadata.get('task', 'tokenizer')} ({output})"
    del proto.metadata_props[:]
    for key, value in metadata_props(metadata).items():
        proto.metadata_props.add(key=key, value=value)
    return proto.SerializeToString()


def check_windows(meta: dict[str, Any], check_data: Path | str | None, spec: InputSpec) -> tuple[list, str]:
    """Up to ``CHECK_WINDOWS`` (events, sensor) windows of ``spec.n_max`` events to compare the runtimes on, and
    what they are: from ``check_data``, else the validation split of the data the model was trained on, else (the data
    is not at hand) random events."""
    if check_data is not None:
        return _file_windows(Path(check_data), spec.n_max), str(check_data)
    trained_on = _training_data(meta.get("source_run"))
    if trained_on is not None:
        from mem_core.datasets import open_source  # lazy: the datasets and their readers are only needed here

        dataset, root = trained_on
        try:
            samples = open_source(dataset, root, "val")
            picks = np.unique(np.linspace(0, len(samples) - 1, CHECK_WINDOWS).round().astype(int))
            windows = [(samples.load_window(int(i), spec.n_max, None), samples.sensor) for i in picks]
            return windows, f"{dataset} val ({root})"
        except (MemError, OSError, ValueError):
            pass  # the data moved or changed since training: random windows below
    rng = np.random.default_rng(0)
    sensor = SensorSize(128, 128)
    n = spec.n_max
    windows = [
        (make_events(np.sort(rng.integers(0, 10 * n, n)), *rng.integers(0, 128, (2, n)), rng.integers(0, 2, n)), sensor)
        for _ in range(CHECK_WINDOWS)
    ]
    return windows, "random events (the training data is not at hand: --check-data names real ones)"


def _training_data(run: Any) -> tuple[str, str | None] | None:
    """(dataset, root) the run ``run`` trained on, from its ``config.json``; None when that cannot be read."""
    if not isinstance(run, str):
        return None
    try:
        data = read_json(Path(run) / CONFIG_FILE).get("config", {}).get("data", {})
    except RunError:
        return None
    dataset = data.get("dataset") if isinstance(data, dict) else None
    return (dataset, data.get("path")) if isinstance(dataset, str) else None


def _file_windows(path: Path, n_max: int) -> list[tuple[np.ndarray, SensorSize]]:
    """The centred ``n_max``-event windows of the first ``CHECK_WINDOWS`` event files at ``path`` (a file or a
    folder, searched in name order); ``RunError`` naming it when it holds none."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    windows = []
    for file in files:
        try:
            events, sensor = read_events(file)
        except EventFileError:
            continue
        except OSError as e:
            raise RunError(f"{file}: {file_problem(e)}") from None
        if len(events):
            windows.append((center_window(events, n_max), sensor))
        if len(windows) == CHECK_WINDOWS:
            break
    if not windows:
        raise RunError(f"{path}: no event file to check the ONNX model on (--check-data)")
    return windows


def _compare(
    model: torch.nn.Module, tokenizer: DiscreteVAE | None, folder: Path, spec: InputSpec, windows: list
) -> tuple[float, float | None]:
    """The largest |logit| difference between torch (its input pipeline and model) and the live ONNX path (numpy and
    onnxruntime) over ``windows``, run as one batch each; and the share of equal token ids."""
    torch_x = torch.cat(
        [
            histograms_to_input(
                torch.from_numpy(input_histogram(e, s, spec.channels, spec.temporal_bins))[None], spec, train=False
            )
            for e, s in windows
        ]
    )
    onnx_x = np.stack(
        [window_input(count_histogram(e, s, spec.channels, spec.temporal_bins), spec)[0] for e, s in windows]
    )
    session, _ = open_model(folder / ONNX_MODEL_FILE, threads=1)
    with torch.inference_mode():
        expected = model(torch_x).float().numpy()
    got = session.session.run([LOGITS], {INPUT: onnx_x})[0]
    difference = float(np.abs(got - expected).max())
    if tokenizer is None:
        return difference, None
    size = tokenizer.config.img_size
    encoder = open_tokenizer(folder / ONNX_TOKENIZER_FILE, spec, threads=1)
    with torch.inference_mode():
        tok_x = (
            torch_x
            if torch_x.shape[-2:] == (size, size)
            else torch.nn.functional.interpolate(torch_x, size=(size, size), mode="bilinear")
        )
        expected_ids = tokenizer.token_ids(tok_x).numpy()
    onnx_tok = (
        onnx_x
        if onnx_x.shape[-2:] == (size, size)
        else np.stack([resize(x, (size, size), antialias=False) for x in onnx_x])
    )
    ids = encoder.session.run([TOKENS], {INPUT: onnx_tok})[0]
    return difference, float((ids == expected_ids).mean())
