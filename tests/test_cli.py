"""The ``mem`` command line as a user reads it: ``--help``, ``mem inspect`` of a file, a folder and a corpus,
``mem record --duration`` in the source's time, and ``mem serve`` stopped by a signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from app.cli import app
from mem_core.corpus import Corpus, CorpusWriter
from mem_core.events import SensorSize, make_events
from mem_core.io import write_events


def mem(*args: str) -> str:
    """What ``mem ARGS`` prints (stdout and stderr) in a wide terminal; the command must succeed."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def commands(command, path: tuple[str, ...] = ()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def test_help_shows_flags_plainly_and_flows_its_paragraphs():
    from typer.main import get_command

    checked = 0
    for path, command in commands(get_command(app)):
        shown = mem(*path, "--help")
        assert "<bool>" not in shown, f"mem {' '.join(path)}"
        flags = [p.opts[0] for p in command.params if getattr(p, "is_flag", False) and not p.hidden]
        for flag in flags:
            assert flag in shown
        checked += len(flags)
    assert checked >= 10 and "--json  " in mem("inspect", "--help")
    assert "(with --verify every event is read and checked too)" in mem("inspect", "--help")  # flowed, not cut


def test_help_names_every_bundled_preset_and_the_viewer_s_keys():
    presets = sorted(path.stem for path in (Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))
    assert "cpu-small" in presets
    for command in (("tokenizer",), ("finetune",), ("experiment", "label-efficiency")):
        shown = " ".join(mem(*command, "--help").replace("│", " ").split())
        assert f"A bundled preset (configs/): {', '.join(presets)}." in shown, command
    shown = " ".join(mem("view", "--help").split())
    assert "Keys: 1-9 capture the window on screen as the label panel's class 1-9" in shown
    assert "Ctrl+Z takes the last capture back" in shown


def test_record_help_explains_sim_fast_and_duration_in_the_source_s_time():
    shown = " ".join(mem("record", "--help").replace("│", " ").split())
    assert "sim:fast: a 640 x 480 load test (about 100 Mev/s)" in shown
    assert "seconds of the source's time" in shown and "with --speed 0" in shown


def test_record_duration_counts_the_source_s_time_at_any_speed(tmp_path):
    """``--speed 0 --duration 3`` records 3 s of the simulation, not 3 s of the wall clock (which gave 0.25 s)."""
    out = mem("record", "--source", "sim", "--speed", "0", "--duration", "3", "--out", str(tmp_path / "c"))
    assert "3.0 s of the source's time" in out and "stopped: duration" in out
    [recording] = Corpus(tmp_path / "c").recordings
    assert 2.99 <= (recording.t_max - recording.t_min) / 1e6 < 3.0


def dat_file(path, t0_us: int, seconds: float, n: int, sensor: SensorSize | None = None):
    sensor = sensor or SensorSize(100, 120)
    rng = np.random.default_rng(0)
    t = np.linspace(t0_us, t0_us + seconds * 1e6, n).astype(np.int64)
    events = make_events(t, rng.integers(0, sensor.width, n), rng.integers(0, sensor.height, n), np.arange(n) % 2)
    return write_events(path, events, sensor)


def test_inspect_of_a_file_gives_times_in_seconds_its_duration_and_event_rate(tmp_path):
    shown = mem("inspect", str(dat_file(tmp_path / "a.dat", 1_000_000, 2.0, 1000)))
    for row in (
        "format",
        "dat",
        "120 x 100 px",
        "1,000",
        "500 / 500",
        "1.000000 s",
        "3.000000 s",
        "2.000000 s",
        "500 ev/s",
    ):
        assert row in shown
    info = json.loads(mem("inspect", str(tmp_path / "a.dat"), "--json").splitlines()[-1])
    assert info["t_min"] == 1_000_000 and info["duration_s"] == 2.0 and info["events_per_s"] == 500.0


