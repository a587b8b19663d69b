"""Training throughput (``mem bench train``): steady-state images/s and step time of the tokenizer, pretraining and
finetuning at a preset's model size, peak GPU memory, and how fast the data loader feeds them.

Each stage runs its real training step (the stage's own ``step``: histogram -> input on the device, forward,
backward, gradient clipping, optimizer) on batches of synthetic 30 000-event windows already collated, so the step
measures the device alone; the data loader is measured on its own, with as many worker processes as the machine has
cores, reading the same windows from a corpus. If the loader's samples/s is below a stage's images/s, that stage
would wait for data. The device is synchronised only at the end of each timed stretch, as in training.

With ``--profile DIR`` each stage also runs a few steps under ``torch.profiler`` and writes where the time goes
(``DIR/<stage>-profile.txt``: the operators and kernels with the most device time, or CPU time on a CPU).

Run: ``uv run mem bench train [--device cuda] [--preset paper-ncars] [--compile] [--profile DIR] --json out.json``
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from mem_core.corpus import CorpusWriter
from mem_core.datasets.corpus import CorpusSource
from mem_core.events import SensorSize, make_events
from mem_core.export import export_tokenizer
from mem_core.models import DiscreteVAE
from mem_core.representation import collate_events, prepare_events
from mem_core.train.configs import stage_config
from mem_core.train.engine import train_one_epoch
from mem_core.train.finetune import FinetuneStage
from mem_core.train.fit import build_loader
from mem_core.train.pretrain import PretrainStage
from mem_core.train.rundir import RunDir
from mem_core.train.runtime import Runtime, setup_runtime
from mem_core.train.stage import Stage
from mem_core.train.tokenizer import TokenizerStage

SENSOR = SensorSize(480, 640)  # N-ImageNet's by default (--sensor): every preset resizes it to its input
CPU_BATCH = 64  # the largest default batch on a CPU, where the paper presets' GPU batches take minutes per step


def synthetic_windows(n: int, count: int, seed: int = 0, sensor: SensorSize = SENSOR) -> list[np.ndarray]:
    """``count`` windows of ``n`` uniform random events on ``sensor``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        t = np.sort(rng.integers(0, 50_000, n))
        out.append(
            make_events(t, rng.integers(0, sensor.width, n), rng.integers(0, sensor.height, n), rng.integers(0, 2, n))
        )
    return out


