"""What a described model costs before it is built: a skeleton on PyTorch's meta device (no memory) checked against
the weights file (the same tensors, so the model is no larger than the file, plus at most ``MAX_DERIVED_BYTES`` of
buffers it computes itself) and one window through it counted (at most ``MAX_WINDOW_FLOPS``), computing nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from mem_core.configuration import from_dict
from mem_core.errors import MemError
from mem_core.limits import MAX_DERIVED_BYTES, MAX_WINDOW_FLOPS
from mem_core.representation import InputSpec
from mem_core.runs.export.meta import build_task_model
from mem_core.runs.lineage import MODEL_JSON
from mem_core.runs.rundir import RunError

# what building or running a described model raises when the description is inconsistent (timm asserts input sizes)
BUILD_ERRORS = (MemError, ValueError, TypeError, ZeroDivisionError, OverflowError, RuntimeError, KeyError)
RUN_ERRORS = (*BUILD_ERRORS, AssertionError, IndexError)
_COUNTED: dict[str, int] = {}  # a description (``load_checked``'s ``described``) -> its window's FLOP, counted once
_COUNTED_MAX = 64


def window_flops(meta: dict[str, Any], where: Path = Path(MODEL_JSON)) -> int:
    """The floating-point operations of one live window through the model that ``meta`` (checked by ``check_meta``)
    describes, counted on PyTorch's meta device: nothing is computed or allocated. ``RunError`` naming ``where``
    beyond ``MAX_WINDOW_FLOPS``."""
    with torch.device("meta"):
        skeleton = build_task_model(meta)
    return _window_flops(skeleton.eval(), task_window(meta), where)


def task_window(meta: dict[str, Any]) -> Callable[[torch.nn.Module], Any]:
    """What the live server runs a task model on: one (1, C, H, W) input of the model's ``InputSpec``."""
    spec = from_dict(InputSpec, meta["input"])
    return lambda model: model(torch.zeros(1, spec.in_chans, *spec.size))


def meta_skeleton(build: Callable[[], torch.nn.Module], weights_file: Path) -> torch.nn.Module:
    """``build()`` on PyTorch's meta device (no memory); ``RunError`` naming ``weights_file`` where it cannot be
    built."""
    try:
        with torch.device("meta"):
            return build()
    except BUILD_ERRORS as e:
        raise RunError(f"{weights_file}: the model it belongs to cannot be built ({type(e).__name__}: {e})") from e


def weights_bound(skeleton: torch.nn.Module) -> int:
    """The most bytes a safetensors file of the weights of ``skeleton`` can hold: each tensor of its state at 8 bytes
    an element (the widest dtype), its header entry, and the header's length."""
    state = skeleton.state_dict()
    return 8 + sum(8 * t.numel() + 128 + len(name) + 24 * t.dim() for name, t in state.items()) + (64 << 10)


def load_checked(
    build: Callable[[], torch.nn.Module],
    weights: dict[str, Any],
    weights_file: Path,
    description: Path,
    window: Callable[[torch.nn.Module], Any],
    described: dict[str, Any] | None = None,
    skeleton: torch.nn.Module | None = None,
) -> tuple[torch.nn.Module, int]:
    """``build()`` with ``weights`` loaded, and the floating-point operations of ``window(model)`` (one live window),
    once a skeleton on the meta device shows that the weights fit it exactly and that the window's work is within
    ``MAX_WINDOW_FLOPS`` (a model the file ``description`` describes; ``RunError`` naming the file otherwise).
    ``described``: what determines the model and its window (architecture, input, task); the count of a description
    seen before is reused (a server reloading its model, a scoring of many runs of one architecture). ``skeleton``:
    ``meta_skeleton(build, ...)`` where the caller built it already (to bound the weights file before reading it)."""
    if skeleton is None:
        skeleton = meta_skeleton(build, weights_file)
    expected = skeleton.state_dict()
    problem = _mismatch(expected, weights)
    if problem is None:
        derived = sum(b.numel() * b.element_size() for n, b in skeleton.named_buffers() if n not in expected)
        if derived > MAX_DERIVED_BYTES:
            problem = f"its model would compute {derived} bytes of buffers (limit {MAX_DERIVED_BYTES})"
    if problem is not None:
        raise RunError(f"{weights_file}: the weights do not fit the model described beside them: {problem}")
    key = json.dumps(described, sort_keys=True, default=str) if described is not None else None
    flops = _COUNTED.get(key) if key is not None else None
    if flops is None:
        flops = _window_flops(skeleton.eval(), window, description)
        if key is not None:
            if len(_COUNTED) >= _COUNTED_MAX:
                _COUNTED.pop(next(iter(_COUNTED)))
            _COUNTED[key] = flops
    _within_limit(flops, description)
    model = build()
    model.load_state_dict(weights)
    return model, flops


def _window_flops(skeleton: torch.nn.Module, window: Callable[[torch.nn.Module], Any], description: Path) -> int:
    """The floating-point operations of ``window(skeleton)``, counted on the meta device (nothing is computed)."""
    counter = FlopCounterMode(display=False)
    try:
        with torch.device("meta"), torch.no_grad(), counter:
            window(skeleton)
    except RUN_ERRORS as e:
        raise RunError(f"{description}: the model cannot run on its own input ({type(e).__name__}: {e})") from e
    return _within_limit(counter.get_total_flops(), description)


def _within_limit(flops: int, description: Path) -> int:
    """``flops``, or ``RunError`` naming ``description`` beyond ``MAX_WINDOW_FLOPS``."""
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
