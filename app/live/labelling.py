"""The server side of the label-a-few loop: the windows a viewer may capture, the captures, and Train runs.

A viewer names the window on its screen by its ``frame`` id; ``RecentWindows`` keeps the exact events of the last
windows the server published, so a capture stores what the user saw labelled, not a newer window. ``LabelDesk``
writes captures into a labelled corpus (``recorders.capture.LabelledCaptures``) and runs ``mem train-labels`` on
them in a child process (``TrainingJob``); the server loads the export it produces without a restart.
Nothing here imports torch: training runs in its own process, and the server's loader loads the result.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from mem_core.cores import usable_cores
from mem_core.errors import RunError
from mem_core.events import SensorSize
from mem_core.limits import MAX_TEXT, MIN_FREE_BYTES, fit_path
from mem_core.runs.lineage import MODEL_JSON, read_json

if TYPE_CHECKING:
    from recorders.capture import LabelledCaptures

# The corpus and its writer (h5py, numba: a second and 60 MB) are imported at the first capture or count, not when the
# server starts: a server nobody labels with, on a board, starts without them.

SNAPSHOT = "captures"  # in a Train run: the captures it learns from, as they were when Train was pressed
EXPORT, ONNX_EXPORT = "export", "export-onnx"  # in a Train run: its model (safetensors), and as ONNX when asked
RUN_NAME = re.compile(r"label-(\d{3,})")
RECENT_WINDOWS = 64  # windows a capture may still name (a few seconds of predictions)
RECENT_EVENTS = 4_000_000  # and at most this many events in all (52 MB)
TRAIN_LOG = "train.log"
PROGRESS_POLL_S = 0.5
USEFUL_HELD_OUT = 5  # held-out captures a class below which Train's top-1 is called a rough figure


class LabelError(Exception):
    """A capture or Train request that cannot be carried out (the control reply's error)."""


class HeldWindow(NamedTuple):
    frame: int
    events: np.ndarray
    sensor: SensorSize
    info: dict[str, Any]  # what the capture's metadata records about the window (source, times, prediction)


class RecentWindows:
    """The last published windows by frame id, bounded in count and events (thread-safe)."""

    def __init__(self, max_windows: int = RECENT_WINDOWS, max_events: int = RECENT_EVENTS) -> None:
        self.max_windows, self.max_events = max_windows, max_events
        self._windows: collections.OrderedDict[int, HeldWindow] = collections.OrderedDict()
        self._events = 0
        self._lock = threading.Lock()

    def add(self, window: HeldWindow) -> None:
        with self._lock:
            self._windows[window.frame] = window
            self._events += len(window.events)
            while len(self._windows) > 1 and (len(self._windows) > self.max_windows or self._events > self.max_events):
                _, old = self._windows.popitem(last=False)
                self._events -= len(old.events)

    def update(self, frame: int, **info: Any) -> None:
        """Add to the ``info`` of a held window (the prediction, known after the window was stored)."""
        with self._lock:
            if frame in self._windows:
                self._windows[frame].info.update(info)

    def get(self, frame: int | None = None) -> HeldWindow:
        """The window ``frame`` (default: the newest); ``LabelError`` when it is no longer held."""
        with self._lock:
            if not self._windows:
                raise LabelError("capture: no window yet (the source has not delivered events)")
            if frame is None:
                return next(reversed(self._windows.values()))
            if frame not in self._windows:
                newest = next(reversed(self._windows))
                raise LabelError(
                    f"capture: window {frame} is no longer held (the server keeps its last {len(self._windows)}, "
                    f"up to {newest}); capture again"
                )
            return self._windows[frame]

    def clear(self) -> None:
        with self._lock:
            self._windows.clear()
            self._events = 0


def score_note(top1: float | None, held_out: int | None, n_classes: int | None) -> str:
    """What Train's top-1 is: on how many held-out captures (a class), and a warning below ``USEFUL_HELD_OUT`` a
    class, where one capture moves it by tens of points."""
    score = f"top-1 {top1:.0%}" if top1 is not None else "top-1 ?"
    if not held_out or not n_classes:
        return f"{score} on the held-out captures"
    per_class = held_out / n_classes
    note = f"{score} on {held_out} held-out captures, {per_class:.2g} a class, trained on the others"
    if per_class < USEFUL_HELD_OUT:
        note += (
            f" (a rough figure: below {USEFUL_HELD_OUT} held out a class, one capture moves it by {1 / held_out:.0%})"
        )
    return note


class TrainingJob:
    """One Train run: ``mem train-labels`` in a child process writing the run ``out`` (log in ``out/train.log``),
    followed from its ``metrics.jsonl``; with ``onnx``, then ``mem export --format onnx`` of its model (for a server
    serving ONNX, which never imports torch). ``on_done(export_dir)`` is called from the job's thread on success;
    ``about`` says what it learns from (captures per class) in its messages."""

    def __init__(
        self,
        labels: Path,
        pretrain: Path,
        out: Path,
        epochs: int,
        on_done: Callable[[Path], None],
        about: str = "",
        onnx: bool = False,
    ) -> None:
        self.labels, self.pretrain, self.out, self.epochs = labels, pretrain, out, epochs
        self.onnx = onnx
        self.export = out / (ONNX_EXPORT if onnx else EXPORT)
        self.on_done = on_done
        self.about = about or str(labels)
        self.status = "running"
        self.epoch = 0
        self.val_top1: float | None = None
        self.held_out: int | None = None  # captures the top-1 is measured on
        self.n_classes: int | None = None  # classes the model tells apart
        self.message: str | None = f"training on {self.about}"
        self._process: subprocess.Popen | None = None
        self._cancelled = False
        self._metrics_read = 0  # bytes of metrics.jsonl already followed
        self._thread = threading.Thread(target=self._run, name="mem-serve-train", daemon=True)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "app.cli",
            "train-labels",
            "--labels",
            str(self.labels),
            "--init",
            str(self.pretrain),
            "--out",
            str(self.out),
            "--export",
            str(self.out / EXPORT),
            "--epochs",
            str(self.epochs),
        ]

    def export_command(self) -> list[str]:
        """The ONNX export of the trained model (``onnx``)."""
        model = ["--model", str(self.out / EXPORT), "--out", str(self.export)]
        return [sys.executable, "-m", "app.cli", "export", *model, "--format", "onnx"]

    def start(self) -> TrainingJob:
        self.out.mkdir(parents=True, exist_ok=True)
        self._process = self._launch(self.command(), "wb")
        self._thread.start()
        return self

    def _launch(self, command: list[str], mode: str) -> subprocess.Popen:
        log = (self.out / TRAIN_LOG).open(mode)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "dumb"}
        # one core stays with the live stream (unless the user chose): torch's threads on every core would stall
        # each other whenever the server runs, and the stream would stutter
        env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() - 1)))
        try:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        finally:
            log.close()

    @property
    def running(self) -> bool:
        return self.status in ("running", "exporting")

    def state(self) -> dict[str, Any]:
        return {
            "state": self.status,
            "epoch": self.epoch,
            "epochs": self.epochs,
            "val_top1": self.val_top1,
            "run": fit_path(self.out),
            "message": None if self.message is None else self.message[:MAX_TEXT],
        }

    def cancel(self) -> None:
        self._cancelled = True
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def _run(self) -> None:
        process = self._process
        while process.poll() is None:
            self._follow()
            time.sleep(PROGRESS_POLL_S)
        self._follow()
        if process.returncode != 0:
            self.status = "failed"
            self.message = "cancelled" if self._cancelled else self._error_line(process.returncode)
            return
        self.status = "exporting"
        if self.onnx:
            self.message = f"exporting {self.export}"
            self._process = process = self._launch(self.export_command(), "ab")
            if process.wait() != 0:
                self.status = "failed"
                self.message = "cancelled" if self._cancelled else self._error_line(process.returncode)
                return
        self.message = f"loading {self.export}"
        try:
            self.on_done(self.export)
        except Exception as exc:  # a model that does not load: the job failed, the server keeps serving
            self.status, self.message = "failed", f"the trained model did not load: {exc}"
            return
        self.status = "done"
        self.message = (
            f"{score_note(self.val_top1, self.held_out, self.n_classes)} ({self.about}); now serving {self.export}"
        )

    def _follow(self) -> None:
        """Epoch and newest validation top-1 from the lines the run appended to its metrics since the last look."""
        try:
            with (self.out / "metrics.jsonl").open("rb") as metrics:
                metrics.seek(self._metrics_read)
                chunk = metrics.read()
        except OSError:
            return
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read at the next look
        self._metrics_read += len(whole)
        for line in whole.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            self.epoch = max(self.epoch, int(row.get("epoch", 0)) + 1)  # epochs done (the run counts from 0)
            if row.get("val_top1") is not None:
                self.val_top1 = float(row["val_top1"])
        self.message = f"epoch {self.epoch} of {self.epochs} on {self.about}"
        result = self.out / "result.json"
        if result.is_file():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # (being written)
                outcome = json.loads(result.read_text())
                self.val_top1 = float(outcome["top1"])  # the best epoch: what is exported
                self.held_out = int(outcome["n"])
                self.n_classes = len(outcome["classes"])

    def _error_line(self, code: int) -> str:
        """The child's ``error: ...`` line, else its last line (the whole log is in ``train.log``)."""
        try:
            lines = [line.strip() for line in (self.out / TRAIN_LOG).read_text(errors="replace").splitlines()]
        except OSError:
            lines = []
        lines = [line for line in lines if line]
        errors = [line for line in lines if line.startswith("error:")]
        last = (errors or lines or [f"exit status {code}"])[-1]
        return f"{last} (log: {self.out / TRAIN_LOG})"


