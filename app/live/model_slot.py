"""The model ``mem serve`` serves: loaded in its own thread while the source streams, swapped for another export
(``--watch``, a Train run) between two windows, and named and versioned for the viewer.

A safetensors export or a run is served by torch (``inference.Predictor``), imported by ``load``, not at start, so the
sensor view streams while the model loads; an ONNX model (``model.onnx``, or a folder holding one) by onnxruntime
(``onnx_inference.OnnxPredictor``), and then torch is never imported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config import ServeConfig
from mem_core.configuration import ConfigError
from mem_core.errors import RunError
from mem_core.limits import MAX_TEXT, fit_path
from mem_core.runs.lineage import source_run
from mem_core.runs.onnx_model import ONNX_MODEL_FILE, ONNX_TOKENIZER_FILE, onnx_model_file

if TYPE_CHECKING:
    from mem_core.inference import Predictor
    from mem_core.onnx_inference import OnnxPredictor

WATCH_INTERVAL_S = 1.0  # how often --watch looks at the model's files
WARM_UP_THREAD = "mem-serve-warm-up"  # a model's first window runs in a thread of this name
MODEL_FILES = ("model.json", "model.safetensors", "best.pt", ONNX_MODEL_FILE, ONNX_TOKENIZER_FILE)


class ModelSlot:
    """The served model and its version; ``load`` serves the first one, ``swap`` and ``watch`` later ones.

    Args:
        config: ``model``, ``tokenizer``, ``device`` and ``eager`` are read (``serving_switches``).
        prepare: called with a loaded model and ``keep_window`` just before it is served (the server adapts its
            window and asks for the held window to be inferred again).
        wake: set once a model is served (the inference loop waits on it).
        predictor: a ``Predictor`` to serve instead of loading ``config.model``.
        torch_threads: torch CPU threads to set before loading; None leaves the process's setting alone. An ONNX
            model runs on this many onnxruntime threads (None: ``config.threads``).
        announce: told when a swapped-in model is served.
        stopping: set when the server stops: a model still warming up is given up.
    """

    def __init__(
        self,
        config: ServeConfig,
        *,
        prepare: Callable[[Predictor | OnnxPredictor, bool], None],
        wake: threading.Event,
        predictor: Predictor | OnnxPredictor | None = None,
        torch_threads: int | None = None,
        announce: Callable[[str], None] | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        if predictor is None and config.model is not None and not Path(config.model).exists():
            raise ConfigError(
                f"model {config.model}: no such file or directory (an export, a finetune / segment run or an ONNX "
                "model)"
            )
        self._config = config
        self._prepare, self._wake = prepare, wake
        self._given = predictor
        self._torch_threads = torch_threads
        self._announce = announce
        self._stopping = stopping if stopping is not None else threading.Event()
        # (predictor, its version): one attribute, so a window never pairs one model's output with another's version
        self._served: tuple[Predictor | OnnxPredictor | None, int] = (None, 0)
        self.loading = predictor is not None or config.model is not None  # a first model is coming
        self.path: Path | None = Path(config.model) if config.model is not None else None
        self.name: str | None = None
        self.error: str | None = None  # why a newer model could not be loaded (the served one stays)
        self._stamp: tuple | None = None  # the served model's files (size, mtime), for --watch
        self.loaded = threading.Event()

    @property
    def served(self) -> tuple[Predictor | OnnxPredictor | None, int]:
        """(the model being served, its version), read together."""
        return self._served

    @property
    def predictor(self) -> Predictor | OnnxPredictor | None:
        """The model being served (None while loading, or without a model)."""
        return self._served[0]

    @property
    def version(self) -> int:
        """Models served so far: 1 for the first, +1 for each swap (0: none yet)."""
        return self._served[1]

    @property
    def onnx(self) -> bool:
        """Whether the served (or coming) model is an ONNX model: a Train run then exports ONNX too."""
        return self.path is not None and onnx_model_file(self.path) is not None

    def load(self) -> None:
        """Load and warm up the first model, and serve it; raises what loading raised."""
        config = self._config
        stamp = model_stamp(self.path)
        predictor = self._given or self._open(self.path, config.tokenizer)
        warm_up(predictor, self.path, self._stopping)
        self._serve(predictor, self.path, stamp)

    def swap(self, path: Path | str, keep_window: bool = False) -> None:
        """Load the model at ``path`` (an export or a run) and serve it from the next window on; raises what loading
        raised and keeps the served model then. Runs in the calling thread (a watcher, a Train run)."""
        path = Path(path)
        stamp = model_stamp(path)
        predictor = self._open(path, None)
        warm_up(predictor, path, self._stopping)
        self._serve(predictor, path, stamp, keep_window)
        if self._announce is not None:
            self._announce(f"mem serve: now serving {path} (model version {self.version})")

    def watch(self, stop: threading.Event) -> None:
        """``--watch``: load the served model's files again when they changed and stayed unchanged for one look
        (an export being written is not read half-way); a model that fails to load is reported, once."""
        while not self.loaded.wait(0.2):
            if stop.is_set():  # the server ended before its first model loaded
                return
        seen = failed = None
        while not stop.wait(WATCH_INTERVAL_S):
            path = self.path
            stamp = model_stamp(path)
            if stamp is None or stamp == self._stamp or stamp == failed:
                seen = stamp
                continue
            if stamp != seen:  # changed since the last look: wait until it settles
                seen = stamp
                continue
            try:
                self.swap(path)
            except Exception as exc:  # a broken export: keep serving the current model
                failed = stamp
                self.error = f"{path}: {type(exc).__name__}: {exc}"[:MAX_TEXT]

    def state(self) -> dict[str, Any] | None:
        """The ``model`` entry of the server's state: name, version and path, and the error of a failed swap."""
        model = None
        if self.version:
            model = {"name": self.name or "model", "version": self.version, "path": fit_path(self.path)}
        if self.error is not None:
            model = {**(model or {"name": "none", "version": 0, "path": ""}), "error": self.error}
        return model

    def _open(self, path: Path, tokenizer: Path | None) -> Predictor | OnnxPredictor:
        """The predictor of the model at ``path``: onnxruntime for an ONNX model, else torch (imported here)."""
        if onnx_model_file(path) is not None:
            from mem_core.onnx_inference import OnnxPredictor

            threads = self._torch_threads if self._torch_threads is not None else self._config.threads
            return OnnxPredictor(path, tokenizer, threads=threads)
        import torch

        from mem_core.inference import Predictor

        if self._torch_threads is not None:
            torch.set_num_threads(self._torch_threads)
        return Predictor(path, tokenizer, self._config.device, **serving_switches(self._config))

    def _serve(
        self, predictor: Predictor | OnnxPredictor, path: Path | None, stamp: tuple | None, keep_window: bool = False
    ) -> None:
        self._prepare(predictor, keep_window)  # before the swap: the loop must not end a file before this model ran
        self.path, self._stamp = path, stamp
        self.name = model_name(path)
        self.error = None
        self._served = (predictor, self.version + 1)
        self.loading = False
        self.loaded.set()
        self._wake.set()


