"""Live-path benchmark (``mem bench live``): start-up, the server under a 30 Mev/s source, the viewer's frame rate.

0. Start-up: ``mem serve --source sim`` launched as users launch it (a subprocess, the export of the model
   below), ``STARTS`` times: seconds from the launch to the first sensor picture and to the first prediction on
   the socket, and the server's CPU seconds by then (the median of the starts).
1. Server: a random-init cpu-tiny classifier (96 x 96 input, patch 8, width 128, depth 4, heads 4; a 512 x 32
   tokenizer; ``--model vit-b`` for the paper's ViT-B/16 with an 8192 x 32 tokenizer, ``--device cuda`` on a GPU)
   exported to a temp dir, fed by an in-process source pushing 30 Mev/s of synthetic events in 2 ms
   batches. Measured: predictions/s, latency from the newest event's arrival to the published prediction
   (p50 / p95), the median latency in the first vs the last third of the run (flat = no backlog), skipped
   windows. A headless viewer (offscreen) is attached during the run.
2. Viewer: the same viewer fed at 100 frames/s with the server's messages (hist + tokens + pred, and stats),
   so its drawing capacity shows independently of the server: frames drawn per second and the CPU fraction
   of its GUI thread.

With ``variants``, first the predictor alone (``mem_core.inference.Predictor`` on the export above), once per variant
side by side: ``PREDICTOR_WARMUP`` then ``PREDICTOR_WINDOWS`` windows of 30 000 events on a 640 x 480 sensor, each
call's wall clock (p50 / p95, its result on the host) and the median of its stages. ``eager`` is the predictor as
``mem serve --eager`` builds it (bf16 autocast on a GPU; ``mem serve`` on a CPU); the switches, joined by ``+``:
``bf16-weights``, ``cuda-graph`` (both together: ``mem serve`` on a GPU). ``serve_with`` names the variant the server
part runs.

Prints a table and writes JSON rows ``{name, value, unit, target, ok}`` with ``--json-out``. The predictor alone needs no
sockets: pyzmq and the server are imported by the parts that use them, so a GPU machine without pyzmq can time it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from app.config import ServeConfig
from mem_core.events import SensorSize, make_events
from mem_core.fields import DEFAULT_WINDOW_EVENTS
from mem_core.inference import Predictor
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.protocol import decode, encode
from mem_core.representation import InputSpec
from mem_core.runs.export import export_random

MODELS = {  # random-init architectures to measure: the CPU preset and the paper's ViT-B/16 (+ tokenizers)
    "cpu-tiny": (
        ViTConfig(img_size=96, patch_size=8, embed_dim=128, depth=4, num_heads=4, drop_path=0.0),
        TokenizerConfig(img_size=96, num_tokens=512, num_layers=3, hidden_dim=48, num_resnet_blocks=1),
    ),
    "vit-b": (
        ViTConfig(drop_path=0.0),
        TokenizerConfig(),  # the paper's dVAE
    ),
}
SOURCE_RATE = 30e6  # events/s
STAGES = ("sensor", "preprocess", "model", "tokenizer", "publish")  # the server's per-window stages (stats messages)
SERVER_S = 24.0
WARMUP_S = 2.0  # measured from here on (model warm-up, the viewer connecting)
VIEWER_FEED_HZ = 100.0
VIEWER_S = 8.0
STARTS = 3
START_TIMEOUT_S = 120.0
BASELINE = "eager"  # the predictor as `mem serve --eager` builds it
PREDICTOR_SWITCHES = {"bf16-weights": "bf16_weights", "cuda-graph": "cuda_graph"}  # variant switch -> Predictor's
PREDICTOR_WARMUP = 8
PREDICTOR_WINDOWS = 200
PREDICTOR_SENSOR = SensorSize(480, 640)
PREDICTOR_EVENTS = DEFAULT_WINDOW_EVENTS


def predictor_switches(variant: str) -> dict[str, bool]:
    """The ``Predictor`` keyword arguments of ``variant``: none for ``BASELINE``, else its ``+``-joined switches."""
    names = [] if variant == BASELINE else variant.split("+")
    if unknown := [n for n in names if n not in PREDICTOR_SWITCHES]:
        raise ValueError(
            f"variant {variant!r}: unknown switch {unknown[0]!r}; the switches are {', '.join(PREDICTOR_SWITCHES)} "
            f"({BASELINE!r}: none)"
        )
    return {PREDICTOR_SWITCHES[n]: True for n in names}


def _viewer(endpoint: str, snapshot: Path, quit_after: float) -> subprocess.Popen:
    """``mem view`` as users start it, headless, saving a snapshot (+ what it showed as JSON) when it quits."""
    command = [sys.executable, "-m", "app.cli", "view", "--connect", endpoint]
    command += ["--snapshot", str(snapshot), "--quit-after", str(quit_after)]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _free_endpoint(context) -> str:
    import zmq

    probe = context.socket(zmq.PUB)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(0)
    return f"tcp://127.0.0.1:{port}"


def _export(tmp: Path, model: str) -> Path:
    arch, tokenizer = MODELS[model]
    spec = InputSpec(size=(arch.img_size, arch.img_size))
    return export_random(tmp / "export", architecture=arch, input_spec=spec, tokenizer=tokenizer)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_start(export: Path, device: str, starts: int = STARTS) -> dict:
    """Launch ``mem serve --source sim`` ``starts`` times; the medians of the seconds to the first ``sensor`` and
    ``pred`` messages and of the server's CPU seconds at the first ``pred``."""
    import zmq

    context = zmq.Context.instance()
    runs = []
    for _ in range(starts):
        endpoint = _free_endpoint(context)
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)  # before the launch: the server's first messages are not missed
        command = [sys.executable, "-m", "app.cli", "serve", "--model", str(export), "--source", "sim"]
        command += ["--pub", endpoint, "--device", device, "--stop-after", str(START_TIMEOUT_S)]
        started = time.monotonic()
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first: dict[str, float] = {}
        try:
            while "pred" not in first and time.monotonic() - started < START_TIMEOUT_S:
                if sub.poll(20):
                    topic = sub.recv_multipart()[0].decode()
                    first.setdefault(topic, time.monotonic() - started)
            first["cpu"] = _cpu_seconds(server.pid)
        finally:
            server.terminate()
            server.wait(30)
            sub.close(0)
        runs.append(first)
    return {key: float(np.median([r.get(key, np.nan) for r in runs])) for key in ("sensor", "pred", "cpu")}


