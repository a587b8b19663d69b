"""A value's bounds are declared once, on its field, and every way in meets the same bound: direct construction, a
preset or ``--set``, a command's options and the live wire."""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Annotated

import pytest

from app.config import LABEL_EPOCHS, ServeConfig, TrainLabelsConfig
from mem_core.configuration import ConfigError, apply_overrides
from mem_core.fields import (
    AT_LEAST_1,
    ConfigConflict,
    FieldError,
    Help,
    Range,
    TrainEpochs,
    check_fields,
    check_value,
)
from mem_core.limits import MAX_SPEED, MAX_TRAIN_EPOCHS, MAX_WINDOW_EVENTS
from mem_core.protocol import ProtocolError, decode, decode_control, encode_control
from mem_core.representation import InputSpec
from mem_core.train.configs import FinetuneStageConfig, TokenizerStageConfig, stage_config
from recorders.base import Pacer
from recorders.config import RecordConfig


@dataclass
class Base:
    lr: Annotated[float, Range(0)] = 1.0
    sizes: tuple[Annotated[int, AT_LEAST_1], ...] = (1, 2)
    cap: Annotated[int, AT_LEAST_1] | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class Restated(Base):
    lr: float = 0.5  # a default restated without its bound keeps the base's


def test_a_bound_holds_for_values_tuples_and_none_and_survives_a_restated_default():
    assert Base(cap=None).cap is None and Base(sizes=(3, 4)).sizes == (3, 4)
    for bad, message in (
        ({"lr": -1.0}, "lr must be a number >= 0, got -1.0"),
        ({"lr": float("nan")}, "lr must be a number >= 0, got nan"),
        ({"sizes": (1, 0)}, "sizes must be a number >= 1, got (1, 0)"),
        ({"cap": 0}, "cap must be a number >= 1, got 0"),
        ({"lr": "fast"}, "lr must be a number >= 0, got 'fast'"),
    ):
        with pytest.raises(FieldError, match=re.escape(message)):
            Base(**bad)
    with pytest.raises(FieldError, match="lr must be a number >= 0"):
        Restated(lr=-1.0)
    # the stage configs restate their base's defaults too
    with pytest.raises(ConfigError, match=re.escape("lr must be a number >= 0, got -0.1")):
        TokenizerStageConfig(lr=-0.1)


def test_the_wire_reads_the_same_bound():
    from mem_core.schema import SchemaError, check

    assert check(TrainEpochs, 3) == 3
    with pytest.raises(SchemaError, match=re.escape(f"must be in [1, {MAX_TRAIN_EPOCHS}], got 0")):
        check(TrainEpochs, 0)
    with pytest.raises(SchemaError, match="expected an integer"):  # pydantic's type check still comes first
        check(TrainEpochs, "3")
    huge = 10**400  # JSON holds it; no float does
    with pytest.raises(SchemaError, match=re.escape(f"must be in [1, {MAX_TRAIN_EPOCHS}]")):
        check(TrainEpochs, huge)
    assert check(Annotated[int, Range(0)], huge) == huge  # an integer is finite, however large


def test_an_input_spec_built_directly_meets_the_bound_of_set():
    """``InputSpec(n_max=5_000_000)`` was accepted while ``--set input.n_max=5000000`` was refused."""
    message = f"n_max must be in [1, {MAX_WINDOW_EVENTS}], got 5000000"
    with pytest.raises(ConfigError, match=re.escape(message)):
        InputSpec(n_max=5_000_000)
    with pytest.raises(ConfigError, match=re.escape(f"input.{message}")):
        stage_config("finetune", preset="cpu-tiny", overrides=["input.n_max=5000000"])
    with pytest.raises(ConfigError, match=re.escape(f"input.{message}")):
        stage_config("finetune", preset="cpu-tiny", values={"input": {"n_max": 5_000_000}})


def test_settings_that_fit_only_together_wait_for_each_other_under_set():
    cfg = FinetuneStageConfig()
    both = ["input.resize_to=[200, 200]", "input.size=[180, 180]"]  # the first alone is smaller than size
    assert apply_overrides(cfg, both).input.resize_to == (200, 200)
    with pytest.raises(ConfigError, match=r"resize_to \(200, 200\) must be at least size"):
        apply_overrides(cfg, both[:1])
    with pytest.raises(ConfigConflict):
        InputSpec(resize_to=(200, 200))


