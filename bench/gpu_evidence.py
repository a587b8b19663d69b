"""GPU evidence in one prepared device call: MEM against the same ViT from scratch and a ResNet-18 on N-Cars.

A GPU comes in short loans (one call of at most 10 minutes, 64 MiB of code and data carried, 8 files back), so
everything the call needs is prepared on a CPU and the call itself does one thing. Three modes
(``bash bench/gpu_evidence.sh MODE``, which runs ``python -m bench.gpu_evidence MODE``):

``prepare`` (``bench/gpu_pack.py``)
    packs ``ncars-dev`` (train, test, val-apart, and val when it fits) as ``.evz`` files (``mem_core.io.pack``) into
    one uncompressed zip, and downloads the wheels the GPU machine lacks (pydantic and its parts, timm at the locked
    version) into the git-ignored ``.gpu/``; prints the sizes, tracked code included, against the 60 MiB the call may
    carry.
``run``
    the device command: unpack, measure each stage's images/s at the ``gpu-small`` sizes (a ViT-S/8 at 112 x 112)
    and each finetuning arm's loader on the training split, size every stage's epochs to the time left from those
    measurements, then the tokenizer, MEM pretraining, and the label-efficiency experiment (MEM, scratch, ResNet-18;
    10 %, 100 % and 1 % of the labels in that order, as many as give every run ``min_epochs``; seeds 0-2; one run at
    a time; ``val-apart`` picks each run's epoch, ``test`` and ``val`` where carried score the kept model). Every
    stage has a time limit and the report names any stage or run it cut short or left out; the call ends within
    ``budget`` seconds (540 on a GPU, under the device tool's 570-s limit). It writes ``results.json``,
    ``results.md`` (each run's epoch times too), ``label_efficiency.png`` and the pretrained model in bf16
    safetensors parts of at most 15 MiB to ``--out`` ($OUT on the device).
``smoke``
    the same ``run`` on this CPU at a tiny scale (a few files of each split, a tiny model, one seed, two fractions,
    seconds per stage): the test suite runs it.

``assemble PARTS --out RUN`` rebuilds a pretraining run directory from the parts a call returned, so ``mem finetune
--init RUN`` finetunes and scores the GPU-pretrained model again on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu_pack import CARRY_LIMIT, DATA_ZIP, PACK, PACK_INFO, carried_bytes, log, prepare, print_sizes

PART_LIMIT = 15 * 2**20  # each returned file (the device tool returns at most 16 MiB a file)
ARMS_PER_RUN = ("vit", "vit", "cnn")  # MEM and scratch are the same ViT; the yardstick is a CNN


@dataclass(frozen=True)
class Scale:
    """How big a call is: its whole time, the experiment's fractions and seeds, and what differs from gpu-small."""

    name: str
    budget_s: float  # the whole call, from the script's start to its last file
    reserve_s: float  # kept for scoring on test, latency, the parts and the report
    fractions: tuple[float, ...]  # in the order they run: what matters most first
    seeds: tuple[int, ...]
    overrides: dict[str, tuple[str, ...]]  # experiment stage -> --set values on top of the preset
    files_per_class: dict[str, int] | None  # smoke: pack only this many files per class and split
    calibration_steps: int
    run_overhead_s: float  # a finetuning run's cost beside its steps: loaders, validations, checkpoints, plots
    latency_windows: int
    yardstick: str = "resnet18"
    jobs: int = 1  # finetuning runs at once (each a process of its own)
    parallel_speedup: float = 1.0  # how much faster ``jobs`` runs at once finish than one after the other
    min_epochs: int = 8  # a finetuning run's fewest epochs: fractions are left out (the last first) to give them
    choose_on: str = "val-apart"  # picks each run's epoch where the data has it (else val); never test


