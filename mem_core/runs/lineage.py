"""Which runs a model came from, read from the small JSON files runs and exports leave behind.

A finetuning run names the pretraining run it started from in ``init.json``; a pretraining run names its tokenizer
run in ``tokenizer.json``; an export names the run it was made from in ``model.json`` (``source_run``). Following
those links needs no weights, so this module imports no torch: ``mem serve`` asks it which pretraining run a
served model came from (to finetune on labelled windows) before any model is loaded.

A link file that is missing means "none" (a model trained from scratch, an export that carries its own
tokenizer); one that is there but unreadable or malformed is a ``RunError`` naming it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mem_core.errors import RunError
from mem_core.files import file_problem, read_bounded
from mem_core.limits import MAX_JSON_BYTES

INIT_LINK = "init.json"  # in a finetuning run: {"path": the pretraining run it was initialised from}
TOKENIZER_LINK = "tokenizer.json"  # in a pretraining run: {"path": its tokenizer run}; in an export: the tokenizer
MODEL_JSON = "model.json"  # in an export: its description, with "source_run"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a regular file of at most ``MAX_JSON_BYTES`` (``RunError`` naming the file otherwise)."""
    try:
        data = read_bounded(path, MAX_JSON_BYTES)
    except OSError as e:
        raise RunError(f"{path}: {file_problem(e)}") from None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RunError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise RunError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _named_run(path: Path, key: str, *, required: bool) -> Path | None:
    """The run ``path`` (a JSON object) names under ``key``; None when it names none and none is required."""
    target = read_json(path).get(key)
    if target is None and not required:
        return None
    if not isinstance(target, str) or not target:
        raise RunError(f"{path}: no {key!r} naming a run")
    return Path(target)


def _link(path: Path) -> Path | None:
    """The run a link file names; None when there is no such file (one that is not a regular file is refused)."""
    return _named_run(path, "path", required=True) if os.path.lexists(path) else None


def is_export(path: Path | str) -> bool:
    return os.path.lexists(Path(path) / MODEL_JSON)  # one that is no regular file is refused when it is read


def source_run(model: Path | str) -> Path | None:
    """The run an export was made from; None for a run directory or an export that does not say."""
    model = Path(model)
    return _named_run(model / MODEL_JSON, "source_run", required=False) if is_export(model) else None


def pretraining_run_of(model: Path | str) -> Path | None:
    """The pretraining run behind a finetuned model (a run, or an export through its ``source_run``); None when
    it was trained from scratch or its run is not known."""
    model = Path(model)
    run = source_run(model) if is_export(model) else model
    return None if run is None else _link(run / INIT_LINK)


def tokenizer_of(path: Path | str) -> Path | None:
    """Where the tokenizer behind a model lives: an export that carries one (its ``tokenizer.json``), the run a
    pretraining run links in its ``tokenizer.json``, or for a finetuning run (or an export made from one) the
    tokenizer of the pretraining run it started from; None when there is none."""
    path = Path(path)
    if os.path.lexists(path / TOKENIZER_LINK):
        return path if is_export(path) else _link(path / TOKENIZER_LINK)
    pretrain = pretraining_run_of(path)
    return None if pretrain is None else _link(pretrain / TOKENIZER_LINK)
