"""Deployment benchmark (``mem bench deploy``): the live path with torch against the ONNX model in onnxruntime (the
input in numpy), side by side in one run, at the ``cpu-small`` and ViT-B/16 sizes (random weights, with the
tokenizer the token overlay runs).

1. Start: ``mem serve --model M --source SOURCE --threads 2`` launched as users launch it, ``STARTS`` times per
   runtime, alternating: seconds from the launch to the first published prediction, the server's CPU seconds by then
   and its peak memory (``VmHWM``, resident set); the medians. ``SOURCE`` stands for the camera a board serves: it
   streams events without the simulator, whose compiled kernels (numba: about 1 s and 60 MB) a board does not load.
2. Per window: the predictor alone (``Predictor``, ``OnnxPredictor``; model, tokenizer and preprocessing) on 30 000-event
   windows of a 640 x 480 sensor, on 1 and 2 threads, in alternating rounds: p50 / p95 of a call, and the ratios.
3. int8: onnxruntime's dynamic quantization of the model's MatMul and Gemm weights (a quantized convolution,
   ConvInteger, runs slower than the float one on a CPU): its per-window p50 / p95; with ``trained`` (a finetune run
   on N-Cars) top-1 on ``ncars-dev/test`` of torch, the ONNX model and its int8 version, each window through its
   whole live path.

Prints a table and writes JSON rows ``{name, value, unit, target, ok}`` with ``--json-out``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mem_core import shared_data_dir
from mem_core.configuration import from_dict
from mem_core.events import SensorSize, center_window, make_events
from mem_core.fields import DEFAULT_WINDOW_EVENTS
from mem_core.inference import Predictor
from mem_core.io import read_events
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.onnx_inference import OnnxPredictor
from mem_core.representation import InputSpec
from mem_core.runs.export import export_random
from mem_core.runs.export.onnx import export_onnx
from mem_core.runs.onnx_model import ONNX_MODEL_FILE, ONNX_TOKENIZER_FILE
from mem_core.train.configs import stage_config

SIZES = ("cpu-small", "vit-b")
STARTS = 3
START_TIMEOUT_S = 300.0  # a loaded machine: torch imports for minutes
SOURCE = "synthetic:2"  # 2 million events/s: a camera's stand-in (see the module docstring)
THREADS = (1, 2)
ROUNDS, WARMUP = 4, 8
ROUND_WINDOWS = {"cpu-small": 40, "vit-b": 10}  # timed windows per runtime and thread count: 4 alternating rounds
SENSOR = SensorSize(480, 640)
WINDOW_EVENTS = DEFAULT_WINDOW_EVENTS
TARGET_START_S, TARGET_MEMORY_MB, TARGET_RATIO = 1.0, 200.0, 0.6
MAX_ACCURACY_LOSS = 0.005  # int8 is kept as an option only if it loses at most this much top-1 and is faster


def model_of(size: str) -> tuple[ViTConfig, InputSpec, TokenizerConfig]:
    """The random-init architecture, input and tokenizer of ``size``: the ``cpu-small`` preset's, or the paper's
    ViT-B/16 and dVAE at 224 x 224."""
    if size == "vit-b":
        return ViTConfig(drop_path=0.0), InputSpec(), TokenizerConfig()
    finetune, tokenizer = stage_config("finetune", preset=size), stage_config("tokenizer", preset=size)
    side = finetune.input.size[0]
    arch = replace(finetune.model, img_size=side, drop_path=0.0)
    return arch, finetune.input, replace(tokenizer.model, img_size=side)


def exports(root: Path, size: str) -> dict[str, Path]:
    """The model of ``size`` as a torch export, an ONNX export and its int8 version."""
    arch, spec, tokenizer = model_of(size)
    torch_export = export_random(root / f"{size}-torch", architecture=arch, input_spec=spec, tokenizer=tokenizer)
    export_onnx(torch_export, root / f"{size}-onnx")
    return {
        "torch": torch_export,
        "onnx": root / f"{size}-onnx",
        "int8": quantize(root / f"{size}-onnx", root / f"{size}-int8"),
    }


def quantize(folder: Path, out: Path) -> Path:
    """The ONNX export ``folder`` with its model's MatMul / Gemm weights in int8 (onnxruntime's dynamic
    quantization), its tokenizer as it was."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # its advice to run its shape pre-processing first: measured without
    out.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(
        folder / ONNX_MODEL_FILE,
        out / ONNX_MODEL_FILE,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Gemm"],
    )
    if (folder / ONNX_TOKENIZER_FILE).exists():
        (out / ONNX_TOKENIZER_FILE).write_bytes((folder / ONNX_TOKENIZER_FILE).read_bytes())
    return out


