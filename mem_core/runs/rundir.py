"""A run directory: resolved config, metrics.jsonl, atomic checkpoints and PNG plots.

Layout::

    RUN/config.json        the resolved config (plain dict) and the stage name
    RUN/metrics.jsonl      one JSON object per epoch (and one per evaluation)
    RUN/checkpoint.pt      the latest state (model, optimizer, scheduler, EMA, epoch) - plain tensors and dicts
    RUN/best.pt            the best model on the validation split (finetuning, segmentation)
    RUN/result.json        written last: the final validation metrics (its presence means the run is finished)
    RUN/*.png              loss / accuracy curves and stage-specific pictures
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mem_core.errors import RunError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
BEST_FILE = "best.pt"
RESULT_FILE = "result.json"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new file, never half of one; a write
    that fails (a full disk) is a ``RunError`` and leaves the old file."""
    _atomic_write(Path(path), lambda f: f.write(data))


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save(obj, path)`` atomically, as ``atomic_write_bytes``."""

    def save(f) -> None:
        writes = _Writes(f)
        try:
            torch.save(obj, writes)
        except RuntimeError:
            if writes.error is None:
                raise
            raise writes.error from None

    _atomic_write(Path(path), save)


class _Writes:
    """The file ``torch.save`` writes to, keeping the ``OSError`` of a failed write: torch's zip writer reports it as
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``, without the reason."""

    def __init__(self, file) -> None:
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def _atomic_write(path: Path, write: Callable[[Any], object]) -> None:
    """``write(file)`` into a temporary file beside ``path``, fsync, then rename it over ``path``."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise RunError(f"{path}: cannot write ({e.strerror or e}); the file written before is kept") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no pickled objects), with a clear error for a bad file."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or foreign files
        raise RunError(f"{path}: not a readable MEM checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict):
        raise RunError(f"{path}: not a MEM checkpoint (holds a {type(state).__name__}, not a dict)")
    return state


class RunDir:
    """One stage's output directory."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.config_path = self.path / CONFIG_FILE
        self.metrics_path = self.path / METRICS_FILE
        self.checkpoint_path = self.path / CHECKPOINT_FILE
        self.best_path = self.path / BEST_FILE

    @classmethod
    def create(cls, path: Path | str, stage: str, config: dict[str, Any], *, resume: bool) -> RunDir:
        """Start a run; with ``resume`` the directory must hold the same stage's run, else it must not hold one.

        ``RunError`` in one line when ``path`` cannot be a run directory (an existing file, a path too long).
        """
        run = cls(path)
        try:
            run.path.mkdir(parents=True, exist_ok=True)
            held = run.config_path.exists()
        except FileExistsError:
            raise RunError(f"{run.path}: exists and is not a directory, so it cannot hold a run") from None
        except OSError as e:
            raise RunError(f"{run.path}: cannot hold a run ({e.strerror or e})") from None
        if held:
            existing = run.read_config()
            if not resume and run.checkpoint_path.exists():
                raise RunError(f"{run.path} already holds a {existing.get('stage')} run; use --resume or a new --out")
            if existing.get("stage") != stage:
                raise RunError(f"{run.path} holds a {existing.get('stage')!r} run, not {stage!r}")
        if not resume or not held:
            run.write_json(CONFIG_FILE, {"stage": stage, "config": config})
            run.metrics_path.unlink(missing_ok=True)
        return run

    @property
    def finished(self) -> bool:
        """Whether the run trained to its end: every stage writes ``result.json`` last."""
        return (self.path / RESULT_FILE).is_file()

    def read_config(self) -> dict[str, Any]:
        if not self.config_path.is_file():
            raise RunError(f"{self.path}: not a MEM run directory (no {CONFIG_FILE})")
        try:
            config = json.loads(self.config_path.read_text())
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8
            raise RunError(f"{self.config_path}: corrupt ({exc})") from None
        if not isinstance(config, dict):
            raise RunError(f"{self.config_path}: corrupt (a JSON {type(config).__name__}, not an object)")
        return config

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_bytes(self.path / name, (json.dumps(json_safe(obj), indent=2) + "\n").encode())

    def log(self, record: dict[str, Any]) -> None:
        """Append one metrics record (one JSON line; floats that are not finite are written as null). A write that
        fails (a full disk) is a ``RunError`` and leaves the file as it was, without half a line."""
        line = (json.dumps(json_safe(record)) + "\n").encode()
        try:
            fd = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunError(f"{self.metrics_path}: cannot write ({e.strerror or e})") from None
        try:
            size = os.fstat(fd).st_size
            try:
                with memoryview(line) as rest:
                    while rest:
                        rest = rest[os.write(fd, rest) :]
            except OSError as e:
                os.ftruncate(fd, size)
                raise RunError(f"{self.metrics_path}: cannot write ({e.strerror or e}); its records are kept") from None
        finally:
            os.close(fd)

    def metrics(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl``; a last line without its newline (a write cut short) is not one."""
        if not self.metrics_path.is_file():
            return []
        lines = self.metrics_path.read_text().split("\n")[:-1]
        try:
            return [json.loads(line) for line in lines if line.strip()]
        except ValueError as e:
            raise RunError(f"{self.metrics_path}: corrupt ({e})") from None

    def truncate_metrics(self, after_epoch: int) -> None:
        """Drop records of epochs after ``after_epoch`` (a resumed run rewrites them; -1 drops them all)."""
        kept = [m for m in self.metrics() if m.get("epoch", -1) <= after_epoch]
        atomic_write_bytes(self.metrics_path, "".join(json.dumps(m) + "\n" for m in kept).encode())

    def save_checkpoint(self, state: dict[str, Any], best: bool = False) -> None:
        atomic_torch_save(state, self.best_path if best else self.checkpoint_path)


def json_safe(obj: Any) -> Any:
    """Plain JSON values: NaN/inf -> None, tuples -> lists, paths -> str, numpy/torch scalars -> numbers."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