def test_inspect_of_a_folder_lists_its_event_files_and_caps_what_it_reads(tmp_path, monkeypatch):
    from recorders import inventory

    folder = tmp_path / "files"
    (folder / "deep").mkdir(parents=True)
    dat_file(folder / "a.dat", 0, 1.0, 400)
    dat_file(folder / "deep" / "b.bin", 0, 0.5, 100, SensorSize(34, 34))
    (folder / "broken.raw").write_bytes(b"% evt 3.0\n% end\n" + bytes(7))
    big = dat_file(folder / "big.dat", 0, 1.0, 5000)
    (folder / "notes.txt").write_text("not an event file")
    monkeypatch.setattr(inventory, "MAX_FILE_BYTES", big.stat().st_size - 1)
    shown = mem("inspect", str(folder))
    assert f"{folder}: 4 event files (no corpus manifest)" in shown and "notes.txt" not in shown
    lines = {line.split()[1]: line for line in shown.splitlines() if line.startswith("│")}
    assert "120 x 100 px" in lines["a.dat"] and "400" in lines["a.dat"] and "1.000000 s" in lines["a.dat"]
    assert "34 x 34 px" in lines["deep/b.bin"] and "200 ev/s" in lines["deep/b.bin"]
    assert "not decoded" in lines["big.dat"] and "unreadable" in lines["broken.raw"]
    assert "broken.raw: " in shown and "files over 0.0 MB not decoded: mem inspect FILE describes one" in shown
    info = json.loads(mem("inspect", str(folder), "--json").splitlines()[-1])
    assert info["event_files"] == 4 and [f["path"] for f in info["files"]] == [
        "a.dat",
        "big.dat",
        "broken.raw",
        "deep/b.bin",
    ]


def test_inspect_piped_keeps_every_file_name_whole(tmp_path):
    """Piped (here: not a terminal, no COLUMNS), the tables are as wide as they need: rich folded them at 80 columns
    and broke file names mid-word, which grep and a reader then miss."""
    name = "session_2024-05-17_dvxplorer_on_the_lab_desk_looking_at_the_door_with_people_walking_by.dat"
    dat_file(tmp_path / name, 0, 1.0, 100)
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)], env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    assert f"│ {name} │ dat" in result.output


def test_inspect_of_a_folder_without_event_files_says_what_it_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("not events")
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert f"error: {tmp_path}: neither a corpus (no manifest.json) nor a folder of event files (.dat," in result.output


def test_inspect_of_a_corpus_tables_sensors_labels_and_each_recording_on_its_own_clock(tmp_path):
    """Two recordings whose clocks start 1000 s apart: 3 s of events in all, not a 1002 s time range."""
    n_cars, n_mnist = SensorSize(100, 120), SensorSize(34, 34)
    with CorpusWriter(tmp_path / "c", flush_interval_s=0) as writer:
        for name, t0, seconds, sensor, label in (
            ("first", 0, 1.0, n_cars, "car"),
            ("second", 1_000_000_000, 2.0, n_mnist, "background"),
            ("third", 5_000_000, 0.5, n_cars, "car"),
        ):
            t = np.linspace(t0, t0 + seconds * 1e6, 1000).astype(np.int64)
            writer.add_recording(name, make_events(t, 0, 0, 1), sensor, label=label)
    shown = mem("inspect", str(tmp_path / "c"))
    assert "duration (all recordings)" in shown and "3.500000 s" in shown and "1000." not in shown
    rows = {line.split()[1]: line for line in shown.splitlines() if line.startswith("│")}
    assert "120 x 100 px" in rows["first"] and "1.000000 s" in rows["first"] and "car" in rows["first"]
    assert "2.000000 s" in rows["second"] and "500 ev/s" in rows["second"]
    assert "120 x 100 px │          2" in shown and "34 x 34 px │          1" in shown  # the sensors table
    assert "car        │          2" in shown and "background │          1" in shown  # the labels table
    info = json.loads(mem("inspect", str(tmp_path / "c"), "--json").splitlines()[-1])
    assert [r["duration_s"] for r in info["recording_list"]] == [1.0, 2.0, 0.5] and info["duration_s"] == 3.5


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_started_in_the_background_stops_on_a_signal(signum, tmp_path):
    """A shell starts a background job (`mem serve ... &`) with SIGINT ignored; it must stop as in the foreground."""
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--source", "synthetic:0.01", "--pub", "tcp://127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints where every thread is
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # what `&` does
    )
    try:
        lines = []
        while not any(line.startswith("publishing on") for line in lines):
            line = server.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        time.sleep(0.5)
        server.send_signal(signum)
        try:
            out, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.send_signal(signal.SIGABRT)
            stuck, _ = server.communicate(timeout=10)
            pytest.fail(f"mem serve did not stop within 30 s of signal {signum}:\n{''.join(lines)}{stuck[-8000:]}")
    finally:
        server.kill()
    assert server.returncode == 0, out
    assert "mem serve: 0 predictions" in out and "Traceback" not in out


