"""Label efficiency: does masked event pretraining beat training from scratch, and the CNN a user would pick,
when labels are few?

One command runs the paper's central comparison on a dataset the user has: train the tokenizer and pretrain on the
training split *without labels*, then, for every label fraction and seed, finetune a MEM-initialised ViT, the same ViT
from scratch and a yardstick CNN from scratch (timm's ResNet-18 by default) on the same labelled samples with the same
number of steps and the same validations. The choosing split (``choose_on``: ``val``, or ``val-apart``, a validation
split recorded apart from the training recordings, where nothing is then held out of the training split:
``data.held_out``) picks each run's kept model (its best epoch); every kept model is then scored once on each of
``val``, ``val-apart`` and ``test`` the data has, and the test top-1 is the headline: validation was used to choose, so
only the test split says how a model holds up on recordings nobody chose anything on (N-Cars' official test split was
recorded apart from its training split). Without a test split the headline is the final epoch's top-1 on the choosing
split, which involves no choice made on it.

It writes ``results.json`` (every run: validation curve, kept epoch, its top-1 on every split; per arm the mean and
spread over seeds, its parameters and CPU latency per live window; the leads over seeds), ``results.md`` (the
tables), ``label_efficiency.png`` (the headline top-1 against the label fraction, per arm) and ``val_curves.png``
(every run's validation top-1 over its training budget).

Every stage is a normal run directory under ``out``; finished runs and their test scores are reused, so an
interrupted experiment continues where it stopped. With ``jobs`` > 1 the finetuning runs go ``jobs`` at a time,
each in a process of its own with the machine's cores shared out as torch threads, its output in
``out/logs/<run>.log``: small models use two cores poorly from one process (the step's Python half runs on one),
so on 2 cores two runs at once finish sooner than one after the other.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from mem_core.fields import AT_LEAST_1, SHARE, check_fields

# This module is imported by the command line for the defaults of ``LabelEfficiencyConfig``: torch and the stages
# are imported by ``run`` (every ``mem`` command would pay seconds for them otherwise).
from mem_core.train.experiment_report import (
    DISTILLED,
    MEM,
    PRETRAINED,
    SCRATCH,
    leads,
    markdown_report,
    plot,
    plot_curves,
    summarize,
)

# the STAGE of --set STAGE:key=value; "mem", "scratch" and "yardstick" apply to that arm's finetuning config after
# "finetune" (each arm's recipe may be chosen on the validation split, as the yardstick's optimiser is its own), and
# "mem-distilled" to the distilled student's after "mem"'s
ARM_OVERRIDES = (MEM, SCRATCH, "yardstick", DISTILLED)
STAGE_OVERRIDES = ("tokenizer", "pretrain", "finetune", *ARM_OVERRIDES, "all")
NO_YARDSTICK = "none"
# the splits every kept model is scored on when the data has them: the validation split carved from the training
# recordings, a validation split recorded apart from them (N-Cars' val-apart), and the test split, the headline
SCORED_SPLITS = ("val", "val-apart", "test")
SPLIT_KEYS = {split: f"{split.replace('-', '_')}_top1" for split in SCORED_SPLITS}  # the row field of each split


def scores_file(split: str) -> str:
    """Beside a run's result.json: its kept model's top-1 on ``split``."""
    return f"eval-{split}.json"


TEST_SCORES = scores_file("test")
PRETRAINING_STAGES = ("tokenizer", "pretrain")  # the stages that read the unlabeled recordings
PRETRAIN_BUDGETS = ("epochs", "steps")


@dataclass
class LabelEfficiencyConfig:
    dataset: str = "ncars"
    data: str | None = None
    out: str = "runs/label-efficiency"
    preset: str = "cpu-tiny"
    config_file: str | None = None
    fractions: tuple[Annotated[float, SHARE], ...] = (0.1, 1.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    # the CNN arm trained from scratch beside MEM and scratch (a timm name of ``mem_core.models.cnn.CNN_ARCHS``), or
    # "none"
    yardstick: str = "resnet18"
    # every finetuning run takes the same number of optimisation steps and validations: an epoch on a label fraction
    # draws as many samples as all labels hold (``equal_steps``)
    equal_steps: bool = True
    overrides: dict[str, list[str]] = field(default_factory=dict)  # stage -> ["key=value", ...]
    jobs: Annotated[int, AT_LEAST_1] = 1  # finetuning runs at once, each in its own process
    latency_windows: Annotated[int, AT_LEAST_1] = (
        100  # windows timed per arm for its CPU latency per live window (after 5 untimed)
    )
    # the split that picks each run's kept epoch and every recipe choice (a validation split: never test)
    choose_on: str = "val"
    # recordings without labels (corpora, folders of event files) that the tokenizer and the pretraining read beside
    # the training split, its labels dropped; the finetuning runs learn from the training split's labels alone
    unlabeled: tuple[str, ...] = ()
    # how pretraining scales with the unlabeled recordings: "epochs" (the preset's epochs over all of them: more
    # steps) or "steps" (the tokenizer's and the pretraining's epochs scaled so they take the steps of the training
    # split alone)
    pretrain_budget: str = "epochs"
    # a fourth arm, SimCLRv2's second use of the unlabeled recordings: each MEM run (fraction, seed) is the teacher of
    # a student started from the same pretraining, which learns its predictions on the training split's recordings
    # and the unlabeled ones (no labels), with the steps of the other arms
    distill: bool = False
    # each seed pretrains a tokenizer and MEM of its own (``seed=SEED`` in both stages; ``tokenizer-seedS``,
    # ``pretrain-seedS``) for its MEM runs: the spread over seeds then holds the pretraining's, not only the
    # finetuning's (one pretraining serves every seed otherwise); the pretraining's time times the seeds
    pretrain_per_seed: bool = False
    # the arms that see no unlabeled recordings (the ViT from scratch, the yardstick CNN); False runs MEM (and its
    # students) alone: another point of ``mem experiment unlabeled-curve``, whose bands come from the experiments that
    # trained them on the same labels and seeds
    baselines: bool = True

    def __post_init__(self) -> None:
        from mem_core.configuration import ConfigError
        from mem_core.models.cnn import CNN_ARCHS

        check_fields(self)
        if not self.fractions:
            raise ConfigError("fractions: at least one label fraction")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")
        if self.yardstick != NO_YARDSTICK and self.yardstick not in CNN_ARCHS:
            raise ConfigError(
                f"yardstick must be one of {', '.join(CNN_ARCHS)} or {NO_YARDSTICK}, got {self.yardstick!r}"
            )
        if self.pretrain_budget not in PRETRAIN_BUDGETS:
            raise ConfigError(
                f"pretrain_budget must be one of {', '.join(PRETRAIN_BUDGETS)}, got {self.pretrain_budget!r}"
            )
        if self.choose_on in ("test", "train"):
            raise ConfigError(
                f"choose_on={self.choose_on!r}: choose on a validation split (val or val-apart); "
                + ("test is where results are claimed, never chosen" if self.choose_on == "test" else "not on train")
            )

    @property
    def arms(self) -> tuple[str, ...]:
        """The arms of every (fraction, seed): MEM, scratch and the yardstick CNN (if any; neither without
        ``baselines``), the distilled MEM (if any)."""
        if not self.baselines:
            arms: tuple[str, ...] = (MEM,)
        else:
            arms = (MEM, SCRATCH) if self.yardstick == NO_YARDSTICK else (MEM, SCRATCH, self.yardstick)
        return (*arms, DISTILLED) if self.distill else arms


def run_path(cfg: LabelEfficiencyConfig, arm: str, fraction: float, seed: int) -> Path:
    """The run directory of one finetuning run of the experiment."""
    return Path(cfg.out) / f"finetune-{arm}-labels{fraction:g}-seed{seed}"


def stage_config_of(cfg: LabelEfficiencyConfig, stage: str, *extra: str):
    """The config of ``stage`` in the experiment ``cfg``: its preset, config file and ``--set`` overrides."""
    from mem_core.train.configs import stage_config

    values: dict[str, Any] = {"data.dataset": cfg.dataset, **({"data.path": cfg.data} if cfg.data else {})}
    if cfg.choose_on != "val":  # a split recorded apart chooses: nothing is held out of train to validate on
        values["data.held_out"] = False
        if stage in PRETRAINING_STAGES:  # they choose nothing; they watch the split that does
            values["data.val_split"] = cfg.choose_on
    if stage in PRETRAINING_STAGES and cfg.unlabeled:
        values["data.unlabeled"] = list(cfg.unlabeled)
    overrides = [*cfg.overrides.get("all", []), *cfg.overrides.get(stage, []), *extra]
    return stage_config(stage, preset=cfg.preset, config_file=cfg.config_file, values=values, overrides=overrides)


def pretraining_runs(cfg: LabelEfficiencyConfig, seed: int) -> tuple[Path, Path]:
    """The tokenizer and pretraining runs that the MEM runs of ``seed`` start from."""
    suffix = f"-seed{seed}" if cfg.pretrain_per_seed else ""
    return Path(cfg.out) / f"tokenizer{suffix}", Path(cfg.out) / f"pretrain{suffix}"


def pretrain_runs_in(out: Path) -> list[Path]:
    """The pretraining runs an experiment's directory ``out`` holds: one, or one per seed (``pretraining_runs``)."""
    return [run for run in (Path(out) / "pretrain", *sorted(Path(out).glob("pretrain-seed*"))) if run.is_dir()]


