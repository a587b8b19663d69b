"""Every path and text a user hands the ``mem`` commands is refused in one line naming it, exit status 2, with nothing
already written lost: configs (``--config``, ``--set``), source and endpoint texts, the files of runs and exports
(a FIFO where a file is read must not hang a command or ``mem serve --watch``), ``--resume`` of a damaged or foreign
run, ``--init`` at a run that is none to start from, and ``--out`` that cannot hold the output, for every command
that writes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import zmq
from conftest import synthetic_events
from forked import mem_forked

from mem_core.configuration import to_dict
from mem_core.corpus import CorpusWriter
from mem_core.events import SensorSize
from mem_core.io import write_events
from mem_core.models import MEMViT, ViTConfig
from mem_core.protocol import decode, encode_control
from mem_core.representation import InputSpec
from mem_core.runs.export import export_random
from mem_core.runs.rundir import RunDir, RunError, hold_run_dir, release_run_dir

DIGITS = "9" * 5000  # more than Python's int() converts (4300 digits)
TINY_ARCH = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0)
TINY = [
    *("--dataset", "sim", "--preset", "cpu-tiny"),
    *("--set", "epochs=1", "--set", "batch_size=8", "--set", "data.max_samples=16", "--set", "data.num_workers=0"),
    *("--set", "input.size=[32, 32]", "--set", "input.n_max=2000"),
    *("--set", "model.patch_size=8", "--set", "model.embed_dim=32", "--set", "model.depth=2"),
    *("--set", "model.num_heads=2"),
]


@pytest.fixture
def mem(monkeypatch, capsys):
    """``mem(*ARGS)``: ``mem ARGS`` run in this process as the ``mem`` script runs it: (exit status, stderr)."""
    from app.cli import main

    def run(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["mem", *args])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code
        return code, capsys.readouterr().err

    return run


def refused(outcome: tuple[int, str], naming: str) -> str:
    """The one ``error:`` line of a ``mem`` that ended with exit status 2; it must name ``naming``."""
    code, err = outcome
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert naming in lines[0], lines[0][:3000]
    return lines[0]


def mem_child(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``mem ARGS`` started as a user starts it, failed when it does not end within ``timeout`` (a hang); the other
    refusals that need a process of their own fork it (``forked.mem_forked``)."""
    try:
        return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mem {' '.join(a[:60] for a in args)} did not end within {timeout} s")


def one_error_line(done: subprocess.CompletedProcess, naming: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert naming in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative name -> digest): what a refused command must leave as it was."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ------------------------------------------------------------------------------------------- configs (item 6)


@pytest.mark.parametrize("kind", ["device", "directory", "too large"])
def test_config_option_that_is_no_config_file_is_one_line(tmp_path, mem, kind):
    """``--config /dev/zero`` read until the memory ran out, a directory was a traceback."""
    path = {"device": Path("/dev/zero"), "directory": tmp_path, "too large": tmp_path / "big.toml"}[kind]
    if kind == "too large":
        path.write_text("# " + "x" * (1 << 20) + "\n")
    line = refused(mem("finetune", *TINY, "--out", str(tmp_path / "run"), "--config", str(path)), str(path))
    assert {"device": "a character device", "directory": "a directory", "too large": "larger than"}[kind] in line
    assert not (tmp_path / "run").exists()


