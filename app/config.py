"""What the app's commands do, as dataclasses: ``mem serve``, ``mem view`` and ``mem demo``.

Each field with a ``Help`` is a command option (``app/cli/options.py``): its type, default, bounds and help are
declared here once. Light to import on purpose (no torch, Qt or ZMQ): the command line reads these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from mem_core.errors import ConfigError
from mem_core.fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    Help,
    Speed,
    TrainEpochs,
    WindowEvents,
    WindowMs,
    check_fields,
    device_problem,
)
from mem_core.limits import MIN_FREE_BYTES
from recorders.config import LOOP_HELP, SOURCE_HELP

LABEL_EPOCHS = 150  # epochs of a run on the viewer's captures: `mem serve`'s Train and `mem train-labels`


# The held-out sets ``mem demo`` can score on and what each shows: the sim dataset's test split and its shifted
# versions (``mem_core/datasets/sim.py``'s ``SIM_SHIFTED_SPLITS``), the same scenes under other conditions.
DEMO_HELD_OUT = {
    "test": "the camera and objects of the labelled windows",
    "test-sensor": "another sensor (higher, uneven contrast thresholds; 20 times the background activity)",
    "test-motion": "other objects (smaller and faster)",
}


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``mem serve`` needs; ``control=None`` binds the control socket on the port after ``pub``."""

    model: Annotated[
        Path | None,
        Help(
            "Export directory (mem export) or finetune/segment run, or an ONNX model (model.onnx of mem export "
            "--format onnx, or its folder: run by onnxruntime on the CPU, torch never imported). Without one the "
            "server streams the sensor view for labelling (mem view: number keys capture, Train finetunes --pretrain "
            "on the captures)."
        ),
    ] = None
    source: Annotated[str, Help(SOURCE_HELP)] = "sim"
    tokenizer: Annotated[
        Path | None,
        Help("Tokenizer run or export for the token overlay (default: the one exported with the model)."),
    ] = None
    window_events: Annotated[
        WindowEvents | None,
        Help(
            "Events per window (default: the model's input.n_max, 30000 for the paper's models; mem view can "
            "change it)."
        ),
    ] = None
    window_ms: Annotated[
        WindowMs | None,
        Help(
            "Also cap the window's time span (ms); 0: no cap. Default: the span of the model's training samples "
            "where its export records one (100 for N-Cars, 50 for sim), else no cap."
        ),
    ] = None
    pub: Annotated[str, Help("PUB endpoint to bind.")] = "tcp://127.0.0.1:5557"
    control: Annotated[str | None, Help("Control (REP) endpoint to bind (default: the --pub port + 1).")] = None
    speed: Annotated[Speed, Help("Replay / simulator speed (x real time); 0: as fast as possible.")] = 1.0
    loop: Annotated[bool, Help(LOOP_HELP, flag="--loop/--no-loop")] = False
    top_k: Annotated[int, AT_LEAST_1] = 5
    threads: Annotated[int, AT_LEAST_1, Help("CPU threads for inference (torch's, or onnxruntime's).")] = 1
    device: Annotated[str, Help("cpu or cuda[:N].")] = "cpu"
    eager: Annotated[
        bool,
        Help(
            "On a GPU, keep the model's weights in fp32 (bf16 autocast) and run it without a CUDA graph. Default "
            "there: bf16 weights and a CUDA graph of the model and tokenizer, 5 times faster. A CPU runs it as is."
        ),
    ] = False
    stats_interval_s: Annotated[float, POSITIVE] = 0.5
    record_dir: Annotated[Path, Help("Corpus that record_start writes into (camera and sim sources).")] = Path(
        "recordings"
    )
    duration_s: Annotated[
        float | None, POSITIVE, Help("Stop after S seconds of the wall clock.", flag="--stop-after")
    ] = None
    # the label-a-few loop: captures go to ``labels`` (a labelled corpus), "Train" finetunes the pretraining run
    # ``pretrain`` (default: the one behind ``model``) on them into ``train_out``; ``watch``: load newer exports of
    # ``model`` as they appear
    labels: Annotated[Path, Help("Labelled corpus that the viewer's captures go into (created).")] = Path("labels")
    classes: Annotated[
        tuple[str, ...],
        Help("Comma-separated class names to label (default: the model's, else those captured)."),
    ] = ()
    pretrain: Annotated[
        Path | None, Help("Pretraining run that Train finetunes (default: the one behind --model).")
    ] = None
    train_out: Annotated[Path, Help("Where Train writes its runs and exports.")] = Path("label-runs")
    min_free_bytes: Annotated[
        int, AT_LEAST_0, Help("Refuse captures and stop recordings before the disk has less than this free.")
    ] = MIN_FREE_BYTES
    train_epochs: Annotated[TrainEpochs, Help("Epochs of a Train run.")] = LABEL_EPOCHS
    watch: Annotated[bool, Help("Load a newer export of --model when one appears (no restart).")] = False

    def __post_init__(self) -> None:
        check_fields(self)
        if (problem := device_problem(self.device)) is not None:
            raise ConfigError(problem)
        if self.classes:
            from mem_core.schema import SchemaError, class_names  # pydantic: imported only where classes are given

            try:  # in the one Unicode spelling captures are stored under (frozen: set as the dataclass does)
                object.__setattr__(self, "classes", tuple(class_names(list(self.classes))))
            except SchemaError as exc:
                raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class ViewConfig:
    """``mem view`` options: where to connect, and an optional snapshot + exit for headless use."""

    connect: Annotated[str, Help("The server's PUB endpoint.")] = "tcp://127.0.0.1:5557"
    snapshot: Annotated[Path | None, Help("Save the window as PNG (plus a .json of what it shows) when quitting.")] = (
        None
    )
    quit_after_s: Annotated[float | None, POSITIVE, Help("Quit after S seconds.", flag="--quit-after")] = None
    snapshot_dir: Annotated[Path, Help("Where the Save snapshot button writes (created).")] = Path("mem-view-snapshots")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TrainLabelsConfig:
    """``mem train-labels``: finetune the pretraining run ``init`` on the captures in ``labels`` into the run
    ``out``, and export it to ``export`` (default: ``out/export``)."""

    labels: Annotated[Path, Help("Labelled capture corpus (mem view's captures).")]
    init: Annotated[Path, Help("Pretraining run to finetune (its model and input).")]
    out: Annotated[Path, Help("Run directory to write.")]
    export: Annotated[Path | None, Help("Export directory for mem serve (default: OUT/export).")] = None
    epochs: Annotated[TrainEpochs, Help("Training epochs (tens of samples: a few steps each).")] = LABEL_EPOCHS

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def export_dir(self) -> Path:
        return self.export or self.out / "export"


