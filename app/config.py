"""What the app's commands do, as dataclasses: ``mem serve``, ``mem view`` and ``mem demo``.

Light to import on purpose (no torch, Qt or ZMQ): the command line takes its option defaults from these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mem_core.configuration import ConfigError, Interval, check_ranges
from mem_core.limits import MAX_WINDOW_EVENTS, MAX_WINDOW_MS


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``mem serve`` needs; ``control=None`` binds the control socket on the port after ``pub``."""

    model: Path | None = None  # None: no model yet (sensor view, labelling and training only)
    source: str = "sim"
    tokenizer: Path | None = None
    window: int | None = None  # events per window; None: the model's n_max
    window_ms: float | None = None  # and no older than this before the newest event (None: the model's training
    # samples' span where its export records one, else no limit; 0: no limit)
    pub: str = "tcp://127.0.0.1:5557"
    control: str | None = None
    speed: float = 1.0  # replay / simulator speed (x real time)
    loop: bool = True  # replay files in a loop
    top_k: int = 5
    threads: int = 1  # torch CPU threads for inference
    device: str = "cpu"
    stats_interval_s: float = 0.5
    record_dir: Path = Path("recordings")
    duration_s: float | None = None  # stop after this long (None: until interrupted)
    # the label-a-few loop: captures go to ``labels`` (a labelled corpus), "Train" finetunes the pretraining run
    # ``pretrain`` (default: the one behind ``model``) on them into ``train_out``; ``watch``: load newer exports of
    # ``model`` as they appear
    labels: Path = Path("labels")
    classes: tuple[str, ...] = ()  # class names to label (default: the model's, else those already captured)
    pretrain: Path | None = None
    train_out: Path = Path("label-runs")
    train_epochs: int = 150
    watch: bool = False

    def __post_init__(self) -> None:
        if self.window is not None and not 1 <= self.window <= MAX_WINDOW_EVENTS:
            raise ConfigError(f"window must be 1 to {MAX_WINDOW_EVENTS:,} events, got {self.window}")
        if self.window_ms is not None and self.window_ms not in Interval(0, MAX_WINDOW_MS):
            raise ConfigError(f"window_ms must be 0 (no time limit) to {MAX_WINDOW_MS:g} ms, got {self.window_ms}")
        check_ranges(
            self, {"top_k": Interval(1), "train_epochs": Interval(1), "stats_interval_s": Interval(0, lo_open=True)}
        )
        if self.classes:
            from mem_core.schema import SchemaError, class_names  # pydantic: imported only where classes are given

            try:  # in the one Unicode spelling captures are stored under (frozen: set as the dataclass does)
                object.__setattr__(self, "classes", tuple(class_names(list(self.classes))))
            except SchemaError as exc:
                raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class ViewConfig:
    """``mem view`` options: where to connect, and an optional snapshot + exit for headless use."""

    connect: str = "tcp://127.0.0.1:5557"
    snapshot: Path | None = None
    quit_after_s: float | None = None


@dataclass(frozen=True)
class DemoConfig:
    """``mem demo``: where it writes, window or snapshots (None: snapshots when there is no display), fresh start,
    the labels of each finetuning run and the label seeds that draw them, finetuning runs at once."""

    out: Path = Path("mem-demo")
    headless: bool | None = None
    fresh: bool = False
    labels_per_class: int = 10
    label_seeds: tuple[int, ...] = (0, 1, 2)
    jobs: int = 2  # two single-threaded runs at once finish sooner on 2 cores than one run on both

    def __post_init__(self) -> None:
        if not self.label_seeds or len(set(self.label_seeds)) != len(self.label_seeds):
            raise ConfigError(f"label seeds must be distinct and at least one, got {self.label_seeds}")
        check_ranges(self, {"jobs": Interval(1)})
