"""Label efficiency: does masked event pretraining beat training from scratch when labels are few?

One command runs the paper's central comparison on a dataset the user has: train the tokenizer and pretrain on
the training split *without labels*, then finetune a MEM-initialised and a from-scratch model with the same
recipe and budget for every label fraction and seed, evaluate both on the validation split, and write
``results.json`` (every run's validation curve included), ``results.md`` (the table: final- and best-epoch top-1, and
each seed), ``label_efficiency.png`` (final-epoch top-1 vs label fraction, both arms) and ``val_curves.png`` (every
run's validation top-1 over its training budget).

The headline column is the **final epoch**: the best epoch is picked on the validation split itself, so it flatters
every arm a little; the final epoch involves no choice made on validation data.
Every stage is a normal run directory under ``out``; finished runs are reused, so an interrupted experiment
continues where it stopped. With ``jobs`` > 1 the finetuning runs go ``jobs`` at a time, each in a process of its
own with the machine's cores shared out as torch threads, its output in ``out/logs/<run>.log``: small models use
two cores poorly from one process (the step's Python half runs on one), so on 2 cores two runs at once finish
sooner than one after the other.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# This module is imported by the command line for the defaults of ``LabelEfficiencyConfig``: torch and the stages
# are imported by ``run`` (every ``mem`` command would pay seconds for them otherwise).

STAGE_OVERRIDES = ("tokenizer", "pretrain", "finetune", "all")  # the STAGE of --set STAGE:key=value


@dataclass
class LabelEfficiencyConfig:
    dataset: str = "ncars"
    data: str | None = None
    out: str = "runs/label-efficiency"
    preset: str = "cpu-tiny"
    config_file: str | None = None
    fractions: tuple[float, ...] = (0.1, 1.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    # every finetuning run takes the same number of optimisation steps: the preset's epochs at 100 % labels,
    # epochs / fraction below (evaluating as often per sample seen)
    equal_steps: bool = True
    overrides: dict[str, list[str]] = field(default_factory=dict)  # stage -> ["key=value", ...]
    jobs: int = 1  # finetuning runs at once, each in its own process

    def __post_init__(self) -> None:
        from mem_core.configuration import ConfigError, Interval, check_ranges

        check_ranges(self, {"jobs": Interval(1)})
        if not self.fractions or not all(0 < f <= 1 for f in self.fractions):
            raise ConfigError(f"fractions must be label fractions in (0, 1], got {self.fractions}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")


def _stage_config(cfg: LabelEfficiencyConfig, stage: str, *extra: str):
    from mem_core.train.configs import stage_config

    values = {"data.dataset": cfg.dataset, **({"data.path": cfg.data} if cfg.data else {})}
    overrides = [*cfg.overrides.get("all", []), *cfg.overrides.get(stage, []), *extra]
    return stage_config(stage, preset=cfg.preset, config_file=cfg.config_file, values=values, overrides=overrides)


def equal_steps(cfg, fraction: float):
    """``cfg`` (a finetuning config) stretched so that a run on ``fraction`` of the labels takes the optimisation
    steps, validations and warm-up of ``cfg``'s run on all of them (epochs / fraction, evaluating as often per sample
    seen)."""
    if fraction >= 1:
        return cfg
    return dataclasses.replace(
        cfg,
        epochs=max(1, round(cfg.epochs / fraction)),
        eval_every=max(1, round(cfg.eval_every / fraction)),
        warmup_epochs=cfg.warmup_epochs / fraction,
    )


def run(cfg: LabelEfficiencyConfig) -> dict[str, Any]:
    """Run (or continue) the whole experiment and return the results table."""
    from mem_core.runs.rundir import RunDir, json_safe
    from mem_core.train import pretrain, tokenizer

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    def timed(name: str, fn):
        t0 = time.perf_counter()
        result = fn()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0
        return result

    tok_path, pre_path = out / "tokenizer", out / "pretrain"
    if not RunDir(tok_path).finished:
        timed("tokenizer", lambda: tokenizer.run(_stage_config(cfg, "tokenizer"), tok_path, resume=tok_path.exists()))
    if not RunDir(pre_path).finished:
        timed(
            "pretrain",
            lambda: pretrain.run(
                _stage_config(cfg, "pretrain"), pre_path, tokenizer=tok_path, resume=pre_path.exists()
            ),
        )
    runs = [
        (out / f"finetune-{arm}-labels{fraction:g}-seed{seed}", arm, fraction, seed, init)
        for fraction in cfg.fractions
        for seed in cfg.seeds
        for arm, init in (("mem", pre_path), ("scratch", None))
    ]
    pending = []
    for path, arm, fraction, seed, init in runs:
        if RunDir(path).finished:
            continue
        ft_cfg = _stage_config(cfg, "finetune", f"seed={seed}", f"data.labels={fraction}", f"data.label_seed={seed}")
        pending.append((path, arm, equal_steps(ft_cfg, fraction) if cfg.equal_steps else ft_cfg, init))
    if pending:
        timed("finetune (all runs, wall clock)", lambda: finetune_all(pending, cfg.jobs, out / "logs"))
    rows = []
    for path, arm, fraction, seed, _ in runs:
        result = json.loads((path / "result.json").read_text())
        curve = [[r["epoch"], r["val_top1"]] for r in RunDir(path).metrics() if "val_top1" in r]
        rows.append(
            {
                "arm": arm,
                "labels": fraction,
                "seed": seed,
                "final_top1": curve[-1][1],
                "best_top1": result["top1"],
                "train_samples": result["train_samples"],
                "epochs": curve[-1][0] + 1,
                "val_curve": curve,
                "run": str(path),
            }
        )
    summary = summarize(rows)
    report = {
        "dataset": cfg.dataset,
        "data": cfg.data,
        "preset": cfg.preset,
        "rows": rows,
        "summary": summary,
        "plotted": "final",
        "seconds": timings,
    }
    (out / "results.json").write_text(json.dumps(json_safe(report), indent=2) + "\n")
    (out / "results.md").write_text(markdown_table(summary, rows) + "\n")
    plot(summary, out / "label_efficiency.png", cfg.dataset)
    plot_curves(rows, out / "val_curves.png", cfg.dataset)
    return report


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
    from mem_core.errors import MemError

    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch threads or locks inherited
    threads = max(1, (os.cpu_count() or 1) // jobs)
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


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds of the final-epoch and best-epoch validation top-1, per arm and label fraction."""
    out = []
    for fraction in sorted({r["labels"] for r in rows}):
        for arm in ("mem", "scratch"):
            sel = [r for r in rows if r["labels"] == fraction and r["arm"] == arm]
            if not sel:
                continue
            final = [r["final_top1"] for r in sel]
            best = [r["best_top1"] for r in sel]
            out.append(
                {
                    "arm": arm,
                    "labels": fraction,
                    "seeds": len(sel),
                    "train_samples": sel[0]["train_samples"],
                    "final_mean": statistics.fmean(final),
                    "final_std": statistics.pstdev(final),
                    "best_mean": statistics.fmean(best),
                    "best_std": statistics.pstdev(best),
                }
            )
    return out