def test_config_option_on_a_fifo_is_one_line_not_a_hang(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    done = mem_forked("finetune", "--dataset", "sim", "--out", str(tmp_path / "run"), "--config", str(fifo))
    assert "not a regular file (a FIFO)" in one_error_line(done, str(fifo))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "model=" + "{a=" * 100_000 + "1" + "}" * 100_000], "--set model: nested deeper than 16 levels"),
        (["--set", "model.depth=" + DIGITS], "--set model.depth: an integer of more than 4300 digits"),
        (["--set", "a." * 100_000 + "b=1"], "a key of more than 16 parts"),
    ],
    ids=["deep value", "5000 digits", "deep key"],
)
def test_set_of_a_value_python_cannot_hold_is_one_line(tmp_path, mem, args, message):
    """A 100,000-deep ``--set`` ended in a RecursionError traceback."""
    refused(mem("finetune", *TINY, "--out", str(tmp_path / "run"), *args), message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("v = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than 16 levels"),
        ("[finetune]\nepochs = " + DIGITS + "\n", "an integer of more than 4300 digits"),
    ],
    ids=["100,000 deep", "5000 digits"],
)
def test_config_file_python_cannot_parse_is_one_line_naming_it(tmp_path, mem, text, message):
    config = tmp_path / "deep.toml"
    config.write_text(text)
    line = refused(mem("finetune", *TINY, "--out", str(tmp_path / "run"), "--config", str(config)), str(config))
    assert message in line


def test_a_huge_set_value_is_shown_shortened_not_repeated(tmp_path, mem):
    """A 240 KB value came back whole in the error, as --config's are not."""
    huge = "[" + ",".join(["1"] * 60_000) + "]"
    line = refused(mem("finetune", *TINY, "--out", str(tmp_path / "run"), "--set", f"lr={huge}"), "--set lr=[1,1")
    assert len(line) < 300 and "expected a number" in line
    line = refused(mem("finetune", *TINY, "--out", str(tmp_path / "run"), "--set", f"epochs={'9' * 50_000}x"), "epochs")
    assert len(line) < 300


@pytest.mark.parametrize(
    ("args", "naming"),
    [
        (["evaluate", "--dataset", "sim", "--batch-size", "0"], "--batch-size must be a number >= 1, got 0"),
        (["evaluate", "--dataset", "sim", "--batch-size", "-5"], "--batch-size must be a number >= 1, got -5"),
        (["evaluate", "--dataset", "ncars"], "the ncars dataset needs --data PATH"),
        (["finetune", *TINY, "--set", "device=tpu"], "device 'tpu' is none of auto, cpu, cuda, cuda:N"),
        (["finetune", *TINY, "--set", "device=cuda:0x"], "device 'cuda:0x' is none of"),
        (["serve", "--source", "sim", "--device", "tpu"], "device 'tpu' is none of"),
        (["bench", "live", "--rate", "0"], "--rate must be in (0, 1000], got 0.0"),  # the bounds the configs declare
        (["bench", "train", "--window-events", "0"], "--window-events must be in [1, 1000000], got 0"),
        (["bench", "deploy", "--starts", "-1"], "--starts must be a number >= 0, got -1"),
    ],
)
def test_a_user_s_mistake_in_a_number_a_dataset_or_a_device_is_one_line(tmp_path, mem, export_dir, args, naming):
    """They were tracebacks: a batch of 0 (or -5) to evaluate, a dataset without its folder, a device torch does not
    know."""
    args = [*args, "--out", str(tmp_path / "run")] if args[0] == "finetune" else args
    args = [*args, "--model", str(export_dir)] if args[0] == "evaluate" else args
    refused(mem(*args), naming)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_machine_without_a_gpu_is_one_line(tmp_path, mem):
    refused(mem("finetune", *TINY, "--set", "device=cuda", "--out", str(tmp_path / "run")), "has no CUDA GPU")


# ------------------------------------------------------------------------- source and endpoint texts (item 8)


@pytest.fixture
def corpus(tmp_path) -> Path:
    with CorpusWriter(tmp_path / "corpus") as writer:
        writer.add_recording("take", synthetic_events(1000), SensorSize(32, 48))
    return tmp_path / "corpus"