GPU = Scale(
    name="gpu",
    budget_s=540,
    reserve_s=40,
    fractions=(0.1, 1.0, 0.01),
    seeds=(0, 1, 2),
    overrides={},
    files_per_class=None,
    calibration_steps=10,
    # measured on the H200, one run at a time: ~8.4 s a run of which 4.5 s trained (process, loaders, scoring).
    # Three at once were slower together than one alone: ~900 images/s in all against ~2,000 for one (the runs share
    # the 16 cores' loaders and one GPU), so the runs go one after the other
    run_overhead_s=4.0,
    latency_windows=30,
)
TINY_VIT = ("model.embed_dim=32", "model.depth=2", "model.num_heads=2")
SMOKE = Scale(
    name="smoke",
    budget_s=15,
    reserve_s=5,
    fractions=(0.1, 1.0),
    seeds=(0,),
    overrides={
        "all": ("input.size=[32, 32]", "input.n_max=3000", "data.num_workers=0", "batch_size=16"),
        "tokenizer": ("model.num_tokens=64", "model.hidden_dim=16", "model.codebook_dim=8"),
        "pretrain": TINY_VIT,
        "finetune": TINY_VIT,
    },
    files_per_class={"train": 24, "val-apart": 8, "test": 8},  # as the GPU call packs ncars-dev: val left out
    calibration_steps=1,
    run_overhead_s=1.0,
    latency_windows=5,
    yardstick="resnet10t",
    min_epochs=1,
)
# of the time left after setup and calibration: on the H200, 0.08 / 0.45 / 0.47 left 3 epochs a finetuning run (not
# trained) after 149 pretraining epochs; the finetuning runs are what the comparison is about
SHARES = {"tokenizer": 0.06, "pretrain": 0.30, "finetune": 0.64}


# ------------------------------------------------------------------------------------------------- run


@dataclass
class Stage:
    """One stage's plan and outcome, as the report shows it."""

    name: str
    budget_s: float = 0.0
    images_per_s: float = 0.0  # measured on synthetic batches before the stage
    epochs: int = 0
    seconds: float = 0.0
    cut_short: bool = False
    note: str = ""