def pretraining_run_problem(path: Path) -> str | None:
    """Why Train could not finetune ``path`` (not a pretraining run), or None: told when the server starts, not at
    the first Train."""
    if not path.is_dir():
        return "no such directory (a pretraining run: mem pretrain --out DIR)"
    if not (path / "config.json").is_file():
        return "not a MEM run directory (no config.json)"
    try:
        stage = read_json(path / "config.json").get("stage")
    except RunError as exc:
        return str(exc)
    return None if stage == "pretrain" else f"a {stage!r} run, not a pretraining run (mem pretrain --out DIR)"


def latest_export(train_out: Path, labels: Path) -> Path | None:
    """The export of the newest Train run in ``train_out`` that learned from the labels ``labels`` (its snapshot
    says so), what a restarted server serves; None when there is none."""
    from mem_core.corpus import SNAPSHOT_OF, Corpus, CorpusError

    try:
        runs = [(int(m.group(1)), p) for p in train_out.iterdir() if (m := RUN_NAME.fullmatch(p.name))]
    except OSError:  # no runs yet
        return None
    source = str(labels.resolve())
    for _, run in sorted(runs, reverse=True):
        # the ONNX export where the run made one (its server served ONNX), else the safetensors one
        export = next((run / name for name in (ONNX_EXPORT, EXPORT) if (run / name / MODEL_JSON).is_file()), None)
        if export is None:  # (model.json is written last: an export cut short has none)
            continue
        try:
            provenance = Corpus(run / SNAPSHOT).provenance
        except CorpusError:
            continue
        if provenance and provenance[-1].get(SNAPSHOT_OF) == source:
            return export
    return None


