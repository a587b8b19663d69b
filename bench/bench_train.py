"""Training throughput (``mem bench train``): steady-state images/s and step time of the tokenizer, pretraining and
finetuning at a preset's model size, peak GPU memory (allocated and reserved), and how fast the data loader feeds them.

Each stage runs its real training step (the stage's own ``step``: host-to-device copy of the collated windows,
histogram -> input on the device, forward, backward, gradient clipping, optimizer) on batches of synthetic
30 000-event windows already collated on the host (pinned on a GPU, as the DataLoader hands them over), so the step
measures the device and the copy; the data loader is measured on its own, with the workers the preset's training
would start (``data.num_workers``) and with one per core, reading the same windows from a corpus. If the loader's
samples/s is below a stage's images/s, that stage would wait for data. The device is synchronised only at the end of
each timed stretch, as in training. Pretraining's block masks are timed on their own: the training process makes
them in every step.

With ``--variants`` the stages run once per variant, side by side in one process: ``eager`` (the baseline: no
compilation, SDPA, fp32 targets) and variants that turn on ``+``-joined switches (``SWITCHES``): ``compile`` (the
whole model), ``blocks`` (``compile = "blocks"``), ``flex`` (``MEM_ATTENTION=flex``), ``bf16-targets``
(``MEM_BF16_TARGETS``). A variant measures the stages its switches change, and each of its rows names it, with the
ratio of its images/s to the first variant's.

With ``--profile DIR`` each stage also runs a few steps under ``torch.profiler`` and writes where the time goes
(``DIR/<stage>-profile.txt``: the operators and kernels with the most device time, or CPU time on a CPU). With
``sync_check`` (a GPU only) one more step of each stage runs under ``torch.cuda.set_sync_debug_mode("warn")``: every
call that makes the host wait for the GPU is counted, and listed with where it comes from in the JSON (a step should
make none; the epoch's own reads, every 0.5 s, are not part of it).

Run: ``uv run mem bench train [--device cuda] [--preset paper-ncars] [--compile | --variants eager,blocks,...]
[--profile DIR] --json-out out.json``
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from mem_core.corpus import CorpusWriter
from mem_core.datasets.corpus import CorpusSource
from mem_core.events import SensorSize, make_events
from mem_core.models import BlockMaskGenerator, DiscreteVAE, attention
from mem_core.representation import EventBatch, InputSpec, collate_events, prepare_events
from mem_core.runs.export import export_tokenizer
from mem_core.runs.rundir import RunDir
from mem_core.train.common import wrap_model
from mem_core.train.configs import stage_config
from mem_core.train.data import EpochStream, build_loader, loader_workers
from mem_core.train.engine import train_one_epoch
from mem_core.train.finetune import FinetuneStage
from mem_core.train.pretrain import PretrainStage
from mem_core.train.runtime import Runtime, setup_runtime
from mem_core.train.stage import Stage
from mem_core.train.tokenizer import TokenizerStage

SENSOR = SensorSize(480, 640)  # N-ImageNet's by default (--sensor): every preset resizes it to its input
STAGES = ("tokenizer", "pretrain", "finetune")
CPU_BATCH = 64  # the largest default batch on a CPU, where the paper presets' GPU batches take minutes per step
BASELINE = "eager"  # the variant without switches
SWITCHES = {  # a variant's switches, each with the stages it changes
    "compile": ("pretrain", "finetune"),
    "blocks": ("pretrain", "finetune"),
    "flex": ("pretrain", "finetune"),
    "bf16-targets": ("pretrain",),
}
EXCLUSIVE = ({"compile", "blocks"},)  # one of each at most


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


@functools.lru_cache(maxsize=4)
def collated_windows(events: int, count: int, sensor: SensorSize, spec: InputSpec) -> EventBatch:
    """``count`` synthetic windows of ``events`` events on ``sensor``, prepared for ``spec`` and collated: made once
    for all the variants of a stage (a paper batch takes seconds)."""
    windows = [prepare_events(w, sensor, spec, train=False) for w in synthetic_windows(events, count, sensor=sensor)]
    return collate_events(windows, sensor)


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
    sync_check: bool = False,
    **inputs,
) -> dict:
    """Images/s, ms per step and peak device memory of ``stage_cls``'s training step at ``cfg``'s size, on windows
    of ``events`` events (default: the input's ``n_max``) on ``sensor``; with ``profile``, a profile of a few more
    steps is written to ``profile/<stage>-profile.txt``; with ``sync_check`` on a GPU, the host waits of one more
    step (``syncs``); ``inputs`` go to the stage."""
    cfg = stage_cls.configure(cfg)
    runtime = setup_runtime(cfg.device, cfg.amp, cfg.cpu_bf16)
    stage = stage_cls(cfg, runtime, run, **inputs)
    stage.classes = ["a", "b"]  # a classifier's head (the labels of the synthetic batch are all 0)
    stage.steps_per_epoch = steps
    torch.manual_seed(0)
    model = stage.build_model()
    train_model = wrap_model(model, cfg, runtime)  # placed, and compiled as the config says (as training does)
    optimizer = stage.build_optimizer(model)
    events = events or cfg.input.n_max
    batch = (
        collated_windows(events, cfg.batch_size, sensor, cfg.input),
        torch.zeros(cfg.batch_size, dtype=torch.long),
        None,
    )
    if runtime.device.type == "cuda":  # on the host, page-locked, as the DataLoader hands batches to a GPU step
        batch = (batch[0].pin_memory(), batch[1].pin_memory(), None)
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

    cuda = runtime.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    stretch(warmup)  # compilation, cuDNN autotuning, allocator warm-up
    seconds = stretch(steps)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    reserved = torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan")
    if profile is not None:
        write_profile(profile / f"{stage_cls.name}-profile.txt", lambda: stretch(PROFILE_STEPS), runtime.device)
    result = {
        "images_per_s": steps * cfg.batch_size / seconds,
        "step_ms": seconds / steps * 1e3,
        "peak_gib": peak,
        "reserved_gib": reserved,
        "events": events,
    }
    if sync_check and cuda:
        result["syncs"] = host_waits(lambda: one_step(stage, train_model, model, optimizer, batch, cfg, runtime))
    return result


def one_step(stage: Stage, train_model, model, optimizer, batch, cfg, runtime: Runtime) -> None:
    """One training step as ``train_one_epoch`` takes it, without the epoch's own reads (progress, loss check)."""
    optimizer.zero_grad(set_to_none=True)
    with runtime.train_autocast():
        result = stage.step(train_model, batch, 0, 0)
    result.loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()


def host_waits(work: Callable[[], object]) -> list[str]:
    """The calls in ``work`` that make the host wait for the GPU (``torch.cuda.set_sync_debug_mode("warn")``), each as
    the innermost frames of MEM's code that led to it and torch's message."""
    waits: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        stack = traceback.extract_stack()[:-1]
        ours = [f for f in stack if ("mem_core" in f.filename or "bench" in f.filename) and f.name != "host_waits"]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-3:]))
        waits.append(f"{where or 'outside MEM'}: {str(message).splitlines()[0]}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # torch's notice that the debug mode is a prototype names synchronisation too; it is no wait
    return [w for w in waits if "synchroniz" in w.lower() and "prototype feature" not in w]


def bench_masks(cfg, repeats: int = 20) -> float:
    """Milliseconds the training process spends on one batch of ``cfg``'s pretraining block masks (the median)."""
    cfg = PretrainStage.configure(cfg)
    masks = BlockMaskGenerator(cfg.model.grid_size, cfg.mask_ratio, min_block=cfg.mask_min_block)
    masks.batch(1, np.random.default_rng(0))  # numba's compilation (or its cache) is not part of a step
    times = []
    for step in range(repeats):
        start = time.perf_counter()
        masks.batch(cfg.batch_size, np.random.default_rng([cfg.seed, 0, step, 0]))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


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
        return loader_samples_per_s(loader, sampler, epochs)


def loader_samples_per_s(loader, sampler, epochs: int, limit: int = 0) -> float:
    """Samples/s a training ``loader`` delivers over ``epochs`` epochs of its ``sampler`` (or until ``limit``
    samples, when given), read as the stages read it (``EpochStream``), not counting the first batch, which pays the
    workers' start."""
    stream = EpochStream(loader, sampler)
    seen, start = 0, None
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        for events, _, _ in stream:
            if start is None:
                start = time.perf_counter()
                continue
            seen += len(events)
            if 0 < limit <= seen:
                return seen / (time.perf_counter() - start)
    return seen / (time.perf_counter() - start) if start is not None and seen else float("inf")


def parse_variant(name: str) -> frozenset[str]:
    """The switches of variant ``name``: none for ``BASELINE``, else its ``+``-joined names of ``SWITCHES``."""
    switches = frozenset() if name == BASELINE else frozenset(name.split("+"))
    if unknown := sorted(switches - set(SWITCHES)):
        raise ValueError(
            f"variant {name!r}: unknown switch {unknown[0]!r}; the switches are {', '.join(SWITCHES)} "
            f"({BASELINE!r}: none)"
        )
    for pair in EXCLUSIVE:
        if pair <= switches:
            raise ValueError(f"variant {name!r}: {' and '.join(sorted(pair))} exclude each other")
    return switches


@contextlib.contextmanager
def variant_kernel(switches: frozenset[str]) -> Iterator[None]:
    """A GPU's training steps take the variant's attention kernel within; afterwards the kernel is restored, the
    compiled programs are forgotten (the next variant compiles its own, within dynamo's recompilation limit) and the
    memory of this one's models is given back."""
    before = attention.GPU_TRAINING_KERNEL
    attention.use_gpu_training_kernel("flex" if "flex" in switches else "sdpa")
    try:
        yield
    finally:
        attention.use_gpu_training_kernel(before)
        torch.compiler.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


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
    sync_check: bool = False,
    stages: tuple[str, ...] = STAGES,
    loader: bool = True,
    variants: tuple[str, ...] = (),
) -> list[dict]:
    """Run each of ``stages``' steps and (``loader``) the loader on windows of ``events`` events (default: the
    preset's ``n_max``) on ``sensor``; print the table, write JSON rows if ``json_path``; return the rows.
    ``sync_check``: on a GPU, count the host waits of one step per stage (module docstring). ``variants``: the
    stages once per variant (module docstring), the first one the others' reference; ``profile`` then holds a folder
    per variant."""
    if unknown := [s for s in stages if s not in STAGES]:
        raise ValueError(f"unknown stage {unknown[0]!r}: the stages are {', '.join(STAGES)}")
    if variants and compile_model:
        raise ValueError("compile_model and variants: name compile (or blocks) as a variant")
    plan = [(v, parse_variant(v)) for v in variants] or [(None, frozenset())]  # None: the process as it is set
    dev = setup_runtime(device).device
    overrides = [f"device={dev.type}", f"compile={str(compile_model).lower()}", "data.num_workers=0"]
    configs = {}
    for stage in STAGES:
        cfg = stage_config(stage, preset=preset, overrides=overrides)
        batch = batch_size or (cfg.batch_size if dev.type == "cuda" else min(cfg.batch_size, CPU_BATCH))
        configs[stage] = dataclasses.replace(cfg, batch_size=batch)
    measured: dict[tuple[int, str | None, str], dict] = {}  # (the variant's place in the plan, variant, stage)
    with tempfile.TemporaryDirectory(prefix="mem-bench-train-") as tmp:
        # pretraining's targets come from a tokenizer: a random one of the preset's size, as an export
        tokenizer = export_tokenizer(
            DiscreteVAE(TokenizerStage.configure(configs["tokenizer"]).model), Path(tmp) / "tok"
        )
        common = {"sensor": sensor, "events": events, "sync_check": sync_check}
        for place, (variant, switches) in enumerate(plan):
            compiled = "blocks" if "blocks" in switches else "compile" in switches or compile_model
            with variant_kernel(switches) if variant is not None else contextlib.nullcontext():
                for stage, stage_cls in zip(STAGES, (TokenizerStage, PretrainStage, FinetuneStage), strict=True):
                    changed = not switches or any(stage in SWITCHES[s] for s in switches)
                    if stage not in stages or not changed:
                        continue
                    inputs = {}
                    if stage == "pretrain":
                        inputs["tokenizer"] = tokenizer
                        if variant is not None:
                            inputs["bf16_targets"] = "bf16-targets" in switches
                    run = RunDir(Path(tmp) / f"{place}-{stage}")
                    run.path.mkdir()
                    measured[place, variant, stage] = bench_stage(
                        stage_cls,
                        dataclasses.replace(configs[stage], compile=compiled),
                        run,
                        steps,
                        warmup,
                        profile / variant if profile is not None and variant is not None else profile,
                        **common,
                        **inputs,
                    )
                    if compiled:  # the next stage's batch compiles static programs of its own, not dynamic ones
                        torch.compiler.reset()
                    done, label = measured[place, variant, stage], f"{variant} {stage}" if variant else stage
                    # as it comes: a run cut short by a time limit still says what it measured
                    print(f"{label}: {done['images_per_s']:.1f} img/s, {done['step_ms']:.1f} ms a step", flush=True)
    # what the windows were (a step's histogram costs grow with the events and the sensor): a stage's own n_max
    # unless --window-events, which can differ between stages
    size = f"{sensor.width}x{sensor.height}"
    loader_events = events or configs["finetune"].input.n_max
    trained_workers = loader_workers(stage_config("finetune", preset=preset).data.num_workers)  # what training starts
    loader_rates = {
        workers: bench_loader(configs["finetune"], workers, sensor=sensor, events=loader_events)
        for workers in (dict.fromkeys((trained_workers, os.cpu_count() or 1)) if loader else ())
    }
    rows = []

    def row(name: str, value: float, unit: str, batch: int | None, events: int, **extra) -> None:
        rows.append(
            {"name": name, "value": value, "unit": unit, "batch": batch, "sensor": size, "events": events, **extra}
        )

    reference = plan[0][0]
    for (place, variant, stage), r in measured.items():
        b, n = configs[stage].batch_size, r["events"]
        named = {} if variant is None else {"variant": variant}
        row(f"{stage} images/s", r["images_per_s"], "img/s", b, n, **named)
        row(f"{stage} step", r["step_ms"], "ms", b, n, **named)
        if dev.type == "cuda":
            row(f"{stage} peak GPU memory allocated", r["peak_gib"], "GiB", b, n, **named)
            row(f"{stage} peak GPU memory reserved", r["reserved_gib"], "GiB", b, n, **named)
        if place > 0 and (0, reference, stage) in measured:
            ratio = r["images_per_s"] / measured[0, reference, stage]["images_per_s"]
            row(f"{stage} images/s, {variant} / {reference}", ratio, "x", b, n, **named)
        if "syncs" in r:
            row(f"{stage}: host waits in one step", len(r["syncs"]), "", b, n, where=r["syncs"], **named)
        if loader:
            row(
                f"{stage}: loader ({trained_workers} workers) / step rate",
                loader_rates[trained_workers] / r["images_per_s"],
                "x",
                b,
                n,
                **named,
            )
    if pretrained := [r for (_, _, stage), r in measured.items() if stage == "pretrain"]:
        pretrain = configs["pretrain"]
        masks_ms = bench_masks(pretrain)
        row("pretrain masks, training process", masks_ms, "ms", pretrain.batch_size, pretrained[0]["events"])
    for workers, rate in loader_rates.items():
        name = f"data loader, {workers} workers" if workers == trained_workers else f"loader ceiling, {workers} workers"
        row(name, rate, "samples/s", None, loader_events)
    counts = sorted({r["events"] for r in rows})
    how = f"variants {', '.join(variants)}" if variants else f"compile={compile_model}"
    table = Table(
        title=f"mem bench train: {preset} on {dev} ({how}, {steps} timed steps, "
        f"{'/'.join(map(str, counts))}-event windows on {sensor.width} x {sensor.height})"
    )
    columns = ("variant", "name", "value", "unit", "batch") if variants else ("name", "value", "unit", "batch")
    for column in columns:
        table.add_column(column)
    for r in rows:
        cells = (r["name"], f"{r['value']:.2f}", r["unit"], str(r["batch"] or ""))
        table.add_row(*((r.get("variant", ""), *cells) if variants else cells))
    Console().print(table)
    for r in rows:
        for where in r.get("where", []):
            Console().print(f"  {r['name'].split(':')[0]} waits at {where}", highlight=False, soft_wrap=True)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(rows, indent=2) + "\n")
    return rows
