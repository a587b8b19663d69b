"""The export format: its version, its files, the schema of a model's description (``ModelMeta``) and the checks
that hold a description to what MEM can build and serve, and the model a description builds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired

import torch
from pydantic import StrictInt
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.configuration import from_dict
from mem_core.errors import ConfigError
from mem_core.fields import WIDTH
from mem_core.models import MEMViT, SegmentationModel, TokenizerConfig, ViTConfig
from mem_core.models.cnn import VIT, Arch, build_cnn
from mem_core.models.sizes import check_model_sizes
from mem_core.representation import InputSpec
from mem_core.runs.lineage import TOKENIZER_LINK, read_json
from mem_core.runs.rundir import RunError
from mem_core.runs.served import TrainingWindow
from mem_core.schema import ClassNames, SchemaError, Text, check, class_names_problem

EXPORT_VERSION = 2
MODEL_FILE, TOKENIZER_FILE = "model.safetensors", "tokenizer.safetensors"
TOKENIZER_JSON = TOKENIZER_LINK  # an export's tokenizer description (in a pretraining run, the link to its tokenizer)
TASKS = {"finetune": "classification", "segment": "segmentation"}  # training stage -> task of its model


class ModelMeta(TypedDict):
    """A model's description (``model.json`` less its ``format_version``); ``architecture`` is a ``ViTConfig`` and
    ``input`` an ``InputSpec``, checked as a training config's; ``arch`` other than "vit" (a classifier only) is the
    timm CNN the model is instead."""

    task: Literal["classification", "segmentation"]
    classes: ClassNames
    arch: NotRequired[Arch]
    architecture: dict[str, Any]
    input: dict[str, Any]
    head_channels: Annotated[StrictInt, WIDTH] | None  # as a segmentation config's
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


def training_window(config: dict[str, Any]) -> dict[str, Any]:
    """The window a training run's samples had: ``events``, the input's ``n_max``, and ``ms``, the time span of the
    dataset's samples where every sample spans the same (``mem_core.datasets.sample_span_us``), else the run's
    ``data.sample_ms`` (labelled captures: the live window they were taken on), else None.

    The live server uses it as its default window, so a model is served on windows like those it learned from.
    """
    from mem_core.datasets import sample_span_us  # lazy: the datasets (and their readers) are only needed here

    data = config.get("data", {})
    span_us = sample_span_us(data.get("dataset"))
    events = config.get("input", {}).get("n_max", InputSpec.n_max)
    ms = data.get("sample_ms") if span_us is None else span_us / 1000
    return {"events": events, "ms": ms}


def read_versioned(path: Path) -> dict[str, Any]:
    """The JSON object of an export file, refused unless it is of ``EXPORT_VERSION``."""
    meta = read_json(path)
    version = meta.get("format_version")
    if version != EXPORT_VERSION:
        raise RunError(
            f"{path}: export format version {version!r}, this MEM reads version {EXPORT_VERSION} "
            "(export the model again with `mem export`)"
        )
    return meta


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
    except ConfigError as e:
        raise RunError(f"{where}: {e}") from None


def tokenizer_config(values: Any, where: Path) -> TokenizerConfig:
    """A stored tokenizer architecture, checked as a training config's."""
    if not isinstance(values, dict):
        raise RunError(f"{where}: architecture: expected an object, got {type(values).__name__}")
    try:
        config = from_dict(TokenizerConfig, values, "architecture.")
        check_model_sizes(config, "architecture.")
    except ConfigError as e:
        raise RunError(f"{where}: {e}") from None
    return config