@pytest.mark.parametrize(
    ("options", "naming"),
    [
        (["--source", "{corpus}:" + DIGITS], "no recording '999"),
        (["--source", "synthetic:" + DIGITS], "synthetic:MEV_S takes a rate in (0, 1000] Mev/s"),
        (["--source", "synthetic:1e400"], "synthetic:MEV_S takes a rate"),
        (["--source", "dv+tcp://localhost:" + DIGITS], "port in 1..65535"),
        (["--source", "dv+tcp://localhost:\u00b2"], "port in 1..65535"),
        (["--source", "tcp://127.0.0.1:" + DIGITS], "expected tcp://HOST:PORT"),
        (["--source", "sim", "--publish", "tcp://127.0.0.1:" + DIGITS], "publish address"),
        (["--source", "sim", "--publish", DIGITS], "publish address"),
        (["--source", "sim", "--name", "a/b"], "without '/'"),
        (["--source", "sim", "--name", "take", "--out", "{corpus}"], "already holds a session named 'take'"),
    ],
    ids=[
        "corpus index",
        "synthetic digits",
        "synthetic inf",
        "dv port digits",
        "dv port superscript",
        "tcp port",
        "publish endpoint",
        "publish port",
        "name with /",
        "name taken",
    ],
)
def test_record_texts_python_cannot_convert_are_one_line(tmp_path, mem, corpus, options, naming):
    """``mem record --source "CORPUS:<5,000 digits>"`` ended in int()'s ValueError traceback; the other texts of
    the same family (ports, rates, names) as well, or were taken (a port of 5,000 digits published somewhere)."""
    options = [o.replace("{corpus}", str(corpus)) for o in options]
    out = tmp_path / "out"
    if "--out" not in options:
        options += ["--out", str(out)]
    before = snapshot(corpus)
    refused(mem("record", "--duration", "1", *options), naming)
    assert not (out / "manifest.json").exists() and snapshot(corpus) == before


@pytest.mark.parametrize("flag", ["--pub", "--control"])
def test_serve_endpoint_python_cannot_convert_is_one_line(tmp_path, mem, flag):
    refused(
        mem("serve", "--source", "sim", flag, "tcp://127.0.0.1:" + DIGITS, "--stop-after", "1"),
        f"{flag} 'tcp://127.0.0.1:999",
    )


def test_a_path_the_system_cannot_hold_is_one_line(tmp_path, mem):
    long = str(tmp_path / ("m" * 5000))
    refused(mem("evaluate", "--model", long, "--dataset", "sim"), long)


# --------------------------------------------------------------------- files of runs and exports (item 5)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    return export_random(
        tmp_path_factory.mktemp("export") / "export",
        architecture=TINY_ARCH,
        input_spec=InputSpec(n_max=2000, size=(32, 32)),
    )


def test_weights_larger_than_their_model_can_weigh_are_refused_before_a_byte_is_read(tmp_path, export_dir):
    """An 8 GiB sparse file as an export's weights was read whole (the server grew from 1.0 to 6.6 GB, a good export
    written meanwhile waited): the bound is what the model in model.json weighs, at 8 bytes a number."""
    import resource

    from mem_core.runs.export import load_model

    model = shutil.copytree(export_dir, tmp_path / "export")
    with open(model / "model.safetensors", "r+b") as f:
        f.truncate(1 << 30)  # sparse: no disk, 1 GiB to read
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RunError, match=r"model.safetensors: larger than \d+ bytes \(1073741824 bytes\), more than the "
                       r"model model.json describes can weigh"):  # fmt: skip
        load_model(model)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100_000  # KiB: nothing of it was read


def finetune_run(folder: Path) -> Path:
    run = RunDir.create(
        folder, "finetune", {"model": to_dict(TINY_ARCH), "input": to_dict(InputSpec(size=(32, 32)))}, resume=False
    )
    run.write_json("classes.json", {"classes": ["a", "b"]})
    run.save_checkpoint({"model": MEMViT(TINY_ARCH, 2).state_dict(), "epoch": 0}, best=True)
    return folder


def fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("command", "damaged"),
    [
        ("evaluate", "model.safetensors"),
        ("export", "classes.json"),
        ("export", "config.json"),
        ("export", "best.pt"),
        ("evaluate", "/dev/zero as model.safetensors"),
    ],
)
def test_a_fifo_or_device_in_place_of_a_model_file_is_one_line_not_a_hang(tmp_path, export_dir, command, damaged):
    """safetensors' loader (behind ``serve``, ``evaluate`` and ``export --model``) opened a FIFO and blocked for good,
    holding the GIL; a run's JSON files were read the same way."""
    if damaged.endswith("model.safetensors"):
        model = shutil.copytree(export_dir, tmp_path / "export")
        if damaged.startswith("/dev/zero"):
            (model / "model.safetensors").unlink()
            (model / "model.safetensors").symlink_to("/dev/zero")
        else:
            fifo_in_place_of(model / "model.safetensors")
        file = model / "model.safetensors"
    else:
        model = finetune_run(tmp_path / "run")
        file = model / damaged
        fifo_in_place_of(file)
    args = ["--dataset", "sim"] if command == "evaluate" else ["--out", str(tmp_path / "out")]
    start = mem_child if damaged.startswith("/dev/zero") else mem_forked  # evaluate's one start as a user's
    line = one_error_line(start(command, "--model", str(model), *args), str(file))
    assert "not a regular file (a FIFO)" in line or "not a regular file (a character device)" in line


def control_state(endpoint: str, timeout_s: float) -> dict | None:
    """The server's state from one control request, or None when no reply comes within ``timeout_s``."""
    socket = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    try:
        socket.send_multipart(encode_control(0, "state"))
        return decode(socket.recv_multipart()).header["state"] if socket.poll(timeout_s * 1000) else None
    finally:
        socket.close(0)


def free_port() -> int:
    socket = zmq.Context.instance().socket(zmq.REP)
    port = socket.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=40000)
    socket.close(0)
    return port


def test_serve_watch_keeps_serving_when_a_fifo_replaces_the_weights(tmp_path, export_dir):
    """A FIFO swapped in as the export's weights froze ``mem serve --watch`` for good: no messages, no control
    replies, SIGINT and SIGTERM ignored. It is a model that fails to load: reported, the served one kept."""
    model = shutil.copytree(export_dir, tmp_path / "export")
    port = free_port()
    control = f"tcp://127.0.0.1:{port + 1}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--model",
            str(model),
            "--watch",
            "--source",
            "synthetic:0.05",
            "--pub",
            f"tcp://127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        while (state := control_state(control, 2)) is None or not (state.get("model") or {}).get("version"):
            assert time.monotonic() < deadline and server.poll() is None, "the first model was never served"
        fifo_in_place_of(model / "model.safetensors")
        deadline = time.monotonic() + 60
        while "error" not in ((state := control_state(control, 10)) or {}).get("model", {}):
            assert state is not None, "mem serve stopped answering once a FIFO was its weights"
            assert time.monotonic() < deadline, f"the FIFO was never reported: {state}"
        assert "not a regular file (a FIFO)" in state["model"]["error"] and state["model"]["version"] == 1
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=90)
    finally:
        server.kill()
        server.wait()
    assert server.returncode == 0 and "Traceback" not in out, out[-3000:]


# ----------------------------------------------------------------------- --resume, --init and --out (item 10)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A finished tiny finetuning run, trained by ``mem finetune`` (in this process: the run is what is tested)."""
    from app.cli import main

    out = tmp_path_factory.mktemp("trained") / "run"
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as done:
        patch.setattr(sys, "argv", ["mem", "finetune", *TINY, "--out", str(out)])
        main()
    assert done.value.code == 0 and RunDir(out).finished
    return out


def edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def edit_checkpoint(change):
    def damage(run: Path) -> None:
        state = torch.load(run / "checkpoint.pt", weights_only=True)
        change(state)
        torch.save(state, run / "checkpoint.pt")

    return damage