def markdown_table(summary: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """Mean ± std over seeds (final epoch first: the headline), then each seed's final / best epoch."""
    lines = [
        "| labels | train samples | arm | top-1 final epoch (mean ± std) | top-1 best epoch | per seed (final / best) |",
        "|---|---|---|---|---|---|",
    ]
    for s in summary:
        seeds = [r for r in rows if r["labels"] == s["labels"] and r["arm"] == s["arm"]]
        per_seed = ", ".join(f"{100 * r['final_top1']:.1f} / {100 * r['best_top1']:.1f}" for r in seeds)
        lines.append(
            f"| {s['labels']:.0%} | {s['train_samples']} | {s['arm']} | "
            f"{100 * s['final_mean']:.2f} ± {100 * s['final_std']:.2f} | "
            f"{100 * s['best_mean']:.2f} ± {100 * s['best_std']:.2f} | {per_seed} |"
        )
    return "\n".join(lines)


def plot(summary: list[dict[str, Any]], path: Path, dataset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, color in (("mem", "tab:red"), ("scratch", "tab:blue")):
        pts = [s for s in summary if s["arm"] == arm]
        if not pts:
            continue
        xs = [100 * s["labels"] for s in pts]
        ax.errorbar(
            xs,
            [100 * s["final_mean"] for s in pts],
            yerr=[100 * s["final_std"] for s in pts],
            marker="o",
            capsize=4,
            color=color,
            label="MEM pretrained" if arm == "mem" else "from scratch",
        )
    ax.set_xscale("log")
    ax.set(
        xlabel="labelled training samples (%)",
        ylabel="validation top-1 at the final epoch (%)",
        title=f"Label efficiency on {dataset} (mean ± std over seeds)",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(rows: list[dict[str, Any]], path: Path, dataset: str) -> None:
    """Every run's validation top-1 against the share of its training budget, one panel per label fraction: a colour
    per arm, a line style per seed, one legend entry for each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colours = {"mem": "tab:red", "scratch": "tab:blue"}
    seeds = sorted({r["seed"] for r in rows})
    styles = {seed: ("-", "--", ":", "-.")[i % 4] for i, seed in enumerate(seeds)}
    fractions = sorted({r["labels"] for r in rows})
    fig, axes = plt.subplots(1, len(fractions), figsize=(5 * len(fractions), 3.6), squeeze=False, sharey=True)
    for ax, fraction in zip(axes[0], fractions, strict=True):
        for r in (r for r in rows if r["labels"] == fraction):
            epochs, top1 = zip(*r["val_curve"], strict=True)
            ax.plot(
                [100 * (e + 1) / r["epochs"] for e in epochs],
                [100 * t for t in top1],
                color=colours.get(r["arm"], "tab:gray"),
                linestyle=styles[r["seed"]],
                alpha=0.8,
            )
        ax.set(title=f"{fraction:.0%} of the labels", xlabel="training budget (%)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation top-1 (%)")
    arms = [a for a in colours if any(r["arm"] == a for r in rows)]
    handles = [Line2D([], [], color=colours[a], label="MEM" if a == "mem" else "scratch") for a in arms]
    handles += [Line2D([], [], color="0.35", linestyle=styles[s], label=f"seed {s}") for s in seeds]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="lower right")
    fig.suptitle(f"Validation curves on {dataset}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