class Call:
    """One call: the clock, the plan of each stage and what it did."""

    def __init__(self, scale: Scale, out: Path, work: Path) -> None:
        self.scale, self.out, self.work = scale, out, work
        self.started = time.monotonic()
        self.stages: dict[str, Stage] = {}
        self.not_run: list[str] = []
        self.efficiency = 0.7  # of a measured rate that training reaches (loader, validation, checkpoints)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        """Seconds left before the reserve for the report (0 once setup and calibration overran: every stage then
        trains its one epoch, and what does not fit after it is left out and named)."""
        return max(self.scale.budget_s - self.scale.reserve_s - self.elapsed(), 0.0)


def run(scale: Scale, out: Path, data_zip: Path, work: Path | None = None) -> dict[str, Any]:
    """The device call (``scale`` GPU) or its CPU smoke: unpack, calibrate, train, score, report into ``out``."""
    import torch

    if scale is GPU and not torch.cuda.is_available():
        raise SystemExit("run is the GPU call and this machine has no CUDA device: `smoke` runs it on a CPU")
    out.mkdir(parents=True, exist_ok=True)
    work = work or Path(tempfile.mkdtemp(prefix="gpu-evidence-"))
    call = Call(scale, out, work)
    data = work / "ncars-dev"
    with zipfile.ZipFile(data_zip) as archive:
        archive.extractall(data)
    info = json.loads((data_zip.parent / PACK_INFO).read_text())
    log(f"unpacked {info['files']} files ({info['events'] / 1e6:.1f} M events) in {call.elapsed():.1f} s")
    experiment = _experiment(scale, data, work / "experiment")
    rates = calibrate(experiment, info["mean_events"], scale.calibration_steps)
    log("images/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items()) + f" ({call.elapsed():.0f} s in)")
    report: dict[str, Any] = {}
    try:
        train_stages(call, experiment, rates)
        report = run_experiment(call, experiment, rates)
    finally:
        write_report(call, experiment, info, rates, report)
    return report


def _experiment(scale: Scale, data: Path, out: Path):
    """The call's experiment on ``data``; choosing on val-apart (what the call carries in val's place), nothing is
    held out of train and the pretraining stages watch val-apart (``experiment.stage_config_of``)."""
    from mem_core.train.experiment import LabelEfficiencyConfig

    choose_on = scale.choose_on if (data / scale.choose_on).is_dir() else "val"
    overrides = {stage: list(values) for stage, values in scale.overrides.items()}
    return LabelEfficiencyConfig(
        dataset="ncars",
        data=str(data),
        out=str(out),
        preset="gpu-small",
        fractions=scale.fractions,
        seeds=scale.seeds,
        yardstick=scale.yardstick,
        overrides=overrides,
        latency_windows=scale.latency_windows,
        jobs=scale.jobs,
        choose_on=choose_on,
    )


def calibrate(experiment, events: float, steps: int) -> dict[str, float]:
    """Images/s of each stage's training step at the experiment's sizes, on batches of synthetic windows of the
    data's mean event count on the N-Cars sensor (``mem bench train``'s measurement), and the samples/s each
    finetuning arm's own loader delivers from the training split (``loader vit``, ``loader cnn``): on the H200 the
    loader, not the step, bounds a finetuning run."""
    from bench.bench_train import bench_stage
    from mem_core.datasets.ncars import NCARS_SENSOR
    from mem_core.models import DiscreteVAE
    from mem_core.runs.export import export_tokenizer
    from mem_core.runs.rundir import RunDir
    from mem_core.train.experiment import finetune_config, stage_config_of
    from mem_core.train.finetune import FinetuneStage
    from mem_core.train.pretrain import PretrainStage
    from mem_core.train.tokenizer import TokenizerStage

    configs = {
        "tokenizer": (TokenizerStage, stage_config_of(experiment, "tokenizer")),
        "pretrain": (PretrainStage, stage_config_of(experiment, "pretrain")),
        "finetune vit": (FinetuneStage, stage_config_of(experiment, "finetune")),
        "finetune cnn": (FinetuneStage, finetune_config(experiment, experiment.yardstick, 1.0, 0)),
    }
    rates = {}
    with tempfile.TemporaryDirectory(prefix="gpu-evidence-calibration-") as tmp:
        tokenizer = export_tokenizer(
            DiscreteVAE(TokenizerStage.configure(configs["tokenizer"][1]).model), Path(tmp) / "tok"
        )
        for name, (stage_cls, cfg) in configs.items():
            run = RunDir(Path(tmp) / name.replace(" ", "-"))
            run.path.mkdir()
            inputs = {"tokenizer": tokenizer} if stage_cls is PretrainStage else {}
            measured = bench_stage(
                stage_cls,
                cfg,
                run,
                steps,
                warmup=min(steps, 3),
                sensor=NCARS_SENSOR,
                events=max(1, round(events)),
                **inputs,
            )
            rates[name] = measured["images_per_s"]
    for name, arm in (("loader vit", "mem"), ("loader cnn", experiment.yardstick)):
        rates[name] = loader_rate(finetune_config(experiment, arm, 1.0, 0), batches=max(2, steps))
    return rates


def loader_rate(cfg, batches: int) -> float:
    """Samples/s the training loader of finetuning config ``cfg`` delivers: its workers reading the training split,
    cutting and augmenting windows, collating and pinning them, over ``batches`` batches after the first (which pays
    the workers' start)."""
    import torch

    from bench.bench_train import loader_samples_per_s
    from mem_core.train.data import build_loader, open_training
    from mem_core.train.runtime import Runtime

    source, _ = open_training(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader, sampler = build_loader(
        source,
        cfg.input,
        train=True,
        seed=0,
        batch_size=cfg.batch_size,
        runtime=Runtime(device),
        num_workers=cfg.data.num_workers,
        preload_mib=cfg.data.preload_mib,
    )
    try:
        return loader_samples_per_s(loader, sampler, epochs=batches + 1, limit=batches * cfg.batch_size)
    finally:
        loader.close()


def _train_samples(experiment) -> int:
    from mem_core.train.experiment import stage_config_of, training_split

    return len(training_split(stage_config_of(experiment, "finetune")))


def train_stages(call: Call, experiment, rates: dict[str, float]) -> None:
    """The tokenizer, then MEM pretraining, each with the epochs that fill its share of the time left at the rate
    measured (corrected by how much of that rate the stage before it reached), and a time limit a third above."""
    from mem_core.train import pretrain, tokenizer
    from mem_core.train.experiment import stage_config_of

    out = Path(experiment.out)
    samples = _train_samples(experiment)
    efficiency, left = call.efficiency, call.left()
    for name, stage_module in (("tokenizer", tokenizer), ("pretrain", pretrain)):
        stage = call.stages[name] = Stage(name, budget_s=SHARES[name] / sum(SHARES.values()) * left)
        stage.images_per_s = rates[name]
        stage.epochs = max(1, math.floor(stage.budget_s * stage.images_per_s * efficiency / samples))
        cfg = stage_config_of(experiment, name)
        cfg = dataclasses.replace(cfg, epochs=stage.epochs, time_limit_s=max(1.33 * stage.budget_s, 1.0))
        log(f"{name}: {stage.epochs} epochs in a budget of {stage.budget_s:.0f} s")
        t0 = time.monotonic()
        inputs = {"tokenizer": out / "tokenizer"} if name == "pretrain" else {}
        run = stage_module.run(cfg, out / name, **inputs)
        stage.seconds = time.monotonic() - t0
        result = json.loads((run.path / "result.json").read_text())
        stage.cut_short = bool(result.get("cut_short"))
        reached = stage.epochs * samples / stage.images_per_s / stage.seconds
        efficiency = min(max(reached if not stage.cut_short else efficiency * 0.8, 0.1), 1.0)
        stage.note = f"reached {reached:.0%} of the measured rate"
        log(f"{name}: {result.get('epochs_run')} epochs in {stage.seconds:.0f} s ({stage.note})")
    call.efficiency = efficiency


def finetune_seconds_per_sample(call: Call, rates: dict[str, float]) -> float:
    """Seconds one training sample costs the three arms of a run together: each arm at the slower of its step (at the
    efficiency the stages before reached) and its loader."""
    seconds = 0.0
    for arm in ARMS_PER_RUN:
        step = rates["finetune vit" if arm == "vit" else "finetune cnn"] * call.efficiency
        seconds += 1 / min(step, rates.get(f"loader {arm}", math.inf))
    return seconds


def plan_finetuning(
    call: Call, experiment, rates: dict[str, float], budget: float, samples: int
) -> tuple[int, tuple[float, ...]]:
    """The epochs of every finetuning run (each epoch ``samples`` training samples) and the fractions that get
    them: all fractions if their runs afford ``min_epochs`` each in ``budget``, else the fewest left out from the end
    (they come in the order that matters)."""
    per_sample = finetune_seconds_per_sample(call, rates)
    speedup = call.scale.parallel_speedup
    fractions = experiment.fractions
    while True:
        rounds = len(fractions) * len(experiment.seeds)  # each round: one run of every arm
        overhead = rounds * len(ARMS_PER_RUN) * call.scale.run_overhead_s / speedup
        epochs = max(1, math.floor((budget - overhead) * speedup / (rounds * samples * per_sample)))
        if epochs >= call.scale.min_epochs or len(fractions) == 1:
            return epochs, fractions
        fractions = fractions[:-1]


def run_experiment(call: Call, experiment, rates: dict[str, float]) -> dict[str, Any]:
    """The finetuning runs of the experiment, a fraction at a time (each call reuses the finished runs and writes
    the report so far), with the epochs every run can afford in the time left; a fraction that would not finish in
    time, or whose runs would leave every run fewer than ``min_epochs``, is left out and named."""
    from mem_core.train.experiment import run as run_experiment

    samples = _train_samples(experiment)
    budget = call.left()
    speedup = call.scale.parallel_speedup
    epochs, fractions = plan_finetuning(call, experiment, rates, budget, samples)
    if fractions != experiment.fractions:
        call.not_run += [f"{f:.0%} of the labels" for f in experiment.fractions[len(fractions) :]]
        log(f"left out to give each run {call.scale.min_epochs} epochs or more: {', '.join(call.not_run)}")
        experiment = dataclasses.replace(experiment, fractions=fractions)
    runs = len(fractions) * len(experiment.seeds) * len(ARMS_PER_RUN)
    run_budget = epochs * samples * finetune_seconds_per_sample(call, rates) / len(ARMS_PER_RUN)
    run_budget += call.scale.run_overhead_s
    stage = call.stages["finetune"] = Stage("finetune", budget_s=budget, epochs=epochs)
    stage.images_per_s = min(rates["finetune vit"], rates.get("loader vit", math.inf))
    log(f"finetune: {runs} runs of {epochs} epochs in a budget of {budget:.0f} s")
    shared = max(1.0, call.scale.jobs / speedup)  # a run beside others runs this much slower than alone
    limits = [f"epochs={epochs}", f"time_limit_s={2 * run_budget * shared:.1f}"]
    overrides = {**experiment.overrides, "finetune": [*experiment.overrides.get("finetune", []), *limits]}
    t0 = time.monotonic()
    report: dict[str, Any] = {}
    for k, fraction in enumerate(experiment.fractions):
        needed = len(experiment.seeds) * len(ARMS_PER_RUN) * run_budget / speedup
        if k > 0 and call.left() < 0.8 * needed:
            late = [f"{f:.0%} of the labels" for f in experiment.fractions[k:]]
            call.not_run += late
            log(f"out of time: {', '.join(late)} left out ({call.left():.0f} s left, {needed:.0f} needed)")
            break
        step = dataclasses.replace(experiment, fractions=experiment.fractions[: k + 1], overrides=overrides)
        report = run_experiment(step)
        log(f"finetune: {fraction:.0%} of the labels done, {call.elapsed():.0f} s in")
    stage.seconds = time.monotonic() - t0
    stage.cut_short = any(r["cut_short"] for r in report.get("rows", []))
    return report


def write_report(call: Call, experiment, info: dict, rates: dict[str, float], report: dict[str, Any]) -> None:
    """``results.json``, ``results.md`` and the plot into ``call.out``, the pretrained model in parts beside them,
    and the tables on stdout."""
    import torch

    from mem_core.train.experiment import markdown_report, stage_config_of

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor() or 'cpu'})"
    header = {
        "scale": call.scale.name,
        "device": device,
        "torch": torch.__version__,
        "budget_s": call.scale.budget_s,
        "seconds": call.elapsed(),
        "data": {k: info.get(k) for k in ("files", "events", "mean_events", "packed_bytes", "per_split", "left_out")},
        "choose_on": experiment.choose_on,
        "calibrated_images_per_s": rates,
        "stages": {name: dataclasses.asdict(stage) for name, stage in call.stages.items()},
        "not_run": call.not_run,
        "pretrain_config": _config_of(Path(experiment.out) / "pretrain"),
        "experiment": report,
        "run_timing": run_timing(report),
    }
    parts = export_parts(Path(experiment.out) / "pretrain", call.out)
    header["pretrained_parts"] = [p.name for p in parts]
    (call.out / "results.json").write_text(json.dumps(header, indent=2, default=str) + "\n")
    lines = [
        f"# GPU evidence: {call.scale.name} on {device}",
        "",
        f"torch {torch.__version__}; {call.elapsed():.0f} s of a {call.scale.budget_s:.0f}-s budget; "
        f"ncars-dev: {info['files']} samples, {info['events'] / 1e6:.1f} M events; preset gpu-small "
        f"({stage_config_of(experiment, 'finetune').model.embed_dim}-wide ViT); {experiment.choose_on} picks each "
        "run's epoch."
        + (
            f" Not carried (over the call's size limit): {', '.join(info['left_out'])}." if info.get("left_out") else ""
        ),
        "",
        stage_table(call),
    ]
    if call.not_run:
        lines += ["", f"Left out for lack of time: {', '.join(call.not_run)}."]
    if report:
        lines += ["", markdown_report(report), "", timing_table(header["run_timing"])]
        shutil.copy(Path(experiment.out) / "label_efficiency.png", call.out / "label_efficiency.png")
    text = "\n".join(lines) + "\n"
    (call.out / "results.md").write_text(text)
    print(text, flush=True)