def truncate(name: str):
    def damage(run: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: len(data) // 2])

    return damage


def other_models_checkpoint(run: Path) -> None:
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state["model"] = MEMViT(ViTConfig(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=2), 5).state_dict()
    torch.save(state, run / "checkpoint.pt")


@pytest.mark.parametrize(
    ("damage", "extra", "naming", "message"),
    [
        (truncate("checkpoint.pt"), [], "checkpoint.pt", "not a readable MEM checkpoint"),
        (truncate("config.json"), [], "config.json", "corrupt"),
        (lambda run: None, ["--set", "model.depth=3"], "run", "differs in model.depth (2 -> 3)"),
        (other_models_checkpoint, [], "checkpoint.pt", "does not hold this run's model"),
        (edit_checkpoint(lambda s: s.update(epoch=-5)), [], "checkpoint.pt", "does not hold this run's training"),
        (edit_checkpoint(lambda s: s.pop("optimizer")), [], "checkpoint.pt", "does not hold this run's optimizer"),
        (
            lambda run: (run / "metrics.jsonl").write_text('{"epoch": 0}\n[1, 2]\n'),
            [],
            "metrics.jsonl",
            "line 2 is no record of an epoch",
        ),
        (lambda run: edit_json(run / "config.json", lambda c: c.pop("config")), [], "config.json", "no 'config'"),
    ],
    ids=[
        "truncated checkpoint",
        "truncated config",
        "another model's settings",
        "another model's checkpoint",
        "edited epoch",
        "no optimizer",
        "edited metrics",
        "edited config",
    ],
)
def test_resume_of_a_damaged_or_foreign_run_is_one_line_and_keeps_the_run(
    tmp_path, mem, trained_run, damage, extra, naming, message
):
    run = shutil.copytree(trained_run, tmp_path / "run")
    damage(run)
    before = snapshot(run)
    line = refused(
        mem("finetune", *TINY, *extra, "--out", str(run), "--resume"), str(run if naming == "run" else run / naming)
    )
    assert message in line
    assert snapshot(run) == before


def test_resume_of_another_stage_s_run_is_one_line_and_keeps_the_run(tmp_path, mem, trained_run):
    run = shutil.copytree(trained_run, tmp_path / "run")
    before = snapshot(run)
    line = refused(
        mem("tokenizer", "--dataset", "sim", "--preset", "cpu-tiny", "--out", str(run), "--resume"), str(run)
    )
    assert "holds a 'finetune' run, not 'tokenizer'" in line and snapshot(run) == before


def pretraining_run(folder: Path, *, checkpoint: bool = True, model=None) -> Path:
    config = {"model": to_dict(TINY_ARCH) if model is None else model, "input": to_dict(InputSpec(size=(32, 32)))}
    run = RunDir.create(folder, "pretrain", config, resume=False)
    if checkpoint:
        run.save_checkpoint({"model": MEMViT(TINY_ARCH).state_dict(), "epoch": 0})
    return folder


@pytest.mark.parametrize(
    ("init", "message"),
    [
        (lambda tmp: finetune_run(tmp / "ft"), "is a 'finetune' run, not a pretraining run"),
        (lambda tmp: tmp / "nothing", "not a MEM run directory"),
        (lambda tmp: pretraining_run(tmp / "pre", checkpoint=False), "has no checkpoint.pt yet"),
        (lambda tmp: pretraining_run(tmp / "pre", model=7), "not a pretraining run's config (no model table)"),
        (lambda tmp: pretraining_run(tmp / "pre", model={"depth": "x"}), "model.depth: expected an integer"),
    ],
    ids=["finetune run", "no run", "no checkpoint", "no model table", "edited model"],
)
def test_init_at_a_run_that_is_no_pretraining_run_is_one_line(tmp_path, mem, init, message):
    path = init(tmp_path)
    line = refused(mem("finetune", *TINY, "--out", str(tmp_path / "run"), "--init", str(path)), str(path))
    assert message in line and not (tmp_path / "run").exists()


def unwritable() -> Path:
    """A folder no process may create, not even root's: sysfs refuses new entries."""
    return Path("/sys/mem-test-out")


@pytest.fixture
def out_paths(tmp_path) -> dict[str, Path]:
    (tmp_path / "a-file").write_text("kept")
    return {"file": tmp_path / "a-file", "long": tmp_path / ("o" * 5000), "unwritable": unwritable()}


COMMANDS_THAT_WRITE = {
    "record": ["record", "--source", "sim", "--duration", "1"],
    "ingest": ["ingest", "{events}"],
    "tokenizer": ["tokenizer", "--dataset", "sim", "--preset", "cpu-tiny"],
    "pretrain": ["pretrain", "--dataset", "sim", "--preset", "cpu-tiny", "--tokenizer", "{tmp}/tok"],
    "finetune": ["finetune", "--dataset", "sim", "--preset", "cpu-tiny"],
    "segment": ["segment", "--dataset", "sim", "--preset", "cpu-tiny"],
    "export": ["export", "--model", "{run}"],
    "train-labels": ["train-labels", "--labels", "{tmp}/labels", "--init", "{tmp}/pre"],
    "demo": ["demo"],
}


def test_ingest_or_record_into_a_run_or_an_export_is_refused_and_writes_nothing_there(tmp_path, mem, export_dir):
    """``mem ingest F --out RUN`` wrote a corpus (and its report) in among a run's files."""
    events = tmp_path / "events.npz"
    write_events(events, synthetic_events(100), SensorSize(32, 48))
    export = shutil.copytree(export_dir, tmp_path / "export")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"stage": "finetune", "config": {}}')
    for out, what in ((export, "an export (model.json)"), (run, "a run (config.json)")):
        before = snapshot(out)
        refused(mem("ingest", str(events), "--out", str(out)), f"{out}: holds {what}, not a corpus")
        refused(mem("record", "--source", str(events), "--out", str(out)), f"{out}: holds {what}, not a corpus")
        assert snapshot(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before)