def test_serve_stopped_before_its_model_loaded_says_so(tmp_path, monkeypatch, capsys):
    from app.config import ServeConfig
    from app.live import model_slot, server

    monkeypatch.setattr(model_slot.ModelSlot, "load", lambda self: time.sleep(30))  # still loading at the end
    config = ServeConfig(model=tmp_path, source="synthetic:0.01", pub="tcp://127.0.0.1:*", duration_s=0.3)
    server.serve_live(config)
    out = capsys.readouterr().out
    assert f"the model {tmp_path} was still loading" in out and "mem serve: 0 predictions" in out


def mem_fails(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """``mem ARGS`` as a user runs it (``app.cli.main``), in this process: its exit status and stderr."""
    from app.cli import main

    monkeypatch.setattr(sys, "argv", ["mem", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("command", [("serve", "--pub", "tcp://127.0.0.1:*"), ("record", "--out", "corpus")])
def test_a_source_file_that_does_not_exist_is_called_missing(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = mem_fails(monkeypatch, capsys, *command, "--source", "missing.raw")
    assert (code, err) == (2, "error: source 'missing.raw': no such file or folder\n")


def test_ingest_of_ncars_class_folders_outside_a_split_folder_is_one_short_line(tmp_path, monkeypatch, capsys):
    for cls in ("cars", "background"):
        (tmp_path / "nc" / cls).mkdir(parents=True)
        dat_file(tmp_path / "nc" / cls / "0.dat", 0, 0.1, 100)
    code, err = mem_fails(
        monkeypatch, capsys, "ingest", str(tmp_path / "nc"), "--out", str(tmp_path / "c"), "--dataset", "ncars"
    )
    expected = f"{tmp_path / 'nc'}: holds cars/ and background/ directly; N-Cars wants them inside train/ and test/"
    assert (code, err) == (1, f"error: {expected}\n")
    assert expected not in capsys.readouterr().out  # said once


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["finetune", "--dataset", "sim", "--out", "X", "--labels", "0.1"],
            "--labels 0.1: use --label-fraction 0.1 (--labels names a folder of labelled captures)",
        ),
        (
            ["segment", "--dataset", "sim", "--out", "X", "--labels", "0.1"],
            "--labels 0.1: use --label-fraction 0.1 (--labels names a folder of labelled captures)",
        ),
        (
            ["bench", "cnn-reference", "--dataset", "sim", "--out", "X", "--labels", "0.1"],
            "--labels 0.1: use --label-fraction 0.1 (--labels names a folder of labelled captures)",
        ),
        (
            ["serve", "--source", "sim", "--window", "5000"],
            "--window 5000: use --window-events 5000 (the events of each window; --window-ms caps its time span)",
        ),
        (
            ["bench", "train", "--events", "3000"],
            "--events 3000: use --window-events 3000 (events per window, as mem serve --window-events)",
        ),
        (
            ["demo", "--out", "X", "--window"],
            "--window: use --viewer (--window-events is the events of mem serve's windows)",
        ),
        (
            ["bench", "live", "--model", "vit-b"],
            "--model vit-b: use --size vit-b (--model names a run or export directory elsewhere)",
        ),
        (
            ["serve", "--source", "sim", "--duration", "5"],
            "--duration 5: use --stop-after 5 (mem record --duration is the source's time, not the wall clock's)",
        ),
        (
            ["demo", "--out", "X", "--seeds", "0,1"],
            "--seeds 0,1: use --label-seeds 0,1 (the experiment's --seeds are its finetuning seeds)",
        ),
        (
            ["bench", "data", "--json", "out.json"],
            "--json out.json: use --json-out out.json (--json alone asks evaluate and inspect to print JSON)",
        ),
    ],
)
def test_an_old_spelling_of_a_renamed_flag_is_one_line_naming_the_new_one(args, message, tmp_path, monkeypatch, capsys):
    """Each flag means one thing in every command: --labels a folder, --label-fraction a fraction, --window-events
    a window's events, --viewer the demo's window. A script with an old spelling stops before it starts anything."""
    monkeypatch.chdir(tmp_path)
    args = [str(tmp_path / a) if a == "X" else a for a in args]
    assert mem_fails(monkeypatch, capsys, *args) == (2, f"error: {message}\n")
    assert list(tmp_path.iterdir()) == []


def test_loop_is_one_option_with_one_default_in_record_and_serve():
    """A file or corpus source plays once unless --loop, whichever command replays it (serve looped by default)."""
    from typer.main import get_command

    from recorders.config import LOOP_HELP

    commands = get_command(app).commands
    loops = [next(p for p in commands[name].params if p.name == "loop") for name in ("record", "serve")]
    assert [(p.opts, p.secondary_opts, p.default, p.help) for p in loops] == [
        (["--loop"], ["--no-loop"], False, LOOP_HELP)
    ] * 2