@dataclass(frozen=True)
class DemoConfig:
    """``mem demo``: where it writes, window or snapshots (None: snapshots when there is no display), fresh start,
    the labels of each finetuning run and the label seeds that draw them, finetuning runs at once, the held-out sets
    every kept model is scored on."""

    out: Annotated[Path, Help("Where the demo writes everything.")] = Path("mem-demo")
    headless: Annotated[
        bool | None,
        Help("Snapshots and a report instead of the viewer (default: no display).", flag="--headless/--viewer"),
    ] = None
    fresh: Annotated[bool, Help("Start over instead of reusing the last demo's work.")] = False
    labels_per_class: Annotated[int, Help("Labelled samples per class in each finetuning run.")] = 10
    label_seeds: Annotated[
        tuple[int, ...],
        Help(
            "Comma-separated label seeds: each draws other labelled samples, the same for every arm.",
            flag="--label-seeds",
        ),
    ] = (0, 1, 2)
    # two single-threaded runs at once finish sooner on 2 cores than one run on both
    jobs: Annotated[int, AT_LEAST_1, Help("Finetuning runs at once, each in its own process.")] = 2
    held_out: Annotated[
        tuple[str, ...],
        Help(
            "Comma-separated held-out sets every arm is scored on: test (the labelled windows' camera), test-motion "
            "(smaller, faster objects) or test-sensor (another sensor, 20 times the background activity).",
            flag="--held-out",
        ),
    ] = ("test", "test-motion")

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.label_seeds or len(set(self.label_seeds)) != len(self.label_seeds):
            raise ConfigError(f"label seeds must be distinct and at least one, got {self.label_seeds}")
        if not self.held_out or len(set(self.held_out)) != len(self.held_out):
            raise ConfigError(f"held-out sets must be distinct and at least one, got {self.held_out}")
        unknown = [s for s in self.held_out if s not in DEMO_HELD_OUT]
        if unknown:
            raise ConfigError(f"held-out sets are {', '.join(DEMO_HELD_OUT)}, not {unknown[0]!r}")