@pytest.mark.parametrize("kind", ["file", "long", "unwritable"])
@pytest.mark.parametrize("command", COMMANDS_THAT_WRITE)
def test_out_that_cannot_hold_the_output_is_one_line_for_every_command(tmp_path, mem, out_paths, command, kind):
    events = tmp_path / "events.npz"
    write_events(events, synthetic_events(100), SensorSize(32, 48))
    run = finetune_run(tmp_path / "run")
    pretraining_run(tmp_path / "pre")
    args = [a.format(events=events, run=run, tmp=tmp_path) for a in COMMANDS_THAT_WRITE[command]]
    out = out_paths[kind]
    refused(mem(*args, "--out", str(out)), str(out))
    assert out_paths["file"].read_text() == "kept" and not unwritable().exists()


@pytest.mark.parametrize("kind", ["directory", "long", "unwritable"])
def test_bench_json_that_cannot_be_written_is_one_line_before_the_benchmark(tmp_path, mem, monkeypatch, kind):
    import bench.bench_data

    monkeypatch.setattr(bench.bench_data, "main", lambda *args: pytest.fail("the benchmark ran"))
    path = {"directory": tmp_path, "long": tmp_path / ("j" * 5000), "unwritable": unwritable() / "x.json"}[kind]
    refused(mem("bench", "data", "--json-out", str(path)), str(path))


def test_demo_fresh_deletes_only_a_folder_of_the_demo_s_own(tmp_path, mem):
    (tmp_path / "notes.txt").write_text("mine")
    line = refused(mem("demo", "--fresh", "--out", str(tmp_path)), str(tmp_path))
    assert "'notes.txt'" in line and (tmp_path / "notes.txt").read_text() == "mine"