class _Batches:
    """The same collated batch over and over (a DataLoader stand-in of ``steps`` batches)."""

    def __init__(self, batch, steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __iter__(self):
        return iter([self.batch] * self.steps)

    def __len__(self) -> int:
        return self.steps


def bench_stage(
    stage_cls: type[Stage],
    cfg,
    run: RunDir,
    steps: int,
    warmup: int,
    profile: Path | None = None,
    sensor: SensorSize = SENSOR,
    events: int | None = None,
    **inputs,
) -> dict:
    """Images/s, ms per step and peak device memory of ``stage_cls``'s training step at ``cfg``'s size, on windows
    of ``events`` events (default: the input's ``n_max``) on ``sensor``; with ``profile``, a profile of a few more
    steps is written to ``profile/<stage>-profile.txt``."""
    cfg = stage_cls.configure(cfg)
    runtime = setup_runtime(cfg.device, cfg.amp, cfg.cpu_bf16)
    stage = stage_cls(cfg, runtime, run, **inputs)
    stage.classes = ["a", "b"]  # a classifier's head (the labels of the synthetic batch are all 0)
    stage.steps_per_epoch = steps
    torch.manual_seed(0)
    model = runtime.place(stage.build_model())
    train_model = torch.compile(model) if cfg.compile else model
    optimizer = stage.build_optimizer(model)
    events = events or cfg.input.n_max
    windows = [
        prepare_events(w, sensor, cfg.input, train=False)
        for w in synthetic_windows(events, cfg.batch_size, sensor=sensor)
    ]
    batch = (
        collate_events(windows, sensor).to(runtime.device, non_blocking=True),
        torch.zeros(cfg.batch_size, dtype=torch.long),
        None,
    )
    common = dict(
        model=train_model,
        optimizer=optimizer,
        runtime=runtime,
        epochs=1,
        grad_clip=cfg.grad_clip,
        accum_steps=cfg.accum_steps,
    )

    def stretch(n: int) -> float:
        start = time.perf_counter()
        train_one_epoch(
            loader=_Batches(batch, n),
            step_fn=lambda b, s: stage.step(train_model, b, 0, s),
            epoch=0,
            steps_per_epoch=n,
            **common,
        )
        if runtime.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if runtime.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    stretch(warmup)  # compilation, cuDNN autotuning, allocator warm-up
    seconds = stretch(steps)
    peak = torch.cuda.max_memory_allocated() / 2**30 if runtime.device.type == "cuda" else float("nan")
    if profile is not None:
        write_profile(profile / f"{stage_cls.name}-profile.txt", lambda: stretch(PROFILE_STEPS), runtime.device)
    return {
        "images_per_s": steps * cfg.batch_size / seconds,
        "step_ms": seconds / steps * 1e3,
        "peak_gib": peak,
        "events": events,
    }


PROFILE_STEPS = 3


def write_profile(path: Path, work, device: torch.device) -> None:
    """Run ``work`` under ``torch.profiler``; write its operators sorted by their own device (or CPU) time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        work()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{PROFILE_STEPS} steps on {device}\n" + prof.key_averages().table(sort_by=sort, row_limit=40))


LOADER_BATCH = 64  # the loader's per-sample cost hardly depends on the batch; small batches keep the corpus small
BATCHES_PER_WORKER = 4  # an epoch gives every worker this many batches, so all of them work at once


def bench_loader(cfg, workers: int, epochs: int = 2, sensor: SensorSize = SENSOR, events: int | None = None) -> float:
    """Samples/s of the training DataLoader (corpus windows, event augmentation, collation) with ``workers``.

    A DataLoader hands each batch to one worker: the corpus holds enough windows for ``BATCHES_PER_WORKER`` batches
    per worker and epoch (the 64 synthetic windows written over and over), so the rate is all the workers' and not
    one worker's, as it was when an epoch was a single batch."""
    batch = min(cfg.batch_size, LOADER_BATCH)
    count = max(1, workers) * BATCHES_PER_WORKER * batch
    events = events or cfg.input.n_max
    with tempfile.TemporaryDirectory(prefix="mem-bench-train-") as tmp:
        windows = synthetic_windows(events, min(count, 64), seed=1, sensor=sensor)
        with CorpusWriter(tmp, provenance={"source": "bench"}) as writer:
            writer.begin_recording("bench", sensor)
            for k in range(count):
                w = windows[k % len(windows)].copy()
                w["t"] += k * 50_000
                writer.append(w)
            writer.end_recording()
        source = CorpusSource(Path(tmp), "all", window=events)
        loader, sampler = build_loader(  # the training stages' own loader
            source,
            cfg.input,
            train=True,
            seed=0,
            batch_size=batch,
            runtime=Runtime(torch.device("cpu")),
            num_workers=workers,
        )
        seen, start = 0, None
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for events, _, _ in loader:
                if start is None:  # the first batch pays the workers' start
                    start = time.perf_counter()
                    continue
                seen += len(events)
        return seen / (time.perf_counter() - start)


def main(
    json_path: Path | None = None,
    preset: str = "cpu-tiny",
    device: str = "auto",
    compile_model: bool = False,
    batch_size: int | None = None,
    steps: int = 10,
    warmup: int = 3,
    profile: Path | None = None,
    sensor: SensorSize = SENSOR,
    events: int | None = None,
) -> list[dict]:
    """Run every stage's step and the loader on windows of ``events`` events (default: the preset's ``n_max``) on
    ``sensor``; print the table, write JSON rows if ``json_path``; return the rows."""
    dev = setup_runtime(device).device
    overrides = [f"device={dev.type}", f"compile={str(compile_model).lower()}", "data.num_workers=0"]
    configs = {}
    for stage in ("tokenizer", "pretrain", "finetune"):
        cfg = stage_config(stage, preset=preset, overrides=overrides)
        batch = batch_size or (cfg.batch_size if dev.type == "cuda" else min(cfg.batch_size, CPU_BATCH))
        configs[stage] = dataclasses.replace(cfg, batch_size=batch)
    measured = {}
    with tempfile.TemporaryDirectory(prefix="mem-bench-train-") as tmp:
        runs = {stage: RunDir(Path(tmp) / stage) for stage in configs}
        for run in runs.values():
            run.path.mkdir()
        # pretraining's targets come from a tokenizer: a random one of the preset's size, as an export
        tokenizer = export_tokenizer(
            DiscreteVAE(TokenizerStage.configure(configs["tokenizer"]).model), Path(tmp) / "tok"
        )
        window = {"sensor": sensor, "events": events}
        measured["tokenizer"] = bench_stage(
            TokenizerStage, configs["tokenizer"], runs["tokenizer"], steps, warmup, profile, **window
        )
        measured["pretrain"] = bench_stage(
            PretrainStage, configs["pretrain"], runs["pretrain"], steps, warmup, profile, **window, tokenizer=tokenizer
        )
        measured["finetune"] = bench_stage(
            FinetuneStage, configs["finetune"], runs["finetune"], steps, warmup, profile, **window
        )
    workers = os.cpu_count() or 1
    loader_events = events or configs["finetune"].input.n_max
    loader_rate = bench_loader(configs["finetune"], workers, sensor=sensor, events=loader_events)
    # what the windows were (a step's histogram costs grow with the events and the sensor): a stage's own n_max
    # unless --events, which can differ between stages
    size = f"{sensor.width}x{sensor.height}"
    rows = []
    for stage, r in measured.items():
        b, shape = configs[stage].batch_size, {"sensor": size, "events": r["events"]}
        rows += [
            {"name": f"{stage} images/s", "value": r["images_per_s"], "unit": "img/s", "batch": b, **shape},
            {"name": f"{stage} step", "value": r["step_ms"], "unit": "ms", "batch": b, **shape},
            *(
                [{"name": f"{stage} peak GPU memory", "value": r["peak_gib"], "unit": "GiB", "batch": b, **shape}]
                * (dev.type == "cuda")
            ),
            {
                "name": f"{stage}: loader / step rate",
                "value": loader_rate / r["images_per_s"],
                "unit": "x",
                "batch": b,
                **shape,
            },
        ]
    rows.append(
        {
            "name": f"data loader, {workers} workers",
            "value": loader_rate,
            "unit": "samples/s",
            "batch": None,
            "sensor": size,
            "events": loader_events,
        }
    )
    counts = sorted({r["events"] for r in rows})
    table = Table(
        title=f"mem bench train: {preset} on {dev} (compile={compile_model}, {steps} timed steps, "
        f"{'/'.join(map(str, counts))}-event windows on {sensor.width} x {sensor.height})"
    )
    for column in ("name", "value", "unit", "batch"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], f"{r['value']:.2f}", r["unit"], str(r["batch"] or ""))
    Console().print(table)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(rows, indent=2) + "\n")
    return rows
