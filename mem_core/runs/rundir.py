"""A run directory: resolved config, metrics.jsonl, atomic checkpoints and PNG plots.

Layout::

    RUN/config.json        the resolved config (plain dict) and the stage name
    RUN/metrics.jsonl      one JSON object per epoch (and one per evaluation)
    RUN/checkpoint.pt      the latest state (model, optimizer, scheduler, EMA, epoch) - plain tensors and dicts
    RUN/best.pt            the best model on the validation split (finetuning, segmentation)
    RUN/result.json        written last: the final validation metrics (its presence means the run is finished)
    RUN/*.png              loss / accuracy curves and stage-specific pictures
    RUN/.run.lock          held (``flock``) by the process writing the run: a second one is refused
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from mem_core.configuration import RENAMED_KEYS
from mem_core.errors import RunError
from mem_core.files import file_problem, open_bounded, read_bounded, temp_beside
from mem_core.limits import MAX_CHECKPOINT_BYTES, MAX_JSON_BYTES, MAX_METRICS_BYTES, is_int

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
BEST_FILE = "best.pt"
RESULT_FILE = "result.json"
RUN_LOCK = ".run.lock"
CORPUS_MANIFEST, EXPORT_JSON = "manifest.json", "model.json"  # what a corpus and an export hold: never a run's


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
        except RuntimeError as e:
            stopped_by = writes.error or (e.__context__ if isinstance(e.__context__, KeyboardInterrupt) else None)
            if stopped_by is None:
                raise
            raise stopped_by from None

    _atomic_write(Path(path), save)


class _Writes:
    """The file ``torch.save`` writes to, keeping what stopped a write - the ``OSError`` of a full disk, the
    ``KeyboardInterrupt`` of a Ctrl-C: torch's zip writer closes the archive on its way out, fails on the short
    file, and reports ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos`` instead."""

    def __init__(self, file) -> None:
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except (OSError, KeyboardInterrupt) as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def _atomic_write(path: Path, write: Callable[[Any], object]) -> None:
    """``write(file)`` into a temporary file beside ``path``, fsync, then rename it over ``path``."""
    tmp = None
    try:
        fd, tmp = temp_beside(path)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise RunError(f"{path}: cannot write ({e.strerror or e}); the file written before is kept") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no pickled objects) from a regular file of at most
    ``MAX_CHECKPOINT_BYTES``, with a clear error for a bad file."""
    path = Path(path)
    try:
        f = open_bounded(path, MAX_CHECKPOINT_BYTES)
    except FileNotFoundError:
        raise RunError(f"{path}: checkpoint not found") from None
    except OSError as e:
        raise RunError(f"{path}: {file_problem(e)}") from None
    try:
        with f:  # torch reads the open file: what was checked is what is read
            state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or foreign files
        raise RunError(f"{path}: not a readable MEM checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict):
        raise RunError(f"{path}: not a MEM checkpoint (holds a {type(state).__name__}, not a dict)")
    return state


def make_dir(path: Path, what: str) -> None:
    """Create the output directory ``path`` (and its parents) for ``what`` (``"a run"``, ``"an export"``); a
    ``RunError`` in one line naming it when it cannot be one: an existing file, a path too long, not writable."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        writable = os.access(path, os.W_OK | os.X_OK)
    except FileExistsError:
        raise RunError(f"{path}: exists and is not a directory, so it cannot hold {what}") from None
    except OSError as e:
        raise RunError(f"{path}: cannot hold {what} ({e.strerror or e})") from None
    if not writable:
        raise RunError(f"{path}: cannot hold {what} (not writable)")


_held: dict[Path, int] = {}  # the run directories this process writes: the descriptor holding each one's lock


def hold_run_dir(path: Path | str) -> None:
    """Lock the existing run directory ``path`` for this process (an ``flock`` on its ``.run.lock``, released by the
    kernel when the process dies), as a corpus is locked by its writer: two runs writing one directory mixed their
    configs, results and metrics. ``RunError`` in one line while another process holds it; a no-op when this process
    does (a run resumed in the same process)."""
    key = Path(path).resolve()
    if key in _held:
        return
    try:
        fd = os.open(key / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise RunError(f"{path}: cannot hold a run ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        by = f" (process {holder})" if holder.isdigit() else ""
        raise RunError(
            f"{path}: another run is writing this directory{by}: wait for it to end, or give this run another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd


def release_run_dir(path: Path | str) -> None:
    """Let go of the lock ``hold_run_dir`` took on ``path`` (a no-op when this process holds none)."""
    fd = _held.pop(Path(path).resolve(), None)
    if fd is not None:
        os.close(fd)


def _held_elsewhere(path: Path) -> bool:
    """Whether another process holds the run directory ``path`` (checked by taking its lock for a moment)."""
    if path.resolve() in _held:
        return False
    try:
        fd = os.open(path / RUN_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: no run ever held it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def discarded_if_it_fails_unstarted(path: Path | str) -> Iterator[None]:
    """Remove the run directory ``path``, and the parents made for it, when the block fails before the run's first
    checkpoint and none of them existed before: such a folder holds a config and perhaps a few metrics, nothing
    ``--resume`` could continue, and a half-made run is all it would leave. A folder the user had, a run that
    checkpointed and a directory another process's run holds are never removed. Only the main process (``RANK`` 0)
    removes it: under torchrun it made it. The run directory's lock (``hold_run_dir``) is let go at the end."""
    made = None  # the outermost folder of ``path`` that does not exist yet: what mkdir(parents=True) makes
    for folder in (Path(path), *Path(path).parents):
        if os.path.lexists(folder):
            break
        made = folder
    try:
        yield
    except BaseException:
        run = RunDir(path)
        started = any(p.exists() for p in (run.checkpoint_path, run.best_path, run.path / RESULT_FILE))
        remove = made is not None and not started and os.environ.get("RANK", "0") == "0"
        if remove and not _held_elsewhere(run.path):
            release_run_dir(path)
            shutil.rmtree(made, ignore_errors=True)
        raise
    finally:
        release_run_dir(path)


# Settings a resumed run may take other than it started with: where and how fast it runs, not what it learns (bf16
# steps on a CPU are the CPU's speed, as the device is; a run moved to a CPU without native bf16 goes on in fp32).
RESUME_MAY_CHANGE = (
    "device",
    "compile",
    "cpu_bf16",
    "time_limit_s",
    "checkpoint_every_s",
    "data.num_workers",
    "data.preload_mib",
    "data.verify",
    "data.skip_bad",
)


def _check_same_config(
    where: Path, stored: Any, config: dict[str, Any], defaults: dict[str, Any] | None = None
) -> None:
    """``RunError`` naming ``where`` unless the ``stored`` config of a run equals ``config`` (a resumed run's),
    ``RESUME_MAY_CHANGE`` aside: a checkpoint continues only the training it was saved from. A setting the stored
    config lacks (a run started before the setting existed) counts as its value in ``defaults``."""
    if not isinstance(stored, dict):
        raise RunError(f"{where}: corrupt (no 'config' object)")
    new = json.loads(json.dumps(json_safe(config)))  # as it would be stored: lists for tuples, None for NaN
    if defaults is not None:
        stored = _filled(stored, json.loads(json.dumps(json_safe(defaults))))
    differ = [key for key in setting_differences(stored, new) if key not in RESUME_MAY_CHANGE]
    if differ:
        shown = ", ".join(f"{k} ({_at(stored, k)!r} -> {_at(new, k)!r})" for k in differ[:4])
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise RunError(
            f"{where.parent}: --resume continues the run as it was started, and its {where.name} differs in "
            f"{shown}{more}: resume with its settings, or start a new --out"
        )


def setting_differences(
    a: dict[str, Any], b: dict[str, Any], defaults: dict[str, Any] | None = None
) -> dict[str, tuple[Any, Any]]:
    """``{dotted setting: (a's value, b's value)}`` where two stored configs (``config`` objects of ``config.json``)
    differ: with ``defaults``, a setting one of them lacks (a run started before it existed) counts as its default; a
    data path written relative in one and absolute in the other that names the same place is the same setting."""
    if defaults is not None:
        filler = json.loads(json.dumps(json_safe(defaults)))
        a, b = _filled(a, filler), _filled(b, filler)
    values = {key: (setting_at(a, key), setting_at(b, key)) for key in _differences(a, b)}
    return {key: v for key, v in values.items() if not (key in PATH_KEYS and _same_place(*v))}


def _renamed(stored: dict[str, Any]) -> dict[str, Any]:
    """A run's config file as it would be written now: its settings under their present names
    (``configuration.RENAMED_KEYS``)."""
    config = stored.get("config")
    if not isinstance(config, dict):
        return stored
    config = dict(config)
    for old, new in RENAMED_KEYS.items():
        (table, old_name), (_, new_name) = old.split("."), new.split(".")
        section = config.get(table)
        if isinstance(section, dict) and old_name in section and new_name not in section:
            config[table] = {(new_name if k == old_name else k): v for k, v in section.items()}
    return {**stored, "config": config}


def _filled(stored: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``stored`` with the keys it lacks taken from ``defaults``, table by table."""
    out = dict(stored)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = _filled(out[key], value)
    return out


PATH_KEYS = ("data.path", "data.split_file")  # the same folder written relative or absolute is the same setting


def _same_place(a: Any, b: Any) -> bool:
    """Whether two stored paths name the same existing place from here (``../data`` and ``/work/data``)."""
    if not (isinstance(a, str) and isinstance(b, str) and a and b):
        return False
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys where the (nested) JSON objects ``a`` and ``b`` differ."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix.rstrip(".") or "config"]
    return [d for key in sorted(a.keys() | b.keys()) for d in _differences(a.get(key), b.get(key), f"{prefix}{key}.")]


def setting_at(config: dict[str, Any], key: str) -> Any:
    """The value of the dotted setting ``key`` in a stored config (``None`` where it has none)."""
    value: Any = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _at(config: dict[str, Any], key: str) -> Any:
    """The value at ``key`` as an error message shows it (at most 60 characters)."""
    value = setting_at(config, key)
    return value if len(repr(value)) <= 60 else f"{repr(value)[:57]}..."


def load_state(target: Any, state: Any, path: Path, what: str) -> None:
    """``target.load_state_dict(state)`` (a model, an optimizer, a schedule, an EMA), with a ``RunError`` naming the
    checkpoint ``path`` when ``state`` does not fit ``what`` (a checkpoint of another model, or edited)."""
    try:
        target.load_state_dict(state)
    except (KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError) as e:
        reason = " ".join(str(e).split())  # torch's message spans lines
        raise RunError(
            f"{path}: does not hold this run's {what} ({type(e).__name__}: "
            f"{reason[:300]}{'...' if len(reason) > 300 else ''})"
        ) from None


class RunDir:
    """One stage's output directory."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.config_path = self.path / CONFIG_FILE
        self.metrics_path = self.path / METRICS_FILE
        self.checkpoint_path = self.path / CHECKPOINT_FILE
        self.best_path = self.path / BEST_FILE

    @classmethod
    def create(
        cls,
        path: Path | str,
        stage: str,
        config: dict[str, Any],
        *,
        resume: bool,
        defaults: dict[str, Any] | None = None,
    ) -> RunDir:
        """Start a run; with ``resume`` the directory must hold the same stage's run started with the same
        ``config`` (but ``RESUME_MAY_CHANGE``; settings its stored config lacks count as their ``defaults``), else
        it must hold no trained run.

        ``RunError`` in one line naming the directory when it cannot be a run directory (an existing file, a path
        too long or not writable, a corpus or an export) or holds another run, before anything is written.
        """
        run = cls(path)
        make_dir(run.path, "a run")
        hold_run_dir(run.path)
        for name, what in ((CORPUS_MANIFEST, "a corpus"), (EXPORT_JSON, "an export")):
            if (run.path / name).exists() and not run.config_path.exists():
                raise RunError(f"{run.path}: holds {what} ({name}), not a run: give the run a folder of its own")
        held = os.path.lexists(run.config_path)
        if held:
            existing = run.read_config()
            if not isinstance(existing.get("stage"), str):
                raise RunError(f"{run.config_path}: not a MEM run's config (no stage); give the run another --out")
            trained = any(p.exists() for p in (run.checkpoint_path, run.best_path, run.path / RESULT_FILE))
            if not resume and trained:
                raise RunError(f"{run.path} already holds a {existing['stage']} run; use --resume or a new --out")
            if existing["stage"] != stage:
                raise RunError(f"{run.path} holds a {existing['stage']!r} run, not {stage!r}")
            if resume:
                _check_same_config(run.config_path, existing.get("config"), config, defaults)
        if not resume or not held:
            run.write_json(CONFIG_FILE, {"stage": stage, "config": config})
            run.metrics_path.unlink(missing_ok=True)
        run.remove_partial_writes()
        return run

    def remove_partial_writes(self) -> None:
        """Remove what atomic writes killed midway left (``.<file>.<random>.tmp``): no process but this one writes
        the run, whose lock it holds."""
        for tmp in self.path.glob(".*.tmp"):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)

    @property
    def finished(self) -> bool:
        """Whether the run trained to its end: every stage writes ``result.json`` last."""
        return (self.path / RESULT_FILE).is_file()

    def read_config(self) -> dict[str, Any]:
        try:
            data = read_bounded(self.config_path, MAX_JSON_BYTES)
        except FileNotFoundError:
            raise RunError(f"{self.path}: not a MEM run directory (no {CONFIG_FILE})") from None
        except OSError as e:
            raise RunError(f"{self.config_path}: {file_problem(e)}") from None
        try:
            config = json.loads(data)
        except (ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8
            raise RunError(f"{self.config_path}: corrupt ({exc})") from None
        if not isinstance(config, dict):
            raise RunError(f"{self.config_path}: corrupt (a JSON {type(config).__name__}, not an object)")
        return _renamed(config)

    def note_in_config(self, key: str, value: Any) -> None:
        """Keep ``value`` under ``key`` in the run's config file, beside its stage and config (what the run's data
        was, which a config's paths alone do not say)."""
        self.write_json(CONFIG_FILE, {**self.read_config(), key: value})

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
        try:
            data = read_bounded(self.metrics_path, MAX_METRICS_BYTES)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise RunError(f"{self.metrics_path}: {file_problem(e)}") from None
        records = []
        try:
            for n, line in enumerate(data.decode().split("\n")[:-1], 1):
                if line.strip():
                    records.append(record := json.loads(line))
                    # an epoch is a number, compared when a resumed run drops the records after its checkpoint
                    if not isinstance(record, dict) or not is_int(record.get("epoch", 0)):
                        raise ValueError(f"line {n} is no record of an epoch")
        except (ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8
            raise RunError(f"{self.metrics_path}: corrupt ({e})") from None
        return records

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