def stage_table(call: Call) -> str:
    rows = ["| stage | budget s | took s | epochs | images/s measured | |", "|---|---|---|---|---|---|"]
    for stage in call.stages.values():
        flag = "**cut short by its time limit**" if stage.cut_short else stage.note
        rows.append(
            f"| {stage.name} | {stage.budget_s:.0f} | {stage.seconds:.0f} | {stage.epochs} | "
            f"{stage.images_per_s:,.0f} | {flag} |"
        )
    return "\n".join(rows)


def run_timing(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Where each finetuning run's time went (from its metrics): the epochs it trained, its first epoch (the
    workers' start), the median of the others, and the whole of its epochs."""
    from mem_core.runs.rundir import RunDir

    timing = []
    for row in report.get("rows", []):
        seconds = [r["epoch_seconds"] for r in RunDir(Path(row["run"])).metrics() if "epoch_seconds" in r]
        if seconds:
            rest = sorted(seconds[1:]) or seconds
            timing.append(
                {
                    "arm": row["arm"],
                    "labels": row["labels"],
                    "seed": row["seed"],
                    "epochs": len(seconds),
                    "first_epoch_s": seconds[0],
                    "epoch_s": rest[len(rest) // 2],
                    "epochs_s": sum(seconds),
                }
            )
    return timing


def timing_table(timing: list[dict[str, Any]]) -> str:
    rows = [
        "| labels | arm | seed | epochs | first epoch s | epoch s (median) | all epochs s |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in timing:
        rows.append(
            f"| {t['labels']:.0%} | {t['arm']} | {t['seed']} | {t['epochs']} | {t['first_epoch_s']:.1f} | "
            f"{t['epoch_s']:.1f} | {t['epochs_s']:.1f} |"
        )
    return "\n".join(rows)


def _config_of(run: Path) -> dict | None:
    path = run / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def export_parts(pretrain_run: Path, out: Path) -> list[Path]:
    """The pretraining run's model (``checkpoint.pt``) in bf16, as safetensors files of at most ``PART_LIMIT``
    bytes each (``pretrained-K.safetensors``); nothing when the run left no checkpoint."""
    import torch
    from safetensors.torch import save_file

    from mem_core.runs.rundir import RunDir, load_checkpoint

    if not RunDir(pretrain_run).checkpoint_path.is_file():
        return []
    state = load_checkpoint(RunDir(pretrain_run).checkpoint_path)["model"]
    parts: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        tensor = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        nbytes = tensor.numel() * tensor.element_size()
        if size + nbytes > PART_LIMIT - 2**20 and parts[-1]:  # room for the header
            parts.append({})
            size = 0
        parts[-1][name] = tensor.contiguous()
        size += nbytes
    paths = []
    for k, part in enumerate(parts):
        paths.append(out / f"pretrained-{k}.safetensors")
        save_file(part, str(paths[-1]))
    return paths


def assemble(parts_dir: Path, out: Path) -> Path:
    """A pretraining run directory at ``out`` from a call's ``pretrained-K.safetensors`` parts and ``results.json``
    (its pretraining config): ``mem finetune --init out`` then starts from the GPU-pretrained weights (in fp32)."""
    from safetensors.torch import load_file

    from mem_core.runs.rundir import RunDir

    parts = sorted(parts_dir.glob("pretrained-*.safetensors"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    stored = json.loads((parts_dir / "results.json").read_text()).get("pretrain_config")
    if not parts or not stored:
        raise SystemExit(f"{parts_dir}: no pretrained-K.safetensors parts or no pretrain_config in results.json")
    state = {}
    for part in parts:
        state |= {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(part)).items()}
    run = RunDir.create(out, "pretrain", stored["config"], resume=False)
    run.save_checkpoint({"model": state, "epoch": stored["config"]["epochs"] - 1})
    run.write_json("result.json", {"stage": "pretrain", "assembled_from": [p.name for p in parts]})
    return run.path


# ------------------------------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    from mem_core import shared_data_dir

    parser = argparse.ArgumentParser(prog="bench/gpu_evidence.sh", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare", help="pack ncars-dev and the wheels into .gpu/")
    p.add_argument("--data", type=Path, default=shared_data_dir() / "ncars-dev")
    p = sub.add_parser("run", help="the device call: write its results to --out ($OUT)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu-evidence")))
    p = sub.add_parser("smoke", help="the same run on this CPU at a tiny scale")
    p.add_argument("--out", type=Path, default=Path("out/gpu-evidence-smoke"))
    p.add_argument("--data", type=Path, default=shared_data_dir() / "ncars-dev")
    p = sub.add_parser("assemble", help="a pretraining run directory from a call's parts")
    p.add_argument("parts", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.mode == "prepare":
        prepare(args.data)
        total = print_sizes(carried_bytes())
        if total > CARRY_LIMIT:
            raise SystemExit(f"{total / 2**20:.1f} MiB is more than the {CARRY_LIMIT / 2**20:.0f} MiB a call carries")
        log("ready: run `bash bench/gpu_evidence.sh run` on the device with .gpu carried and a 570-s limit")
    elif args.mode == "run":
        run(GPU, args.out, PACK / DATA_ZIP)
    elif args.mode == "smoke":
        with tempfile.TemporaryDirectory(prefix="gpu-evidence-smoke-") as tmp:
            prepare(args.data, Path(tmp) / "pack", SMOKE.files_per_class, wheels=False)
            run(SMOKE, args.out, Path(tmp) / "pack" / DATA_ZIP, Path(tmp) / "work")
    else:
        log(f"pretraining run: {assemble(args.parts, args.out)}")


if __name__ == "__main__":
    main()