def bench_predictor(export: Path, device: str, variants: tuple[str, ...]) -> dict[str, dict]:
    """The predictor alone under each of ``variants``, one after the other in this process: per variant the p50 and
    p95 of a window's call (ms), its result on the host, and the median ms of each stage."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    sensor, n = PREDICTOR_SENSOR, PREDICTOR_EVENTS
    windows = [
        make_events(
            np.sort(rng.integers(0, 50_000, n)),
            rng.integers(0, sensor.width, n),
            rng.integers(0, sensor.height, n),
            rng.integers(0, 2, n),
        )
        for _ in range(16)
    ]
    results = {}
    for variant in variants:
        predictor = Predictor(export, device=device, **predictor_switches(variant))
        predictor.warm_up()
        for i in range(PREDICTOR_WARMUP):
            predictor(windows[i % len(windows)], sensor)
        calls, stages = [], []
        for i in range(PREDICTOR_WINDOWS):
            start = time.perf_counter()
            out = predictor(windows[i % len(windows)], sensor)
            calls.append((time.perf_counter() - start) * 1e3)
            stages.append(out.stages_ms)
        results[variant] = {
            "p50": float(np.percentile(calls, 50)),
            "p95": float(np.percentile(calls, 95)),
            "graphed": predictor.graphed,
            "stages": {k: float(np.median([s[k] for s in stages])) for k in stages[0]},
        }
        del predictor
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def bench_server(
    tmp: Path,
    export: Path,
    device: str,
    viewer: bool = True,
    rate: float = SOURCE_RATE,
    variant: str = BASELINE,
) -> tuple[dict, list[list[bytes]]]:
    """Run the server on ``export`` (its predictor built as ``variant`` says) for ``SERVER_S`` under a source of
    ``rate`` events/s with a viewer attached (unless ``viewer`` is false); returns the numbers and a sample of
    published messages (for the viewer feed)."""
    import zmq

    from app.live.server import LiveServer
    from recorders.synthetic import SyntheticSource

    torch.set_num_threads(1)
    source = SyntheticSource(rate)
    context = zmq.Context.instance()
    # a port the server picks itself: a probed free port can be taken again before the server binds it; eager: the
    # server's own predictor is the baseline, another variant's is built here
    config = ServeConfig(model=export, pub="tcp://127.0.0.1:*", stats_interval_s=0.5, device=device, eager=True)
    predictor = None if variant == BASELINE else Predictor(export, device=device, **predictor_switches(variant))
    server = LiveServer(config, source=source, context=context, predictor=predictor)
    sample: list[list[bytes]] = []
    tap = context.socket(zmq.SUB)
    tap.setsockopt(zmq.SUBSCRIBE, b"")
    tap.connect(server.pub_endpoint)
    view_process = _viewer(server.pub_endpoint, tmp / "server-view.png", SERVER_S - 6) if viewer else None
    server.start()
    server.model_loaded.wait(START_TIMEOUT_S)  # measured from the model's first predictions on
    started = time.monotonic()
    mark = None  # (time, events delivered, predictions) once warmed up
    stages: list[dict[str, float]] = []  # each stats message's last window: ms per stage of the server
    while (now := time.monotonic()) - started < SERVER_S:
        if mark is None and now - started >= WARMUP_S:
            mark = (now, source.delivered, server.frames)
        if tap.poll(100):
            message = tap.recv_multipart()
            if len(sample) < 400:
                sample.append(message)
            if message[0] == b"stats" and mark is not None:
                stages.append(decode(message).header.get("stages_ms") or {})
    end = (time.monotonic(), source.delivered, server.frames)
    server.stop()
    tap.close(0)
    if view_process is not None:
        view_process.wait(30)
    span = end[0] - mark[0]
    latencies = np.array([lat for t, lat in server.latencies if mark[0] <= t <= end[0]]) * 1e3
    thirds = np.array_split(latencies, 3)
    view = json.loads((tmp / "server-view.json").read_text()) if viewer else {"frames_shown": 0, "elapsed_s": 1.0}
    return {
        "source_rate": (end[1] - mark[1]) / span,
        "predictions_per_s": (end[2] - mark[2]) / span,
        "p50": float(np.percentile(latencies, 50)),
        "p95": float(np.percentile(latencies, 95)),
        "first_third_p50": float(np.median(thirds[0])),
        "last_third_p50": float(np.median(thirds[-1])),
        "skipped": server.skipped_windows,
        "viewer_fps_live": view["frames_shown"] / max(view["elapsed_s"], 1e-9),
        "stages": {
            key: float(np.median([s[key] for s in stages if key in s]))
            for key in STAGES
            if any(key in s for s in stages)
        },
    }, sample


def bench_viewer(tmp: Path, sample: list[list[bytes]]) -> dict:
    """Feed a headless viewer ``VIEWER_FEED_HZ`` frames/s for ``VIEWER_S``; frames drawn/s and GUI CPU share."""
    topics = (b"sensor", b"hist", b"tokens", b"pred", b"stats")
    frames = {topic: [m for m in sample if m[0] == topic] for topic in topics}
    import zmq

    context = zmq.Context.instance()
    pub = context.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    viewer = _viewer(f"tcp://127.0.0.1:{port}", tmp / "feed-view.png", VIEWER_S + 4)
    seq = dict.fromkeys(frames, 0)
    stop = threading.Event()

    def send(topic: bytes, index: int) -> None:
        message = decode(frames[topic][index % len(frames[topic])])
        header = {k: v for k, v in message.header.items() if k not in ("version", "topic", "seq", "t_sent", "buffers")}
        pub.send_multipart(encode(topic.decode(), seq[topic], message.arrays, **header))
        seq[topic] += 1

    def feed() -> None:
        start, i = time.monotonic(), 0
        while not stop.is_set():
            for topic in (b"sensor", b"hist", b"tokens", b"pred"):  # what the server sends per window
                send(topic, i)
            if i % 50 == 0:
                send(b"stats", i // 50)
            i += 1
            time.sleep(max(0.0, start + i / VIEWER_FEED_HZ - time.monotonic()))

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    viewer.wait(VIEWER_S + 40)
    stop.set()
    feeder.join()
    pub.close(0)
    view = json.loads((tmp / "feed-view.json").read_text())
    return {"fps": view["frames_shown"] / max(view["elapsed_s"], 1e-9), "busy": view["gui_busy_fraction"]}


def main(
    json_path: Path | None = None,
    model: str = "cpu-tiny",
    device: str = "cpu",
    viewer: bool = True,
    rate: float = SOURCE_RATE,
    starts: int = STARTS,
    variants: tuple[str, ...] = (),
    serve_with: str = BASELINE,
    server: bool = True,
) -> list[dict]:
    """Run both parts (the server alone without ``viewer``: a headless GPU machine without Qt), print the table,
    write JSON rows if ``json_path``; returns the rows. ``rate``: the in-process source's events/s (compare rates to
    see what the source costs the server's latency); ``starts``: ``mem serve`` launches timed (0: none);
    ``variants``: the predictor alone under each, the first the others' reference; ``serve_with``: the variant the
    server runs; ``server``: false leaves the server and the viewer out."""
    from rich.console import Console
    from rich.table import Table

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {sorted(MODELS)}")
    for variant in (*variants, serve_with):
        predictor_switches(variant)  # an unknown switch fails before the work
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        export = _export(tmp, model)
        alone = bench_predictor(export, device, variants) if variants else {}
        start = bench_start(export, device, starts) if starts and server else None
        served, sample = bench_server(tmp, export, device, viewer, rate, serve_with) if server else (None, [])
        drawn = bench_viewer(tmp, sample) if viewer and server else None
    rows = []
    reference = variants[0] if variants else None
    for variant, r in alone.items():
        rows += [
            (f"predictor {variant}: call p50", r["p50"], "ms", None, True),
            (f"predictor {variant}: call p95", r["p95"], "ms", None, True),
            *((f"predictor {variant}: stage {k}, p50", v, "ms", None, True) for k, v in r["stages"].items()),
        ]
        if variant != reference:
            rows += [
                (f"predictor call {p}, {variant} / {reference}", r[p] / alone[reference][p], "x", None, True)
                for p in ("p50", "p95")
            ]
        if "cuda_graph" in predictor_switches(variant) and device.startswith("cuda"):
            rows.append((f"predictor {variant}: replays a CUDA graph", float(r["graphed"]), "", "1", r["graphed"]))
    if start is not None:
        rows += [
            ("start: first sensor picture", start["sensor"], "s", None, True),
            ("start: first prediction", start["pred"], "s", "<= 3", start["pred"] <= 3),
            ("start: server CPU by then", start["cpu"], "s", None, True),
        ]
    if served is not None:
        growth = served["last_third_p50"] - served["first_third_p50"]
        rows += [
            (
                "source rate",
                served["source_rate"] / 1e6,
                "Mev/s",
                f">= {rate / 1e6:g}",
                served["source_rate"] >= 0.97 * rate,
            ),
            ("predictions/s", served["predictions_per_s"], "1/s", ">= 30", served["predictions_per_s"] >= 30),
            ("latency p50", served["p50"], "ms", None, True),
            ("latency p95", served["p95"], "ms", "<= 50", served["p95"] <= 50),
            ("latency p50, first third", served["first_third_p50"], "ms", None, True),
            ("latency p50, last third", served["last_third_p50"], "ms", "first third + 5", growth <= 5),
            ("skipped windows", served["skipped"], "windows", None, True),
            *((f"window stage: {k}, p50", v, "ms", None, True) for k, v in served["stages"].items()),
        ]
    if drawn is not None:
        rows += [
            ("viewer fps, live (= server rate)", served["viewer_fps_live"], "fps", None, True),
            (f"viewer fps, fed {VIEWER_FEED_HZ:g}/s", drawn["fps"], "fps", ">= 60", drawn["fps"] >= 60),
            ("viewer GUI thread busy", 100 * drawn["busy"], "%", "<= 50", drawn["busy"] <= 0.5),
        ]
    results = [{"name": n, "value": float(v), "unit": u, "target": t, "ok": bool(ok)} for n, v, u, t, ok in rows]
    how = f", server: {serve_with}" if server else ""
    table = Table(title=f"mem bench live: {model} on {device} ({os.cpu_count()} CPUs, torch threads 1{how})")
    for column in ("name", "value", "unit", "target", "ok"):
        table.add_column(column)
    for r in results:
        table.add_row(r["name"], f"{r['value']:.2f}", r["unit"], r["target"] or "", "yes" if r["ok"] else "NO")
    Console().print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
    return results