def proc_status(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak resident MB) of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    peak_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return cpu, peak_kb / 1024


def start_once(model: Path) -> dict[str, float]:
    """One launch of ``mem serve --model model --source SOURCE --threads 2``: seconds to the first ``pred`` message, the
    server's CPU seconds and peak MB then."""
    import zmq

    context = zmq.Context.instance()
    probe = context.socket(zmq.PUB)
    endpoint = f"tcp://127.0.0.1:{probe.bind_to_random_port('tcp://127.0.0.1')}"
    probe.close(0)
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"pred")
    sub.connect(endpoint)  # before the launch: the first prediction is not missed
    command = [sys.executable, "-m", "app.cli", "serve", "--model", str(model), "--source", SOURCE, "--threads", "2"]
    started = time.monotonic()
    server = subprocess.Popen(
        [*command, "--pub", endpoint, "--stop-after", str(START_TIMEOUT_S)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first = sub.poll(int(START_TIMEOUT_S * 1000))
        seconds = time.monotonic() - started
        cpu, peak = proc_status(server.pid)
    finally:
        server.kill()  # measured: nothing of its ending counts
        server.wait(30)
        sub.close(0)
    if not first:
        raise RuntimeError(f"mem serve --model {model} published no prediction within {START_TIMEOUT_S:g} s")
    return {"first_pred_s": seconds, "cpu_s": cpu, "peak_mb": peak}


def bench_starts(models: dict[str, Path], starts: int) -> dict[str, dict[str, float]]:
    """The medians of ``starts`` launches per runtime, launched in turn."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    for _ in range(starts):
        for name, model in models.items():
            runs[name].append(start_once(model))
    return {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in runs.items()}


def synthetic_windows(n: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        make_events(
            np.sort(rng.integers(0, 50_000, WINDOW_EVENTS)),
            rng.integers(0, SENSOR.width, WINDOW_EVENTS),
            rng.integers(0, SENSOR.height, WINDOW_EVENTS),
            rng.integers(0, 2, WINDOW_EVENTS),
        )
        for _ in range(n)
    ]


def bench_windows(models: dict[str, Path], threads: int, per_round: int) -> dict[str, dict[str, float]]:
    """p50 / p95 ms of a window's call per runtime on ``threads`` threads, in alternating rounds."""
    torch.set_num_threads(threads)
    predictors: dict[str, Callable] = {
        name: Predictor(model) if name == "torch" else OnnxPredictor(model, threads=threads)
        for name, model in models.items()
    }
    windows = synthetic_windows()
    times: dict[str, list[float]] = {name: [] for name in predictors}
    for predictor in predictors.values():
        for i in range(WARMUP):
            predictor(windows[i % len(windows)], SENSOR)
    for _ in range(ROUNDS):
        for name, predictor in predictors.items():
            for i in range(per_round):
                start = time.perf_counter()
                predictor(windows[i % len(windows)], SENSOR)
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: {"p50": float(np.percentile(t, 50)), "p95": float(np.percentile(t, 95))} for name, t in times.items()}


def bench_accuracy(trained: Path, root: Path, limit: int | None) -> dict[str, float]:
    """top-1 on ``ncars-dev/test`` of the finetune run ``trained`` with torch, as ONNX and as int8 ONNX."""
    onnx = root / "trained-onnx"
    export_onnx(trained, onnx)
    predictors = {
        "torch": Predictor(trained),
        "onnx": OnnxPredictor(onnx, threads=1),
        "int8": OnnxPredictor(quantize(onnx, root / "trained-int8"), threads=1),
    }
    classes = predictors["torch"].classes
    test = shared_data_dir() / "ncars-dev" / "test"
    files = [(f, classes.index(c)) for c in classes for f in sorted((test / c).glob("*.dat"))]
    if limit is not None:
        files = files[:: max(1, len(files) // limit)]
    right = dict.fromkeys(predictors, 0)
    n_max = from_dict(InputSpec, predictors["torch"].meta["input"]).n_max
    for k, (file, label) in enumerate(files):
        events, sensor = read_events(file)
        window = center_window(events, n_max)
        for name, predictor in predictors.items():
            right[name] += int(np.argmax(predictor(window, sensor).probs) == label)
        if k % 200 == 0:
            print(f"  accuracy: {k} of {len(files)} test samples", file=sys.stderr, flush=True)
    return {**{name: r / len(files) for name, r in right.items()}, "n": len(files)}


def main(
    json_path: Path | None = None,
    sizes: tuple[str, ...] = SIZES,
    starts: int = STARTS,
    trained: Path | None = None,
    accuracy_samples: int | None = None,
    threads_list: tuple[int, ...] = THREADS,
) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for size in sizes:
            print(f"{size}: exporting (torch, ONNX, int8)", file=sys.stderr, flush=True)
            models = exports(root, size)
            fp = {k: models[k] for k in ("torch", "onnx")}
            if starts:
                print(f"{size}: {starts} starts per runtime", file=sys.stderr, flush=True)
                started = bench_starts(fp, starts)
                for name, r in started.items():
                    small = size == "cpu-small" and name == "onnx"
                    rows += [
                        (
                            f"{size} {name}: start to first prediction",
                            r["first_pred_s"],
                            "s",
                            f"<= {TARGET_START_S:g}" if small else None,
                            r["first_pred_s"] <= TARGET_START_S or not small,
                        ),
                        (f"{size} {name}: server CPU by then", r["cpu_s"], "s", None, True),
                        (
                            f"{size} {name}: peak memory",
                            r["peak_mb"],
                            "MB",
                            f"<= {TARGET_MEMORY_MB:g}" if small else None,
                            r["peak_mb"] <= TARGET_MEMORY_MB or not small,
                        ),
                    ]
                rows.append(
                    (
                        f"{size}: start, onnx / torch",
                        started["onnx"]["first_pred_s"] / started["torch"]["first_pred_s"],
                        "x",
                        None,
                        True,
                    )
                )
                rows.append(
                    (
                        f"{size}: memory, onnx / torch",
                        started["onnx"]["peak_mb"] / started["torch"]["peak_mb"],
                        "x",
                        None,
                        True,
                    )
                )
            for threads in threads_list:
                print(f"{size}: windows on {threads} thread(s)", file=sys.stderr, flush=True)
                timed = bench_windows(models, threads, ROUND_WINDOWS[size])
                for name, r in timed.items():
                    rows += [
                        (f"{size} {name}: window p{p}, {threads} thread(s)", r[f"p{p}"], "ms", None, True)
                        for p in (50, 95)
                    ]
                for name in ("onnx", "int8"):
                    ratio = timed[name]["p50"] / timed["torch"]["p50"]
                    target = f"<= {TARGET_RATIO:g}" if name == "onnx" else None
                    rows.append(
                        (
                            f"{size}: window p50 {name} / torch, {threads} thread(s)",
                            ratio,
                            "x",
                            target,
                            ratio <= TARGET_RATIO or name != "onnx",
                        )
                    )
                ratio = timed["int8"]["p50"] / timed["onnx"]["p50"]
                rows.append((f"{size}: window p50 int8 / onnx, {threads} thread(s)", ratio, "x", None, True))
        if trained is not None:
            print(f"top-1 on ncars-dev/test of {trained}", file=sys.stderr, flush=True)
            acc = bench_accuracy(trained, root, accuracy_samples)
            rows += [
                (f"trained: top-1 {name} ({acc['n']} test samples)", 100 * acc[name], "%", None, True)
                for name in ("torch", "onnx", "int8")
            ]
            loss = acc["onnx"] - acc["int8"]
            rows.append(
                (
                    "trained: top-1 lost by int8",
                    100 * loss,
                    "points",
                    f"<= {100 * MAX_ACCURACY_LOSS:g}",
                    loss <= MAX_ACCURACY_LOSS,
                )
            )
    results = [{"name": n, "value": float(v), "unit": u, "target": t, "ok": bool(ok)} for n, v, u, t, ok in rows]
    table = Table(title=f"mem bench deploy: torch against onnxruntime ({os.cpu_count()} CPUs)")
    for column in ("name", "value", "unit", "target", "ok"):
        table.add_column(column)
    for r in results:
        table.add_row(r["name"], f"{r['value']:.3g}", r["unit"], r["target"] or "", "yes" if r["ok"] else "NO")
    Console().print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
    return results