def pretraining_config(cfg: LabelEfficiencyConfig, stage: str, seed: int | None = None):
    """The config of ``stage`` (tokenizer or pretrain): ``stage_config_of``'s (with ``pretrain_per_seed``, seeded by
    ``seed``), with ``pretrain_budget`` "steps" its epochs scaled by the training split's share of the samples it
    reads (the steps of the training split alone)."""
    from mem_core.train.data import open_training

    stage_cfg = stage_config_of(cfg, stage, *([f"seed={seed}"] if cfg.pretrain_per_seed else []))
    if cfg.pretrain_budget != "steps" or not cfg.unlabeled:
        return stage_cfg
    source, data = open_training(stage_cfg)
    epochs = max(1, round(stage_cfg.epochs * data["train_split"]["samples"] / len(source)))
    return dataclasses.replace(stage_cfg, epochs=epochs)


def finetune_config(cfg: LabelEfficiencyConfig, arm: str, fraction: float, seed: int, train_source=None):
    """The finetuning config of one run: the preset's with the label fraction and seed, the from-scratch recipe for
    the ViT from scratch and the yardstick's for the CNN arm, then the arm's own overrides (``mem:``, ``scratch:``,
    ``yardstick:``), stretched to the steps of a run on all labels (``equal_steps``, counted on ``train_source``, the
    training split, opened here when None). The distilled arm: MEM's config, then its overrides (``mem-distilled:``),
    taught by MEM's run of the same fraction and seed on every training recording without its label and the
    unlabeled ones, an epoch drawing as many of them as the training split holds (the same steps)."""
    from mem_core.configuration import apply_overrides, merge
    from mem_core.train.finetune import scratch_config, yardstick_config

    ft = stage_config_of(
        cfg,
        "finetune",
        f"seed={seed}",
        f"data.label_fraction={fraction}",
        f"data.label_seed={seed}",
        f"data.val_split={cfg.choose_on}",
    )
    if arm == DISTILLED:
        ft = apply_overrides(ft, [*cfg.overrides.get(MEM, []), *cfg.overrides.get(DISTILLED, [])])
        source = train_source if train_source is not None else training_split(ft)
        distilled = {
            "teacher": str(run_path(cfg, MEM, fraction, seed).resolve()),
            "data.label_fraction": 1.0,
            "data.unlabeled": list(cfg.unlabeled),
            "data.epoch_samples": all_labels(ft, source) if cfg.equal_steps else 0,
        }
        return merge(ft, distilled)
    if arm == MEM:
        ft = apply_overrides(ft, cfg.overrides.get(arm, []))
    elif arm == SCRATCH:
        ft = apply_overrides(scratch_config(ft), cfg.overrides.get(arm, []))
    else:
        ft = apply_overrides(yardstick_config(ft, arm), cfg.overrides.get("yardstick", []))
    if not cfg.equal_steps or fraction >= 1:
        return ft
    return equal_steps(ft, train_source if train_source is not None else training_split(ft))


