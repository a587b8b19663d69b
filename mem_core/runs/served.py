"""What the live server needs to know of a model in either export format (safetensors + ``model.json``, or
``model.onnx``): its task, classes, input spec and training window, and the check that holds them to what it can
serve. Torch-free: the ONNX live path reads it where torch is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired

from pydantic import StrictInt
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from mem_core.configuration import from_dict
from mem_core.errors import ConfigError, RunError
from mem_core.fields import Range
from mem_core.limits import MAX_EXPORT_WINDOW_EVENTS, MAX_EXPORT_WINDOW_MS
from mem_core.representation.spec import InputSpec
from mem_core.schema import ClassNames, SchemaError, Text, check, class_names_problem

Task = Literal["classification", "segmentation"]


class TrainingWindow(TypedDict):
    """The window a model was trained on: ``events`` (its ``n_max``) and ``ms``, the span every sample had, or None."""

    events: Annotated[StrictInt, Range(1, MAX_EXPORT_WINDOW_EVENTS)]
    ms: Annotated[float, Range(0, MAX_EXPORT_WINDOW_MS, lo_open=True)] | None


class ServedMeta(TypedDict):
    """What serving a model reads: ``input`` is an ``InputSpec``'s dict."""

    task: Task
    classes: ClassNames
    input: dict[str, Any]
    training_window: TrainingWindow
    source_run: NotRequired[Text | None]


def check_served(meta: dict[str, Any], where: Path) -> InputSpec:
    """The input spec of ``meta`` once it fits ``ServedMeta`` with distinct class names and an input a training
    config could have; ``RunError`` naming ``where`` otherwise."""
    try:
        check(ServedMeta, meta)
    except SchemaError as e:
        raise RunError(f"{where}: {e}") from None
    problem = class_names_problem(meta["classes"])
    if problem is not None:
        raise RunError(f"{where}: {problem}")
    try:
        return from_dict(InputSpec, meta["input"], "input.")  # its fields' bounds checked as it is built
    except ConfigError as e:
        raise RunError(f"{where}: {e}") from None