def test_a_speed_is_one_value_on_the_command_line_the_wire_and_a_pacer(tmp_path):
    """``mem serve --speed -1`` ended in a traceback; record refused it; the wire wanted (0, 1000]."""
    bound = f"must be in [0, {MAX_SPEED:g}], got -1.0"
    for build in (
        lambda: ServeConfig(speed=-1.0),
        lambda: RecordConfig(source="sim", out=tmp_path, speed=-1.0),
        lambda: Pacer(-1.0),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"speed {bound}")):
            build()
    with pytest.raises(ProtocolError, match=re.escape(f"speed: value: {bound}")):
        decode_control(decode(encode_control(0, "speed", value=-1.0)))
    # 0 is as fast as possible everywhere, and the wire takes it too
    assert ServeConfig(speed=0.0).speed == RecordConfig(source="sim", out=tmp_path, speed=0.0).speed == 0.0
    assert decode_control(decode(encode_control(0, "speed", value=0.0))) == ("speed", {"value": 0.0})
    with pytest.raises(ConfigError, match="speed must be in"):
        ServeConfig(speed=MAX_SPEED * 2)


def test_label_training_epochs_have_one_bound_and_one_default(tmp_path):
    """Unbounded in ``serve --train-epochs``, <= 10,000 on the wire, unchecked in ``train-labels --epochs``."""
    bound = f"epochs must be in [1, {MAX_TRAIN_EPOCHS}], got 20000"
    with pytest.raises(ConfigError, match=re.escape(f"train_{bound}")):
        ServeConfig(train_epochs=20_000)
    with pytest.raises(ConfigError, match=re.escape(bound)):
        TrainLabelsConfig(labels=tmp_path, init=tmp_path, out=tmp_path / "run", epochs=20_000)
    with pytest.raises(ProtocolError, match=re.escape(f"train: epochs: must be in [1, {MAX_TRAIN_EPOCHS}]")):
        decode_control(decode(encode_control(0, "train", epochs=20_000)))
    with pytest.raises(ConfigError, match=re.escape(bound)):
        check_value("epochs", 20_000, TrainEpochs)  # what train_captures checks, called from anywhere
    fields = {f.name: f.default for f in dataclasses.fields(TrainLabelsConfig)}
    assert ServeConfig().train_epochs == fields["epochs"] == LABEL_EPOCHS


def test_a_window_of_0_ms_means_no_time_limit_on_the_command_line_and_the_wire():
    """``--window-ms 0`` meant no cap while the wire refused ``ms`` 0."""
    from app.live.accumulation import configured_window

    assert configured_window(ServeConfig(window_ms=0.0), (30_000, 100.0)).ms is None
    assert decode_control(decode(encode_control(0, "window", events=5000, ms=0.0))) == (
        "window",
        {"events": 5000, "ms": None},
    )
    with pytest.raises(ConfigError, match="window_ms must be in"):
        ServeConfig(window_ms=-1.0)
    with pytest.raises(ConfigError, match=re.escape(f"window_events must be in [1, {MAX_WINDOW_EVENTS}], got 0")):
        ServeConfig(window_events=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--speed", "-1"], "speed must be in [0, 1000], got -1.0"),
        (["record", "--source", "sim", "--out", "X", "--speed", "-1"], "speed must be in [0, 1000], got -1.0"),
        (["serve", "--train-epochs", "20000"], "train_epochs must be in [1, 10000], got 20000"),
        (
            ["train-labels", "--labels", "X", "--init", "X", "--out", "X", "--epochs", "20000"],
            "epochs must be in [1, 10000], got 20000",
        ),
    ],
)
def test_the_command_line_refuses_out_of_bounds_options_in_one_line(tmp_path, monkeypatch, capsys, args, message):
    from app.cli import main

    args = [str(tmp_path / a) if a == "X" else a for a in args]
    monkeypatch.setattr(sys, "argv", ["mem", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "X").exists()


def test_an_option_s_help_and_default_come_from_its_field(monkeypatch, capsys):
    from typer.main import get_command

    from app.cli import app
    from mem_core.fields import help_of

    serve = get_command(app).commands["serve"]
    options = {param.name: param for param in serve.params}
    assert options["train_epochs"].default == LABEL_EPOCHS
    assert options["train_epochs"].help == help_of(ServeConfig, "train_epochs").text
    assert options["loop"].opts == ["--loop"] and options["loop"].secondary_opts == ["--no-loop"]
    assert "top_k" not in options  # a field without Help is no option
    assert isinstance(help_of(ServeConfig, "speed"), Help) and help_of(ServeConfig, "top_k") is None