def training_split(cfg):
    """The training split a finetuning config ``cfg`` reads, as its model sees it."""
    from mem_core.train.data import open_for_input

    data = cfg.data
    return open_for_input(data.dataset, data.path or None, data.train_split, cfg.input, held_out=data.held_out)


def equal_steps(cfg, train_source):
    """``cfg`` (a finetuning config on ``cfg.data.label_fraction`` of the labels of ``train_source``) made to take the
    optimisation steps, validations and warm-up of the same run on all labels: each epoch draws as many samples as
    all labels hold (``data.epoch_samples``: several passes over the labelled ones, each in its own order and
    augmentations), so the epochs, the schedule and the validations stay those of the full run."""
    if cfg.data.label_fraction >= 1:
        return cfg
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, epoch_samples=all_labels(cfg, train_source)))


def all_labels(cfg, train_source) -> int:
    """The training samples of ``cfg`` (a finetuning config) on all labels of ``train_source``."""
    from mem_core.train.data import train_indices

    everything = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, label_fraction=1.0))
    return len(train_indices(everything, train_source))


def run(cfg: LabelEfficiencyConfig) -> dict[str, Any]:
    """Run (or continue) the whole experiment and return its report (what ``results.json`` holds)."""
    from mem_core.runs.rundir import RunDir, json_safe
    from mem_core.train import pretrain, tokenizer

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    def timed(name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0
        return result

    pretrained = {seed: pretraining_runs(cfg, seed) for seed in cfg.seeds}
    for seed, (tok_path, pre_path) in pretrained.items():
        if not RunDir(tok_path).finished:
            tok_cfg = pretraining_config(cfg, "tokenizer", seed)
            timed("tokenizer", tokenizer.run, tok_cfg, tok_path, resume=tok_path.exists())
        if not RunDir(pre_path).finished:
            pre_cfg = pretraining_config(cfg, "pretrain", seed)
            timed("pretrain", pretrain.run, pre_cfg, pre_path, tokenizer=tok_path, resume=pre_path.exists())
    runs = [
        (run_path(cfg, arm, fraction, seed), arm, fraction, seed)
        for fraction in cfg.fractions
        for seed in cfg.seeds
        for arm in cfg.arms
    ]
    todo = [(path, arm, fraction, seed) for path, arm, fraction, seed in runs if not RunDir(path).finished]
    train_source = training_split(stage_config_of(cfg, "finetune")) if todo else None
    pending = [
        (
            path,
            arm,
            finetune_config(cfg, arm, fraction, seed, train_source),
            pretrained[seed][1] if arm in PRETRAINED else None,
        )
        for path, arm, fraction, seed in todo
    ]
    # the distilled students after every other run: their teachers are MEM's runs
    for phase in ([p for p in pending if p[1] != DISTILLED], [p for p in pending if p[1] == DISTILLED]):
        if phase:
            timed("finetune (all runs, wall clock)", finetune_all, phase, cfg.jobs, out / "logs")
    paths = [path for path, *_ in runs]
    scored = timed("scoring", score_on_splits, cfg, paths)
    test = scored.get("test", {})
    rows = []
    for path, arm, fraction, seed in runs:
        result = json.loads((path / "result.json").read_text())
        curve = [[r["epoch"], r["val_top1"]] for r in RunDir(path).metrics() if "val_top1" in r]
        on_splits = {
            key: result["top1"]
            if split == cfg.choose_on
            else (scored[split][path]["top1"] if split in scored else None)
            for split, key in SPLIT_KEYS.items()
        }
        rows.append(
            {
                "arm": arm,
                "labels": fraction,
                "seed": seed,
                **on_splits,  # the kept model's top-1 on val, val-apart and test (None where the data has no such split)
                "choose_on": cfg.choose_on,
                "kept_top1": result["top1"],  # the kept model: the best epoch on the choosing split
                "final_top1": curve[-1][1],  # the final epoch on the choosing split
                "best_epoch": result["best_epoch"],
                "train_samples": result["train_samples"],
                "epochs": curve[-1][0] + 1,
                "cut_short": result.get("cut_short", False),
                "val_curve": curve,
                "run": str(path),
            }
        )
    headline = "test_top1" if test else "final_top1"
    first_runs = {arm: next(path for path, a, *_ in runs if a == arm) for arm in cfg.arms}
    arms = timed("latency", describe_arms, cfg, first_runs)
    report = {
        "dataset": cfg.dataset,
        "data": cfg.data,
        "preset": cfg.preset,
        "headline": headline,
        "choose_on": cfg.choose_on,
        "pretraining": pretraining_of(cfg, *dict.fromkeys(run for runs in pretrained.values() for run in runs)),
        "test_samples": next(iter(test.values()))["n"] if test else None,
        "scored_samples": {split: next(iter(by_run.values()))["n"] for split, by_run in scored.items()},
        "arms": arms,
        "rows": rows,
        "summary": summarize(rows),
        "leads": leads(rows, headline),
        "seconds": timings,
    }
    (out / "results.json").write_text(json.dumps(json_safe(report), indent=2) + "\n")
    (out / "results.md").write_text(markdown_report(report) + "\n")
    plot(report, out / "label_efficiency.png")
    plot_curves(rows, out / "val_curves.png", cfg.dataset)
    return report


def pretraining_of(cfg: LabelEfficiencyConfig, *runs: Path) -> dict[str, Any]:
    """What the tokenizer and the pretraining read and for how long: the budget rule, each run's epochs (by its
    name), whether each seed pretrained its own, and the data (the training split and every unlabeled corpus or
    folder, with its digest, recordings and events)."""
    from mem_core.runs.rundir import RunDir
    from mem_core.train.stage import PRETRAINING_DATA

    configs = {run.name: RunDir(run).read_config() for run in runs}
    data = next((c[PRETRAINING_DATA] for c in configs.values() if PRETRAINING_DATA in c), None)
    return {
        "budget": cfg.pretrain_budget,
        "per_seed": cfg.pretrain_per_seed,
        "epochs": {name: c["config"]["epochs"] for name, c in configs.items()},
        "data": data or {"train_split": {"dataset": cfg.dataset, "path": cfg.data, "split": "train"}, "unlabeled": []},
    }


def score_on_splits(cfg: LabelEfficiencyConfig, paths: list[Path]) -> dict[str, dict[Path, dict[str, Any]]]:
    """Per split of ``SCORED_SPLITS`` the data has, other than the choosing one: each run's kept model's top-1
    there (``scores_file(split)`` in the run, reused when there). Scored once every run has finished: nothing is
    chosen on these numbers."""
    from mem_core.datasets import DatasetError
    from mem_core.train.data import open_for_input
    from mem_core.train.evaluate import evaluate_runs

    finetune = stage_config_of(cfg, "finetune")
    scored: dict[str, dict[Path, dict[str, Any]]] = {}
    for split in SCORED_SPLITS:
        if split == cfg.choose_on:
            continue
        try:
            open_for_input(cfg.dataset, cfg.data, split, finetune.input, held_out=finetune.data.held_out)
        except DatasetError:
            continue
        todo = [path for path in paths if not (path / scores_file(split)).is_file()]
        if todo:
            workers = finetune.data.num_workers
            print(f"scoring {len(todo)} kept model(s) on the {split} split", file=sys.stderr, flush=True)
            scores = evaluate_runs(todo, cfg.dataset, cfg.data, split, num_workers=workers)
            for path, result in zip(todo, scores, strict=True):
                kept = {k: result[k] for k in ("split", "top1", "n", "confusion")}
                (path / scores_file(split)).write_text(json.dumps(kept) + "\n")
        scored[split] = {path: json.loads((path / scores_file(split)).read_text()) for path in paths}
    return scored


def describe_arms(cfg: LabelEfficiencyConfig, runs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Per arm (one finished run each): its model's parameters and what the live path pays per window on this
    machine's CPU (the histogram and model input, then the model; milliseconds, median and 95th percentile over
    ``cfg.latency_windows`` windows of the evaluation data, the arms taking turns window by window)."""
    import numpy as np
    import torch

    from mem_core.inference import Predictor
    from mem_core.train.data import open_for_input

    predictors = {arm: Predictor(path, device="cpu") for arm, path in runs.items()}
    spec = next(iter(predictors.values())).spec
    split = "test" if (Path(next(iter(runs.values()))) / TEST_SCORES).is_file() else cfg.choose_on
    source = open_for_input(cfg.dataset, cfg.data, split, spec, held_out=cfg.choose_on == "val")
    picks = np.linspace(0, len(source) - 1, cfg.latency_windows + 5).astype(int)
    timings: dict[str, list[float]] = {arm: [] for arm in predictors}
    for i, index in enumerate(picks):
        events = source.load_window(int(index), spec.n_max, None)
        for arm, predictor in predictors.items():
            stages = predictor(events, source.sensor).stages_ms
            if i >= 5:  # the first windows compile kernels and warm the allocator
                timings[arm].append(stages["preprocess"] + stages["model"])
    return {
        arm: {
            "run": str(runs[arm]),
            "parameters": sum(p.numel() for p in predictor.model.parameters()),
            "cpu_ms_p50": float(np.percentile(timings[arm], 50)),
            "cpu_ms_p95": float(np.percentile(timings[arm], 95)),
            "cpu_threads": torch.get_num_threads(),
        }
        for arm, predictor in predictors.items()
    }


def finetune_all(pending: list[tuple], jobs: int, logs: Path) -> None:
    """Run the finetuning runs ``pending`` (path, arm, config, init): one after the other in this process when
    ``jobs`` is 1 or there is one run, else ``finetune_in_parallel``. A run that exists is continued."""
    from mem_core.train import finetune

    if jobs > 1 and len(pending) > 1:
        finetune_in_parallel(pending, jobs, logs)
        return
    for path, _, ft_cfg, init in pending:
        print(f"finetuning {path.name}", file=sys.stderr, flush=True)
        finetune.run(ft_cfg, path, init=init, resume=path.exists())


def finetune_in_parallel(pending: list[tuple], jobs: int, logs: Path) -> None:
    """Run the finetuning runs ``pending`` (path, arm, config, init), ``jobs`` at a time, each in a process of its
    own with ``cores // jobs`` torch threads; a failed run stops the others and names its log."""
    import multiprocessing
    from multiprocessing.connection import wait

    from mem_core.configuration import to_dict
    from mem_core.cores import usable_cores
    from mem_core.errors import MemError

    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch threads or locks inherited
    threads = max(1, usable_cores() // jobs)
    logs.mkdir(parents=True, exist_ok=True)
    queue, running = list(pending), {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                path, _, ft_cfg, init = queue.pop(0)
                log = logs / f"{path.name}.log"
                args = (to_dict(ft_cfg), str(path), None if init is None else str(init), threads, str(log))
                process = context.Process(target=_finetune_child, args=args, name=path.name)
                process.start()
                running[process.sentinel] = (process, path, log, time.perf_counter())
                print(f"finetuning {path.name} ({threads} thread(s); log: {log})", file=sys.stderr, flush=True)
            for sentinel in wait(list(running)):
                process, path, log, start = running.pop(sentinel)
                process.join()
                if process.exitcode != 0:
                    raise MemError(f"{path}: finetuning failed (exit code {process.exitcode}); see {log}")
                top1 = json.loads((path / "result.json").read_text()).get("top1")
                print(
                    f"finished {path.name} in {(time.perf_counter() - start) / 60:.1f} min (best top-1 {top1:.3f})",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for process, *_ in running.values():  # an error or Ctrl-C here: no orphaned runs go on
            process.terminate()
            process.join()


def _finetune_child(config: dict[str, Any], path: str, init: str | None, threads: int, log: str) -> None:
    """One finetuning run in a process of its own (``finetune_in_parallel``), its output to ``log``."""
    import contextlib

    import torch

    from mem_core.configuration import from_dict
    from mem_core.train import finetune
    from mem_core.train.configs import FinetuneStageConfig

    torch.set_num_threads(threads)
    with open(log, "a") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        finetune.run(from_dict(FinetuneStageConfig, config), path, init=init, resume=Path(path).exists())