A_RUN_WRITING = """
import sys
from mem_core.runs.rundir import RunDir
RunDir.create(sys.argv[1], "finetune", {"seed": 0}, resume=False)  # as every stage starts its run
print("running", flush=True)
sys.stdin.read()
"""


def test_a_second_run_into_the_out_of_a_running_one_is_one_line_and_leaves_it_alone(tmp_path, mem):
    """Two `mem finetune` 4 s apart with one --out both ended 0 with the config of one, the result of the other and
    their metrics interleaved: the second is refused while the first runs, as a corpus's second writer is."""
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-c", A_RUN_WRITING, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline() == "running\n"
        before = snapshot(out)
        line = refused(mem("finetune", *TINY, "--out", str(out)), str(out))
        assert f"another run is writing this directory (process {first.pid})" in line
        assert snapshot(out) == before
    finally:
        first.kill()
        first.wait()
    hold_run_dir(out)  # the lock went with the process that held it: the run can be resumed
    release_run_dir(out)


def test_runs_and_exports_are_written_as_the_umask_says(tmp_path, mem):
    """Written 0600 (``mkstemp``) while corpora were 0644, an export trained by one user could not be served by
    another."""
    mask = os.umask(0o027)
    try:
        run = finetune_run(tmp_path / "run")
        assert mem("export", "--model", str(run), "--out", str(tmp_path / "export"))[0] == 0
    finally:
        os.umask(mask)
    files = [p for folder in (run, tmp_path / "export") for p in folder.rglob("*") if p.is_file()]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o640" for p in files}


def test_resume_removes_what_a_write_killed_midway_left(tmp_path, mem, trained_run):
    run = shutil.copytree(trained_run, tmp_path / "run")
    (run / ".best.pt.k1ll3d00.tmp").write_bytes(b"PK\x03\x04 half a checkpoint")  # SIGKILL while best.pt was written
    assert mem("finetune", *TINY, "--out", str(run), "--resume")[0] == 0
    assert not list(run.glob(".*.tmp"))


# ------------------------------------------------------------------- a dataset's list and split files (item 5)


def nmnist_with_list(root: Path, line: str) -> Path:
    root.mkdir()
    write_events(root / "1.bin", synthetic_events(50, SensorSize(34, 34)), SensorSize(34, 34))
    (root / "train.txt").write_text(f"{line}\n")
    return root / "train.txt"


def test_a_class_in_a_dataset_list_file_python_cannot_convert_is_one_line_naming_it(tmp_path, mem):
    listed = nmnist_with_list(tmp_path / "nmnist", "1 " + DIGITS)
    args = ["--dataset", "nmnist", "--data", str(tmp_path / "nmnist"), *TINY[2:], "--out", str(tmp_path / "run")]
    assert "line 1: class '99999" in refused(mem("finetune", *args), str(listed))


def test_a_hand_edited_split_file_is_one_line_naming_it(tmp_path, mem):
    root = tmp_path / "ncaltech"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for k in range(3):
            write_events(root / cls / f"{k}.bin", synthetic_events(50, SensorSize(180, 240)), SensorSize(180, 240))
    (root / "mem-split.json").write_text('{"train": [["a/0.bin"]]}')
    args = ["--dataset", "ncaltech101", "--data", str(root), *TINY[2:], "--out", str(tmp_path / "run")]
    assert "not a split file" in refused(mem("finetune", *args), str(root / "mem-split.json"))


def test_a_dataset_list_file_that_is_a_fifo_is_one_line_not_a_hang(tmp_path):
    listed = nmnist_with_list(tmp_path / "nmnist", "1 1")
    fifo_in_place_of(listed)
    args = ["--dataset", "nmnist", "--data", str(tmp_path / "nmnist"), *TINY[2:], "--out", str(tmp_path / "run")]
    assert "not a regular file (a FIFO)" in one_error_line(mem_forked("finetune", *args), str(listed))
