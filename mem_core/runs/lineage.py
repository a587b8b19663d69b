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
from pathlib import Path
from typing import Any

from mem_core.errors import RunError

INIT_LINK = "init.json"  # in a finetuning run: {"path": the pretraining run it was initialised from}
TOKENIZER_LINK = "tokenizer.json"  # in a pretraining run: {"path": its tokenizer run}; in an export: the tokenizer
MODEL_JSON = "model.json"  # in an export: its description, with "source_run"
MAX_JSON_BYTES = 1 << 20  # model.json / tokenizer.json / classes.json / links: a few kB in practice


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object of at most ``MAX_JSON_BYTES`` (``RunError`` naming the file otherwise)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise RunError(f"{path}: cannot read ({e.strerror or e})") from e
    if len(data) > MAX_JSON_BYTES:
        raise RunError(f"{path}: larger than {MAX_JSON_BYTES} bytes, not a MEM model description")
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
    """The run a link file names; None when there is no such file."""
    return _named_run(path, "path", required=True) if path.is_file() else None


def is_export(path: Path | str) -> bool:
    return (Path(path) / MODEL_JSON).is_file()


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
    if (path / TOKENIZER_LINK).is_file():
        return path if is_export(path) else _link(path / TOKENIZER_LINK)
    pretrain = pretraining_run_of(path)
    return None if pretrain is None else _link(pretrain / TOKENIZER_LINK)