def serving_switches(config: ServeConfig) -> dict[str, bool]:
    """The ``Predictor`` switches of the served model: on a GPU, bf16 weights and a CUDA graph (ViT-B/16 with the
    dVAE on an H200: a window's p95 2.6 ms against 15.7 ms, docs/BENCHMARKS.md), unless ``eager``; on a CPU, none.
    Should the graph fail to record, the windows run without it."""
    import torch

    fast = torch.device(config.device).type == "cuda" and not config.eager
    return {"bf16_weights": fast, "cuda_graph": fast}


def model_stamp(path: Path | None) -> tuple | None:
    """(name, size, mtime) of a model directory's files (of an ONNX file and the tokenizer beside it), to tell a
    newer export; None when it has none."""
    if path is None:
        return None
    folder, names = (path, MODEL_FILES) if path.is_dir() else (path.parent, (path.name, ONNX_TOKENIZER_FILE))
    stamp = []
    for name in names:
        try:
            info = (folder / name).stat()
        except OSError:
            continue
        stamp.append((name, info.st_size, info.st_mtime_ns))
    return tuple(stamp) or None


def model_name(path: Path | None) -> str | None:
    """How the viewer names a model: the run an export came from (``label-003``), else its directory."""
    if path is None:
        return None
    if path.is_file():  # an ONNX file: its folder says where it came from
        path = path.parent
    try:
        source = source_run(path)
    except RunError:  # a model.json that does not say cleanly: the loader reports it, the name falls back
        source = None
    return source.name if source is not None else path.name


def warm_up(predictor: Predictor | OnnxPredictor, path: Path | None, stopping: threading.Event) -> None:
    """Run ``predictor``'s first window, for as long as it takes (a busy machine is slow, not wrong: a model given
    a time box was refused under load), or until ``stopping`` is set: then a ``RunError`` says so, the model is not
    served and its thread is left to finish in the background (``WARM_UP_THREAD``)."""
    done, failed = threading.Event(), []

    def run() -> None:
        try:
            predictor.warm_up()
        except Exception as exc:  # handed to the caller, as if it ran there
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=WARM_UP_THREAD, daemon=True).start()
    while not done.wait(0.1):
        if stopping.is_set():
            raise RunError(f"{path}: the server stopped while the model's first window ran; the model is not served")
    if failed:
        raise failed[0]
