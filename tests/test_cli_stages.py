"""The stage commands as users and outside checks run them: ``mem tokenizer/pretrain/finetune/evaluate/export``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "epochs=1",
    "batch_size=8",
    "data.max_samples=24",
    "data.num_workers=0",
    "input.size=[32, 32]",
    "input.n_max=2000",
]
TINY_VIT = ["model.patch_size=8", "model.embed_dim=32", "model.depth=2", "model.num_heads=2"]
TINY_TOK = ["model.num_layers=3", "model.num_tokens=32", "model.hidden_dim=8", "model.codebook_dim=8"]


def mem(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=600)
    return result


def mem_in_process(monkeypatch, capsys, *args: str, stdout: list[str] | None = None) -> tuple[int, str]:
    """``mem ARGS`` run in this process (an argument error needs no interpreter of its own): exit status, stderr;
    what it printed on stdout is appended to ``stdout``."""
    from app.cli import main

    monkeypatch.setattr(sys, "argv", ["mem", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main()
    printed = capsys.readouterr()
    if stdout is not None:
        stdout.append(printed.out)
    return exit_info.value.code, printed.err


def sets(*settings: str) -> list[str]:
    return [arg for s in settings for arg in ("--set", s)]


def few_ncars(root: Path, data_dir: Path, per_class: dict[str, int]) -> Path:
    """An N-Cars root of a few real samples per class of each split (links into ``ncars-dev``)."""
    for split, count in per_class.items():
        for cls in ("background", "cars"):
            (root / split / cls).mkdir(parents=True)
            for path in sorted((data_dir / "ncars-dev" / split / cls).iterdir())[:count]:
                (root / split / cls / path.name).symlink_to(path)
    return root


def test_tokenizer_pretrain_finetune_evaluate_export(tmp_path, data_dir, monkeypatch, capsys):
    """Each training command as a user runs it, in a process of its own, on real recordings; evaluate and export in
    this process (their own processes are started by tests/test_boundaries.py and tests/test_export.py)."""
    data = few_ncars(tmp_path / "ncars", data_dir, {"train": 12, "val": 4, "test": 5})

    def stage(name: str, out: str, *args: str) -> None:
        r = mem(
            name, "--dataset", "ncars", "--data", str(data), "--preset", "cpu-tiny", "--out", str(tmp_path / out), *args
        )
        assert r.returncode == 0, r.stderr[-3000:]

    stage("tokenizer", "tok", *sets(*TINY, *TINY_TOK))
    stage("pretrain", "pre", "--tokenizer", str(tmp_path / "tok"), *sets(*TINY, *TINY_VIT))
    stage("finetune", "ft", "--init", str(tmp_path / "pre"), "--label-fraction", "0.5", *sets(*TINY, *TINY_VIT))
    assert json.loads((tmp_path / "ft" / "result.json").read_text())["train_samples"] == 12  # half of 24
    printed: list[str] = []
    code, err = mem_in_process(monkeypatch, capsys, "evaluate", "--model", str(tmp_path / "ft"), "--dataset", "ncars",
                               "--data", str(data), "--split", "test", "--json", stdout=printed)  # fmt: skip
    assert code == 0, err[-3000:]
    result = json.loads(printed[0].strip().splitlines()[-1])
    assert 0 <= result["top1"] <= 1 and result["n"] == 10
    export = ["export", "--model", str(tmp_path / "ft"), "--out", str(tmp_path / "export")]
    code, err = mem_in_process(monkeypatch, capsys, *export)
    assert code == 0, err[-3000:]
    meta = json.loads((tmp_path / "export" / "model.json").read_text())
    assert meta["task"] == "classification" and meta["classes"] == ["background", "cars"]
    assert (tmp_path / "export" / "model.safetensors").is_file()
    assert (tmp_path / "export" / "tokenizer.safetensors").is_file()


@pytest.mark.parametrize("command", ["finetune", "segment"])
def test_training_from_scratch_goes_without_layer_decay_unless_set(monkeypatch, capsys, tmp_path, command):
    """`mem finetune` or `mem segment` without --init trains as the experiment's ViT from scratch: no layer decay,
    which would only slow blocks with nothing pretrained to keep; from --init, or with --set layer_decay, the preset's
    or the given."""
    import importlib
    from types import SimpleNamespace

    trained = {}

    def record(cfg, out, *, init=None, resume=False):
        trained[init] = cfg.layer_decay
        return SimpleNamespace(path=tmp_path)

    monkeypatch.setattr(importlib.import_module(f"mem_core.train.{command}"), "run", record)
    base = [command, "--dataset", "sim", "--preset", "cpu-tiny", "--out", str(tmp_path / "run")]
    for extra in ([], ["--init", "pre"]):
        assert mem_in_process(monkeypatch, capsys, *base, *extra)[0] == 0
    assert trained == {None: 1.0, Path("pre"): 0.75}
    assert mem_in_process(monkeypatch, capsys, *base, "--set", "layer_decay=0.6")[0] == 0
    assert trained[None] == 0.6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["finetune", "--dataset", "sim", "--out", "X", "--set", "epoch=1"], "unknown config key 'epoch'"),
        (["finetune", "--dataset", "sim", "--out", "X", "--set", "epochs=one"], "epochs: expected an integer"),
        (["finetune", "--dataset", "sim", "--out", "X", "--preset", "gpu-huge"], "unknown preset 'gpu-huge'"),
        (["pretrain", "--dataset", "sim", "--out", "X"], "needs --tokenizer"),
        (["evaluate", "--model", "nowhere", "--dataset", "sim"], "not a MEM run directory"),
        (["finetune", "--dataset", "sim", "--out", "X", "--set", "batch_size=0"], "batch_size must be a number >= 1"),
        (["finetune", "--dataset", "sim", "--out", "X", "--set", "lr=nan"], "lr must be a number >= 0, got nan"),
        (["finetune", "--dataset", "sim", "--out", "X", "--set", "epochs=-1"], "epochs must be a number >= 1"),
        (["record", "--source", "sim", "--out", "X", "--duration", "-5"], "duration_s must be a number > 0"),
    ],
)
def test_bad_arguments_are_one_clear_line(tmp_path, args, message, monkeypatch, capsys):
    from app.cli import main

    args = [str(tmp_path / a) if a == "X" else a for a in args]
    monkeypatch.setattr(sys, "argv", ["mem", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "X").exists()  # nothing started


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    """N-Cars class folders without a split folder fail once the run directory is made: it goes again (with the
    parent made for it), one short line says why; a folder the user had stays."""
    for cls in ("cars", "background"):
        (tmp_path / "nc" / cls).mkdir(parents=True)
        (tmp_path / "nc" / cls / "0.dat").write_bytes(b"")
    expected = (
        f"error: {tmp_path / 'nc'}: holds cars/ and background/ directly; N-Cars wants them inside train/ and test/\n"
    )
    (tmp_path / "mine").mkdir()
    for out in (tmp_path / "runs" / "ft", tmp_path / "mine"):
        args = [
            "finetune",
            "--dataset",
            "ncars",
            "--data",
            str(tmp_path / "nc"),
            "--out",
            str(out),
            "--preset",
            "cpu-tiny",
        ]
        assert mem_in_process(monkeypatch, capsys, *args) == (2, expected)
    assert not (tmp_path / "runs").exists() and (tmp_path / "mine").is_dir()


def test_a_run_that_checkpointed_keeps_its_directory_when_it_fails_later(tmp_path):
    from mem_core.runs.rundir import CHECKPOINT_FILE, discarded_if_it_fails_unstarted

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), discarded_if_it_fails_unstarted(run):
        run.mkdir()
        (run / CHECKPOINT_FILE).write_bytes(b"epoch 0")
        raise KeyboardInterrupt  # Ctrl-C in the second epoch: --resume continues from the first
    assert (run / CHECKPOINT_FILE).read_bytes() == b"epoch 0"


def test_pretrain_method_comes_from_the_config_unless_given(tmp_path, monkeypatch, capsys):
    config = tmp_path / "emae.toml"
    config.write_text(
        '[vit]\nabs_pos_emb = true\nrel_pos_bias = false\n[pretrain]\nmethod = "emae"\nemae_decoder = [32, 1, 2]\n'
    )
    args = ["--dataset", "sim", "--preset", "cpu-tiny", "--config", str(config), *sets(*TINY, *TINY_VIT)]
    code, err = mem_in_process(monkeypatch, capsys, "pretrain", "--out", str(tmp_path / "pre"), *args)
    assert code == 0, err[-3000:]  # eMAE needs no tokenizer
    assert json.loads((tmp_path / "pre" / "config.json").read_text())["config"]["method"] == "emae"
    code, err = mem_in_process(
        monkeypatch, capsys, "pretrain", "--out", str(tmp_path / "mem"), "--method", "mem", *args
    )
    assert code == 2 and "needs --tokenizer" in err  # the option still wins over the file


def test_every_option_help_reaches_the_user_whole(monkeypatch, capsys):
    """rich reads help text as markup: an unescaped ``[input]`` would vanish from ``--help``."""
    import re

    import click
    from typer.main import get_command

    from app.cli import app, main

    def commands(command: click.Command, path: tuple[str, ...] = ()):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from commands(sub, (*path, name))

    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    checked = 0
    for path, command in commands(get_command(app)):
        texts = [p.help for p in command.params if getattr(p, "help", None)]
        if not texts:
            continue
        monkeypatch.setattr(sys, "argv", ["mem", *path, "--help"])
        with pytest.raises(SystemExit):
            main()
        shown = " ".join(capsys.readouterr().out.split())
        for text in texts:
            expected = " ".join(text.replace("\\[", "[").split())
            assert expected in shown, f"mem {' '.join(path)}: {text!r}"
            checked += re.search(r"\[\w", text) is not None
    assert checked >= 1  # --config's "[input], [data], [vit]" at least


def test_command_defaults_are_the_config_dataclasses_defaults():
    """serve, view, record, ingest, demo and the experiment take their option defaults from their config, so the
    two never disagree."""
    import dataclasses

    from typer.main import get_command

    from app.cli import app
    from app.config import DemoConfig, ServeConfig, ViewConfig
    from mem_core.train.experiment import LabelEfficiencyConfig
    from recorders.config import IngestConfig, RecordConfig

    renamed = {"duration": "duration_s", "quit_after": "quit_after_s", "min_free_mb": "min_free_bytes"}
    converted = {
        "min_free_bytes": lambda v: v * (1 << 20),
        "fractions": lambda v: tuple(map(float, v.split(","))),
        "seeds": lambda v: tuple(map(int, v.split(","))),
        "label_seeds": lambda v: tuple(map(int, v.split(","))),
        "classes": lambda v: tuple(c for c in v.split(",") if c),
        "held_out": lambda v: tuple(v.split(",")),
    }
    group = get_command(app)
    commands = {
        "serve": ServeConfig,
        "view": ViewConfig,
        "record": RecordConfig,
        "ingest": IngestConfig,
        "demo": DemoConfig,
    }
    checked = 0
    for name, cls in [*commands.items(), ("experiment label-efficiency", LabelEfficiencyConfig)]:
        command = group
        for part in name.split():
            command = command.commands[part]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for param in command.params:
            field = renamed.get(param.name, param.name)
            if field in fields and fields[field].default is not dataclasses.MISSING:
                default = converted.get(field, lambda v: v)(param.default) if param.default is not None else None
                if default is None and param.multiple:  # a repeatable option given no times: none of them
                    default = ()
                expected = fields[field].default
                if isinstance(default, Path) or isinstance(expected, Path):
                    default, expected = str(default), str(expected)
                assert default == expected, f"mem {name} --{param.name}"
                checked += 1
    assert checked >= 20


def test_bench_train_measures_every_stage_and_the_loader(tmp_path, monkeypatch, capsys):
    out = tmp_path / "train.json"
    args = ["--preset", "cpu-tiny", "--steps", "1", "--batch-size", "4"]
    args += ["--sensor", "120x100", "--window-events", "3000"]
    r = mem("bench", "train", *args, "--json-out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["name"]: row for row in json.loads(out.read_text())}
    for stage in ("tokenizer", "pretrain", "finetune"):
        assert rows[f"{stage} images/s"]["value"] > 0 and rows[f"{stage} step"]["batch"] == 4
    assert [row["value"] > 0 for name, row in rows.items() if name.startswith("data loader")] == [True]
    assert {(row["sensor"], row["events"]) for row in rows.values()} == {("120x100", 3000)}  # N-Cars-sized windows
    code, err = mem_in_process(monkeypatch, capsys, "bench", "train", *args, "--stages", "finetune", "--no-loader",
                               "--json-out", str(out))  # fmt: skip
    assert code == 0, err[-3000:]
    assert [row["name"] for row in json.loads(out.read_text())] == ["finetune images/s", "finetune step"]

    for bad, expected in (
        (["--stages", "finetune,distill"], "name one or more of tokenizer, pretrain, finetune"),
        (["--sensor", "120by100"], "'120by100' is not WIDTHxHEIGHT in pixels, e.g. 120x100"),
    ):
        code, err = mem_in_process(monkeypatch, capsys, "bench", "train", *bad)
        message = " ".join(err.replace("│", " ").split())  # the error panel wraps its text
        assert code == 2 and expected in message


@pytest.mark.slow  # trains, with loader processes (through main(), where the tier scan does not read)
def test_bench_cnn_reference_trains_on_the_finetuning_label_subset(tmp_path, data_dir, monkeypatch, capsys):
    """The CNN yardstick trains through the finetuning stage: its label fraction, with the steps of a run on all
    labels, validated on the whole val split, into a run directory like any finetuning run's (in this process: `mem
    bench train` above starts a bench command in a process of its own)."""
    data = few_ncars(tmp_path / "ncars", data_dir, {"train": 10, "val": 3})
    out = tmp_path / "cnn.json"
    args = ["--dataset", "ncars", "--data", str(data), "--preset", "cpu-tiny", "--label-fraction", "0.2"]
    args += ["--epochs", "1", "--arch", "resnet10t"]
    code, err = mem_in_process(
        monkeypatch, capsys, "bench", "cnn-reference", *args, "--json-out", str(out), "--out", str(tmp_path / "run")
    )
    assert code == 0, err[-3000:]
    result = json.loads(out.read_text())
    assert (result["train_samples"], result["val_samples"]) == (4, 6)  # 20 % of the 20 train samples, all of val
    assert result["epochs"] == 1  # the epochs of all labels, each drawing as many samples as they hold
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["data"]["epoch_samples"] == 20
    [row] = result["rows"]  # validated after its last epoch
    assert row["epoch"] == 1 and 0.0 <= row["val_top1"] <= 1.0 and row["train_acc"] > 0.0
    assert json.loads((tmp_path / "run" / "result.json").read_text())["top1"] == result["best_top1"]
    assert (tmp_path / "run" / "best.pt").is_file() and (tmp_path / "run" / "confusion.png").is_file()