class LabelDesk:
    """Captures into the labelled corpus ``labels`` and Train runs into ``train_out`` for one server.

    ``classes`` are the names offered for labelling (the server's option, else the model's, else those captured).
    The corpus is opened at the first capture, so a server nobody labels with writes nothing.
    """

    def __init__(
        self,
        labels: Path,
        train_out: Path,
        epochs: int,
        classes: tuple[str, ...] = (),
        min_free_bytes: int = MIN_FREE_BYTES,
    ) -> None:
        self.root, self.train_out, self.epochs = Path(labels), Path(train_out), epochs
        self.min_free_bytes = min_free_bytes
        self.classes = list(classes)
        self.windows = RecentWindows()
        self.captures_taken = 0
        self.last: str | None = None
        self.error: str | None = None
        self.job: TrainingJob | None = None
        self.resumed: Path | None = None  # the export of an earlier session's Train run, served since the start
        self._captures: LabelledCaptures | None = None
        self._counts: dict[str, int] | None = None
        self._lock = threading.Lock()

    def _open(self) -> LabelledCaptures:
        from recorders.capture import LabelledCaptures

        if self._captures is None:
            try:
                self._captures = LabelledCaptures(self.root, self.min_free_bytes)
            except Exception as exc:  # a corrupt corpus, no permission: one line for the viewer
                raise LabelError(f"labels {self.root}: {exc}") from None
        return self._captures

    def counts(self) -> dict[str, int]:
        from mem_core.corpus import Corpus, CorpusError

        if self._captures is not None:
            return self._captures.counts()
        if self._counts is None:  # what earlier sessions captured, read once (nothing is opened for writing)
            self._counts = {}
            if (self.root / "manifest.json").is_file():
                try:
                    self._counts = Corpus(self.root).label_counts()
                except CorpusError as exc:
                    self.error = f"labels {self.root}: {exc}"
        return self._counts

    def capture(
        self, label: str, frame: int | None, describe: Callable[[np.ndarray], dict[str, Any]] | None = None
    ) -> str:
        """Store the held window ``frame`` (default: the newest) as a capture of class ``label``; ``describe``
        adds to its metadata from its events (the simulator's ground truth)."""
        from recorders.base import RecorderError

        window = self.windows.get(frame)
        metadata = {"frame": window.frame, **window.info, **(describe(window.events) if describe else {})}
        with self._lock:
            captures = self._open()
            try:
                name = captures.capture(window.events, window.sensor, label, metadata)
            except (RecorderError, OSError) as exc:
                self.error = f"capture: {exc}"
                raise LabelError(self.error) from None
            self.captures_taken += 1
            self.last, self.error = label, None
            return name

    def undo(self) -> str:
        from recorders.base import RecorderError

        with self._lock:
            try:
                label = self._captures.undo() if self._captures is not None else None
            except RecorderError as exc:
                self.error = f"undo_capture: {exc}"
                raise LabelError(self.error) from None
            if label is None:
                raise LabelError("undo_capture: nothing captured in this session to undo")
            self.last = None
            return label

    def train(
        self,
        pretrain: Path | None,
        epochs: int | None,
        on_done: Callable[[Path], None],
        classes: list[str] | None = None,
        onnx: bool = False,
    ) -> TrainingJob:
        """Start a Train run on the captures as they are now (a snapshot in the run's ``captures``: later captures
        and undos leave it alone), exported as ONNX too with ``onnx``. Every class of ``classes`` (the viewer's, else
        ``--classes``) needs its captures too: a class left out of the model without a word is worse than a
        refusal."""
        from mem_core.corpus import labels_problem
        from recorders.base import RecorderError

        if self.job is not None and self.job.running:
            raise LabelError(f"train: a run is already training ({self.job.out})")
        if pretrain is None:
            raise LabelError(
                "train: no pretraining run to finetune: start mem serve with --pretrain RUN (or a --model "
                "finetuned from one)"
            )
        with self._lock:
            problem = labels_problem(self.counts(), classes or self.classes)
            if problem is not None:
                raise LabelError(f"train: {problem}")
            n = 1
            while (self.train_out / f"label-{n:03d}").exists():
                n += 1
            out = self.train_out / f"label-{n:03d}"
            try:
                snapshot = self._open().snapshot(out / SNAPSHOT)
            except RecorderError as exc:
                raise LabelError(f"train: {exc}") from None
        each = ", ".join(f"{count} {name}" for name, count in snapshot.label_counts().items())
        try:
            about = f"{len(snapshot)} captures: {each}"
            self.job = TrainingJob(snapshot.root, pretrain, out, epochs or self.epochs, on_done, about, onnx).start()
        except OSError as exc:
            raise LabelError(f"train: cannot start the run in {out}: {exc}") from None
        return self.job

    def state(self, model_classes: list[str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``labels`` and ``training`` fields of stats and control replies."""
        counts = self.counts()
        classes = list(self.classes or model_classes or [])
        classes += [name for name in sorted(counts) if name not in classes]  # captured under a name typed in
        labels = {
            "root": fit_path(self.root),
            "classes": classes,
            "counts": counts,
            "captures": self.captures_taken,
            "last": self.last,
            "error": None if self.error is None else self.error[:MAX_TEXT],
        }
        if self.job is not None:
            training = self.job.state()
        else:
            training = {"state": "idle", "epoch": 0, "epochs": self.epochs}
            if self.resumed is not None:
                training["message"] = f"serving {fit_path(self.resumed)}, trained before this server started"[:MAX_TEXT]
        return labels, training

    def close(self) -> None:
        if self.job is not None:
            self.job.cancel()
        with self._lock:
            if self._captures is not None:
                self._captures.close()
