"""A model deployed without torch: ``mem export --format onnx`` and ``mem serve --model model.onnx`` (onnxruntime, the
model input in numpy), as a board beside the camera runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from app.cli import app
from app.config import ServeConfig
from app.live.labelling import TrainingJob
from app.live.server import LiveServer
from app.viewer.client import LiveClient
from app.viewer.window import ViewerWindow
from mem_core.errors import RunError
from mem_core.events import SensorSize, center_window
from mem_core.inference import Predictor
from mem_core.io import read_events
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.onnx_inference import OnnxPredictor
from mem_core.representation import InputSpec, histograms_to_input, input_histogram
from mem_core.representation.numpy_input import count_histogram, window_input
from mem_core.runs.export import export_random, export_run, load_model
from mem_core.runs.export import onnx as onnx_export
from mem_core.runs.onnx_model import ONNX_MODEL_FILE, ONNX_TOKENIZER_FILE

ROOT = Path(__file__).resolve().parent.parent
ARCH = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0)
SPEC = InputSpec(n_max=3000, size=(32, 32), scale="log", crop="extent")  # the N-Cars recipe's input, small
TOKENIZER = TokenizerConfig(img_size=32, num_layers=3, num_tokens=64, hidden_dim=16)
START_S = 90.0
# An export through torch.onnx's dynamo tracer takes seconds a model: the tests of one are in the full tier only
EXPORTS = pytest.mark.slow


def ncars_files(data_dir: Path, n: int) -> list[Path]:
    files = sorted((data_dir / "ncars-dev" / "test" / "cars").glob("*.dat"))
    files += sorted((data_dir / "ncars-dev" / "test" / "background").glob("*.dat"))
    return files[:: max(1, len(files) // n)][:n]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, data_dir):
    """A tiny classifier with its tokenizer, as safetensors and as ONNX (made by ``mem export --format onnx``, checked
    on real N-Cars files), and the command's output."""
    root = tmp_path_factory.mktemp("onnx")
    torch_export = export_random(root / "torch", architecture=ARCH, input_spec=SPEC, tokenizer=TOKENIZER, window_ms=50)
    check = data_dir / "ncars-dev" / "val" / "cars"
    args = ["export", "--model", str(torch_export), "--out", str(root / "onnx"), "--format", "onnx"]
    result = CliRunner().invoke(app, [*args, "--check-data", str(check)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return torch_export, root / "onnx", result.output


@pytest.fixture(scope="module")
def segmenter(tmp_path_factory):
    """A tiny segmenter (3 classes) as safetensors and as ONNX."""
    root = tmp_path_factory.mktemp("onnx-seg")
    spec = InputSpec(n_max=3000, size=(32, 32))
    classes = ("background", "disc", "ring")
    torch_export = export_random(
        root / "torch", task="segmentation", classes=classes, architecture=ARCH, input_spec=spec, head_channels=8
    )
    onnx_export.export_onnx(torch_export, root / "onnx")
    return torch_export, root / "onnx"


# ------------------------------------------------------------------------------------------- the model input


@pytest.mark.parametrize(
    "spec",
    [
        SPEC,
        InputSpec(size=(64, 64)),  # the whole sensor, shrunk
        InputSpec(size=(96, 96), resize_to=(112, 140), channels="temporal"),  # grown in one side, then cropped
        InputSpec(size=(80, 200), channels="timestamp", hot_pixel_std=None),  # shrunk in one side, grown in the other
    ],
    ids=["extent-log", "sensor", "temporal-resize-crop", "timestamp-no-hot-pixels"],
)
def test_the_numpy_input_is_torchs_on_real_recordings(data_dir, spec):
    for file in ncars_files(data_dir, 6):
        events, sensor = read_events(file)
        events = center_window(events, 30_000)
        counts = input_histogram(events, sensor, spec.channels, spec.temporal_bins)
        assert np.array_equal(count_histogram(events, sensor, spec.channels, spec.temporal_bins), counts), file
        expected = histograms_to_input(torch.from_numpy(counts)[None], spec, train=False)[0].numpy()
        got, _ = window_input(counts, spec)
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6, err_msg=str(file))  # float32 rounding


@pytest.mark.parametrize("spec", [InputSpec(size=(64, 64)), InputSpec(size=(96, 96), resize_to=(112, 140))])
def test_the_numpy_input_is_torchs_on_a_vga_window(events_factory, spec):
    """A 640 x 480 camera's window: the resize's banded products reach every tap of torch's kernel."""
    sensor = SensorSize(480, 640)
    counts = input_histogram(events_factory(30_000, sensor, seed=3), sensor, spec.channels, spec.temporal_bins)
    expected = histograms_to_input(torch.from_numpy(counts)[None], spec, train=False)[0].numpy()
    np.testing.assert_allclose(window_input(counts, spec)[0], expected, rtol=0, atol=1e-6)


def test_the_numpy_histogram_refuses_what_the_torch_one_refuses(events_factory):
    events = events_factory(100)
    events["x"][5] = 1000
    with pytest.raises(ValueError, match="1 of 100 events fall outside the sensor 48x32"):
        count_histogram(events, (32, 48))


# ----------------------------------------------------------------------------------------------- the export


@EXPORTS
def test_mem_export_onnx_writes_a_self_contained_model_checked_against_torch(exports):
    _, folder, output = exports
    assert sorted(p.name for p in folder.iterdir()) == ["model.json", ONNX_MODEL_FILE, ONNX_TOKENIZER_FILE]
    difference = float(re.search(r"largest logit difference (\S+) ", output).group(1))
    assert difference <= onnx_export.MAX_LOGIT_DIFFERENCE and "token ids 100.0% equal" in output
    model = onnx.load(folder / ONNX_MODEL_FILE)
    assert model.ir_version <= 10 and [(o.domain, o.version) for o in model.opset_import] == [("", 18)]
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param and not batch.dim_value  # dynamic batch
    assert not model.graph.initializer or all(not t.external_data for t in model.graph.initializer)
    meta = {p.key: json.loads(p.value) for p in model.metadata_props}
    assert meta["task"] == "classification" and meta["classes"] == ["background", "car"]
    assert meta["input"] == json.loads(json.dumps(SPEC.to_dict())) and meta["training_window"] == {
        "events": 3000,
        "ms": 50,
    }
    described = json.loads((folder / "model.json").read_text())
    assert described["format"] == "onnx" and described["classes"] == meta["classes"]
    assert described["input"] == meta["input"] and described["check"]["windows"] == 8
    tokenizer = onnx.load(folder / ONNX_TOKENIZER_FILE)
    assert [o.name for o in tokenizer.graph.output] == ["tokens"]


@EXPORTS
def test_the_onnx_predictor_gives_what_the_torch_predictor_gives_on_real_windows(exports, segmenter, data_dir):
    torch_export, folder, _ = exports
    pairs = [(Predictor(torch_export), OnnxPredictor(folder / ONNX_MODEL_FILE, threads=1))]
    pairs.append((Predictor(segmenter[0]), OnnxPredictor(segmenter[1], threads=1)))  # a folder names its model.onnx
    for file in ncars_files(data_dir, 6):
        events, sensor = read_events(file)
        events = center_window(events, SPEC.n_max)
        for reference, deployed in pairs:
            want, got = reference(events, sensor), deployed(events, sensor)
            # the published picture is float16: the inputs' float32 rounding may land a value one float16 step apart
            np.testing.assert_allclose(got.hist.astype(np.float32), want.hist.astype(np.float32), rtol=2**-10, atol=0)
            assert np.allclose(got.region, want.region)
            if want.probs is not None:
                np.testing.assert_allclose(got.probs, want.probs, atol=1e-5)
                assert np.array_equal(got.tokens, want.tokens) and got.tokens.dtype == np.int32
            else:
                assert np.array_equal(got.mask, want.mask) and got.mask.dtype == np.uint8
    deployed = pairs[0][1]
    assert deployed.token_grid == (4, 4) and deployed.num_tokens == 64 and deployed.training_window == (3000, 50.0)
    batch = np.random.default_rng(0).random((3, 2, 32, 32), np.float32)  # a batch at once, as other ONNX users run it
    logits = deployed.model.session.run(["logits"], {"input": batch})[0]
    with torch.inference_mode():
        expected = load_model(torch_export)[0](torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-5)


@EXPORTS
def test_an_onnx_model_that_differs_from_torch_is_not_written(exports, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "MAX_LOGIT_DIFFERENCE", 0.0)
    with pytest.raises(RunError, match=r"model\.onnx: onnxruntime's logits differ from torch's by .* not written"):
        onnx_export.export_onnx(exports[0], tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


@EXPORTS
def test_the_two_export_formats_keep_to_their_own_folders(exports, tmp_path):
    torch_export, folder, _ = exports
    with pytest.raises(RunError, match="holds a safetensors export"):
        onnx_export.export_onnx(torch_export, torch_export)
    with pytest.raises(RunError, match="holds an ONNX export"):
        export_run(torch_export, folder)
    with pytest.raises(RunError, match=r"an ONNX export: mem serve runs its model\.onnx with onnxruntime"):
        load_model(folder)


def edited(source: Path, out: Path, **metadata) -> Path:
    """``source`` with its metadata values replaced (None: removed), written to ``out``."""
    model = onnx.load(source)
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in metadata.items():
        props.pop(key) if value is None else props.update({key: json.dumps(value)})
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, out)
    return out


@EXPORTS
def test_a_bad_onnx_file_is_refused_in_one_line_naming_it(exports, tmp_path):
    good = exports[1] / ONNX_MODEL_FILE
    (tmp_path / "notes.onnx").write_text("not a model\n")
    other_input = {**SPEC.to_dict(), "size": [48, 48]}
    cases = {
        tmp_path / "notes.onnx": "not an ONNX model onnxruntime can run",
        tmp_path / "missing.onnx": "no such file",
        edited(good, tmp_path / "bare.onnx", task=None, classes=None): "no MEM metadata task, classes in the ONNX file",
        edited(
            good, tmp_path / "other.onnx", input=other_input
        ): r"input 'input' is tensor\(float\) \('batch', 2, 32, 32\), which does not fit its metadata's input",
        edited(
            good, tmp_path / "three.onnx", classes=["a", "b", "c"]
        ): "which does not fit a classification model of 3 classes",
        edited(good, tmp_path / "names.onnx", classes="car"): "classes",
    }
    tokenizer = exports[1] / ONNX_TOKENIZER_FILE
    for path, reason in cases.items():
        with pytest.raises(RunError) as caught:
            OnnxPredictor(path, tokenizer=tokenizer)
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and "\n" not in message and re.search(reason, message), message
    three = edited(tokenizer, tmp_path / "t.onnx", in_chans=3)
    with pytest.raises(RunError, match=f"^{re.escape(str(three))}: the tokenizer takes 3 input channels, the model"):
        OnnxPredictor(good, tokenizer=three)


# ------------------------------------------------------------------------------------------------ the board


def test_the_board_group_installs_no_torch():
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    names = {re.split(r"[<>=!~\[; ]", requirement)[0].lower() for requirement in groups["board"]}
    assert {"onnxruntime", "numpy", "pyzmq", "dv-processing", "h5py"} <= names
    assert not names & {"torch", "torchvision", "timm", "safetensors", "onnx", "onnxscript", "pyside6-essentials"}


def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "the board install is tested with uv (run the tests with `uv run pytest`)"
    return found


@pytest.mark.timeout(300)
def test_a_fresh_board_install_serves_the_onnx_model_to_the_viewer_without_torch(exports, tmp_path, data_dir, qtbot):
    """``uv sync --only-group board`` into a new environment, then ``mem serve --model model.onnx`` from it, as the
    README's "Deploy" says; the viewer draws its picture, token grid and top-k."""
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "board"), "VIRTUAL_ENV": ""}
    sync = subprocess.run(
        [uv(), "sync", "--only-group", "board", "--offline", "--quiet"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert sync.returncode == 0, sync.stderr
    python = str(tmp_path / "board" / "bin" / "python")
    for heavy in ("torch", "timm", "PySide6"):
        assert subprocess.run([python, "-c", f"import {heavy}"], capture_output=True).returncode != 0, heavy
    recording = ncars_files(data_dir, 1)[0]
    model = exports[1] / ONNX_MODEL_FILE
    command = [python, "-m", "app.cli", "serve", "--model", str(model), "--source", str(recording), "--loop"]
    serve = subprocess.Popen(
        [*command, "--pub", "tcp://127.0.0.1:*", "--stop-after", "120"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client = window = None
    try:
        line = serve.stdout.readline() + serve.stdout.readline()
        endpoint = re.search(r"publishing on (tcp://\S+),", line)
        assert endpoint, line
        client = LiveClient(endpoint.group(1))
        window = ViewerWindow(client)
        qtbot.addWidget(window)
        window.show()
        qtbot.waitUntil(lambda: window.view_state()["tokens"] is not None and bool(window.last_pred), timeout=60_000)
        state = window.view_state()
        assert state["prediction"]["top_k"][0]["name"] in ("background", "car")
        assert state["tokens"]["grid"] == [4, 4] and state["input"] == [32, 32]
        assert state["histogram"]["sensor"] == [100, 120] and state["histogram"]["lit_fraction"] > 0.01
    finally:
        if window is not None:
            window.close()
            client.close()
        serve.kill()
        serve.wait(10)
    assert "classification model ready" in serve.stdout.read()


# ------------------------------------------------------------------------------------------------ live features


def serve(model: Path, data_dir: Path, **config) -> LiveServer:
    """An in-process server of ``model`` replaying an N-Cars recording in a loop."""
    recording = ncars_files(data_dir, 1)[0]
    endpoints = {"pub": "tcp://127.0.0.1:*", "control": "tcp://127.0.0.1:*"}
    settings = ServeConfig(model=model, source=str(recording), loop=True, stats_interval_s=0.2, **endpoints, **config)
    return LiveServer(settings, torch_threads=1).start()


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(0.05)


@EXPORTS
def test_watch_serves_an_onnx_file_written_again(exports, tmp_path, data_dir):
    model = tmp_path / ONNX_MODEL_FILE
    shutil.copy(exports[1] / ONNX_MODEL_FILE, model)
    server = serve(model, data_dir, watch=True)
    try:
        wait_until(lambda: server.frames > 0, START_S, "a prediction")
        assert isinstance(server.predictor, OnnxPredictor) and server.predictor.tokenizer is None
        renamed = edited(model, tmp_path / "new.onnx", classes=["truck", "tree"])
        os.replace(renamed, model)  # as an export writes it: whole, at once
        wait_until(lambda: server.model.version == 2, 30, "the new model")
        assert server.predictor.classes == ["truck", "tree"]
    finally:
        server.stop()


@EXPORTS
def test_a_segmenter_in_onnx_draws_its_mask_in_the_viewer(segmenter, data_dir, qtbot):
    server = serve(segmenter[1] / ONNX_MODEL_FILE, data_dir)
    client = LiveClient(server.pub_endpoint)
    window = ViewerWindow(client)
    qtbot.addWidget(window)
    try:
        window.show()
        qtbot.waitUntil(lambda: window.view.mask is not None, timeout=60_000)
        assert window.view.mask.shape == (32, 32) and window.view_state()["prediction"]["task"] == "segmentation"
    finally:
        window.close()
        client.close()
        server.stop()


@pytest.mark.timeout(300)
def test_train_exports_onnx_for_a_server_serving_onnx(exports, tmp_path, data_dir, monkeypatch):
    """The Train run's model (here an export made beforehand: the training itself is the label loop's test) is
    exported to ONNX by ``mem export --format onnx`` in a child process, and the server swaps to it."""
    server = serve(exports[1], data_dir)
    run = tmp_path / "label-001"
    shutil.copytree(exports[0], run / "export")
    monkeypatch.setattr(TrainingJob, "command", lambda job: [sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: server.frames > 0, START_S, "a prediction")
        assert server.model.onnx
        job = TrainingJob(
            tmp_path / "labels", tmp_path, run, 1, lambda e: server.model.swap(e, keep_window=True), onnx=True
        )
        job.start()
        wait_until(lambda: not job.running, 240, "the ONNX export")
        assert job.status == "done", job.message
        assert job.export == run / "export-onnx" and (job.export / ONNX_MODEL_FILE).is_file()
        wait_until(lambda: server.model.version == 2, 30, "the trained model")
        assert isinstance(server.predictor, OnnxPredictor) and server.model.path == job.export
    finally:
        server.stop()
