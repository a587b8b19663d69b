"""``mem tokenizer / pretrain / finetune / segment / evaluate / export / experiment``: the training commands."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.options import (
    PRESETS_HELP,
    ConfigOpt,
    DataOpt,
    DatasetOpt,
    OutOpt,
    PresetOpt,
    Renamed,
    ResumeOpt,
    SetOpt,
    fail,
    refusing,
    with_options,
)
from app.config import TrainLabelsConfig
from mem_core.train.experiment import STAGE_OVERRIDES, LabelEfficiencyConfig

InitOpt = Annotated[Path | None, typer.Option("--init", help="Pretraining run to start from (default: scratch).")]
LabelFractionOpt = Annotated[
    float | None, typer.Option("--label-fraction", help="Fraction of labelled training samples (data.label_fraction).")
]
OLD_LABELS = Renamed("--labels", "--label-fraction", "--labels names a folder of labelled captures")
VerifyOpt = Annotated[bool, typer.Option("--verify", help="Corpus: read and check every event before training.")]
SkipBadOpt = Annotated[
    bool, typer.Option("--skip-bad", help="Corpus: leave out damaged shards (reported) instead of stopping.")
]
UnlabeledOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--unlabeled",
        help="Unlabeled recordings to learn from beside the training split: a corpus (mem record / mem ingest) or "
        "a folder of event files; repeatable.",
    ),
]
experiment_app = typer.Typer(help="Experiments that reproduce the paper's claims on real data.", no_args_is_help=True)


@dataclass(frozen=True)
class StageRun:
    """The options a training stage starts with: its data and its run directory."""

    dataset: DatasetOpt
    out: OutOpt
    data: DataOpt = None


@dataclass(frozen=True)
class StageRecipe:
    """The options a training stage ends with: its config, and how the run starts and checks its data."""

    preset: PresetOpt = None
    config: ConfigOpt = None
    overrides: SetOpt = None
    resume: ResumeOpt = False
    verify: VerifyOpt = False
    skip_bad: SkipBadOpt = False

    def config_of(self, stage: str, run: StageRun, **values: Any) -> Any:
        """The stage's config from the options (``values`` use dotted keys: ``data.label_fraction``); ``--verify`` and
        ``--skip-bad`` count only when given (a preset may set them)."""
        from mem_core.train.configs import stage_config

        checks = {key: True for key, on in (("data.verify", self.verify), ("data.skip_bad", self.skip_bad)) if on}
        values = {"data.dataset": run.dataset, **({"data.path": str(run.data)} if run.data else {}), **values, **checks}
        return stage_config(
            stage, preset=self.preset, config_file=self.config, values=values, overrides=self.overrides or []
        )


def _unlabeled(paths: list[Path] | None) -> dict[str, Any]:
    return {"data.unlabeled": [str(p) for p in paths]} if paths else {}


@with_options()
def tokenizer(run: StageRun, unlabeled: UnlabeledOpt = None, *, recipe: StageRecipe) -> None:
    """Stage 1: train the dVAE event tokenizer (no labels needed)."""
    from mem_core.train import tokenizer as stage

    result = stage.run(recipe.config_of("tokenizer", run, **_unlabeled(unlabeled)), run.out, resume=recipe.resume)
    typer.echo(f"tokenizer run: {result.path}")


@with_options()
def pretrain(
    run: StageRun,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help="Tokenizer run (MEM targets).")] = None,
    method: Annotated[
        str | None, typer.Option("--method", help="mem (token targets) or emae (pixel targets); default: the config's")
    ] = None,
    unlabeled: UnlabeledOpt = None,
    *,
    recipe: StageRecipe,
) -> None:
    """Stage 2: masked event pretraining (MEM), or the eMAE baseline with --method emae."""
    from mem_core.train import pretrain as stage

    values = {**({"method": method} if method is not None else {}), **_unlabeled(unlabeled)}
    result = stage.run(recipe.config_of("pretrain", run, **values), run.out, tokenizer=tokenizer, resume=recipe.resume)
    typer.echo(f"pretrain run: {result.path}")


@refusing(OLD_LABELS)
@with_options()
def finetune(
    run: StageRun,
    init: InitOpt = None,
    label_fraction: LabelFractionOpt = None,
    probe: Annotated[bool, typer.Option("--probe", help="Linear probing: train only the head.")] = False,
    teacher: Annotated[
        Path | None,
        typer.Option(
            "--teacher",
            help="Distil: learn this finetune run's (or export's) predictions instead of labels, on the training "
            "split's recordings and --unlabeled ones.",
        ),
    ] = None,
    unlabeled: UnlabeledOpt = None,
    *,
    recipe: StageRecipe,
) -> None:
    """Stage 3: finetune a classifier (or --probe linearly), from --init or from scratch (then without layer decay,
    as the experiment's ViT from scratch, unless --set layer_decay=...); with --teacher, distil a finetuned model
    into it on unlabeled recordings."""
    from mem_core.train import finetune as stage

    values = {"probe": probe} if probe else {}
    if teacher is not None:
        values["teacher"] = str(teacher)
    values |= _unlabeled(unlabeled)
    if init is None:
        values["layer_decay"] = stage.SCRATCH_LAYER_DECAY
    if label_fraction is not None:
        values["data.label_fraction"] = label_fraction
    result = stage.run(recipe.config_of("finetune", run, **values), run.out, init=init, resume=recipe.resume)
    typer.echo(f"finetune run: {result.path}")
    typer.echo((result.path / "result.json").read_text() if (result.path / "result.json").exists() else "")


@with_options()
def train_labels(config: TrainLabelsConfig, set_: SetOpt = None) -> None:
    """Finetune a pretraining run on a few labelled captures and export it (what the viewer's Train runs)."""
    from mem_core.train.captures import train_captures

    export = config.export_dir
    result = train_captures(config.labels, config.init, config.out, export, epochs=config.epochs, overrides=set_ or [])
    typer.echo(
        f"held-out captures: top-1 {result['top1']:.3f} on {result['n']} ({', '.join(result['classes'])}); "
        f"exported to {export}"
    )


@refusing(OLD_LABELS)
@with_options()
def segment(
    run: StageRun, init: InitOpt = None, label_fraction: LabelFractionOpt = None, *, recipe: StageRecipe
) -> None:
    """Semantic segmentation (UperNet-style head on the last four blocks), from --init or from scratch (then without
    layer decay unless --set layer_decay=...)."""
    from mem_core.train import segment as stage
    from mem_core.train.finetune import SCRATCH_LAYER_DECAY

    values = {"data.label_fraction": label_fraction} if label_fraction is not None else {}
    if init is None:
        values["layer_decay"] = SCRATCH_LAYER_DECAY
    result = stage.run(recipe.config_of("segment", run, **values), run.out, init=init, resume=recipe.resume)
    typer.echo(f"segment run: {result.path}")


def evaluate(
    model: Annotated[Path, typer.Option("--model", help="A finetune or segment run, or an export directory.")],
    dataset: DatasetOpt,
    data: DataOpt = None,
    split: Annotated[str, typer.Option("--split", help="train, val or test.")] = "val",
    batch_size: Annotated[int, typer.Option("--batch-size")] = 64,
    workers: Annotated[int, typer.Option("--workers", help="DataLoader worker processes.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Last line of stdout is the JSON result.")] = False,
) -> None:
    """Evaluate a trained model on a split (deterministic windows): top-1 and n, or mIoU / mAcc / aAcc."""
    from mem_core.fields import AT_LEAST_0, AT_LEAST_1, check_value
    from mem_core.train.evaluate import evaluate_run

    check_value("--batch-size", batch_size, AT_LEAST_1)
    check_value("--workers", workers, AT_LEAST_0)
    result = evaluate_run(model, dataset, data, split, batch_size=batch_size, num_workers=workers)
    if os.environ.get("RANK", "0") != "0":  # under torchrun every process evaluated its share; one reports
        return
    if as_json:
        print(json.dumps(result))
    elif "top1" in result:
        typer.echo(f"{dataset} {split}: top-1 {result['top1']:.4f} on {result['n']} samples")
    else:
        typer.echo(f"{dataset} {split}: mIoU {result['miou']:.4f} mAcc {result['macc']:.4f} aAcc {result['aacc']:.4f}")


def export(
    model: Annotated[Path, typer.Option("--model", help="A finetune or segment run directory, or an export of one.")],
    out: Annotated[Path, typer.Option("--out", help="Export directory (safetensors + JSON, or ONNX + JSON).")],
    export_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="safetensors (for mem serve with torch) or onnx (model.onnx and tokenizer.onnx: mem serve without "
            "torch, on a board; checked against torch first).",
        ),
    ] = "safetensors",
    check_data: Annotated[
        Path | None,
        typer.Option(
            "--check-data",
            help="With --format onnx: an event file or folder to check onnxruntime against torch on (default: the "
            "validation split the model was trained with, where it is at hand).",
        ),
    ] = None,
) -> None:
    """Export a trained model for the live server: safetensors weights + JSON (architecture, classes, input), or one
    self-contained ONNX model (+ the tokenizer's encoder) that onnxruntime serves without torch."""
    if export_format not in ("safetensors", "onnx"):
        raise typer.BadParameter(f"{export_format!r}: expected safetensors or onnx", param_hint="--format")
    if export_format == "safetensors":
        from mem_core.runs.export import export_run

        if check_data is not None:
            raise typer.BadParameter("checks an ONNX export: add --format onnx", param_hint="--check-data")
        typer.echo(f"exported to {export_run(model, out)}")
        return
    from mem_core.runs.export.onnx import MAX_LOGIT_DIFFERENCE, export_onnx

    done = export_onnx(model, out, check_data=check_data, progress=lambda line: typer.echo(f"mem export: {line}"))
    typer.echo(
        f"onnxruntime against torch on {done.windows} windows: largest logit difference {done.difference:.2g} "
        f"(at most {MAX_LOGIT_DIFFERENCE:g})"
        + ("" if done.tokens_equal is None else f", token ids {done.tokens_equal:.1%} equal")
    )
    typer.echo(f"exported to {done.out} (model.onnx{', tokenizer.onnx' if done.tokens_equal is not None else ''})")


_LE = LabelEfficiencyConfig


@experiment_app.command("label-efficiency")
def label_efficiency(
    out: Annotated[Path, typer.Option("--out", help="Where the experiment writes its runs and results.")] = Path(
        _LE.out
    ),
    dataset: DatasetOpt = _LE.dataset,
    data: DataOpt = None,
    preset: Annotated[str, typer.Option("--preset", help=f"Every stage's preset. {PRESETS_HELP}")] = _LE.preset,
    config: ConfigOpt = None,
    fractions: Annotated[str, typer.Option("--fractions", help="Comma-separated label fractions.")] = ",".join(
        f"{f:g}" for f in _LE.fractions
    ),
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated finetuning seeds.")] = ",".join(
        map(str, _LE.seeds)
    ),
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help=f"STAGE:key=value (STAGE: {', '.join(STAGE_OVERRIDES)}); repeatable."),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option("--jobs", help="Finetuning runs at once, each in its own process (logs in OUT/logs)."),
    ] = _LE.jobs,
    yardstick: Annotated[
        str,
        typer.Option(
            "--yardstick",
            help="The CNN trained from scratch as a third arm (resnet10t, resnet18, resnet34, resnet50) or none.",
        ),
    ] = _LE.yardstick,
    choose_on: Annotated[
        str,
        typer.Option(
            "--choose-on",
            help="The validation split that picks each run's epoch: val, or val-apart (recorded apart from training; "
            "then nothing is held out of the training split, and the pretraining watches val-apart).",
        ),
    ] = _LE.choose_on,
    unlabeled: UnlabeledOpt = None,
    pretrain_budget: Annotated[
        str,
        typer.Option(
            "--pretrain-budget",
            help="With --unlabeled: 'epochs' (the preset's epochs over every recording: more steps) or 'steps' (the "
            "steps of the training split alone).",
        ),
    ] = _LE.pretrain_budget,
    pretrain_per_seed: Annotated[
        bool,
        typer.Option(
            "--pretrain-per-seed",
            help="Each seed pretrains a tokenizer and MEM of its own (seed=SEED), so the spread over seeds holds the "
            "pretraining's; the pretraining takes as many times as there are seeds.",
        ),
    ] = _LE.pretrain_per_seed,
    distill: Annotated[
        bool,
        typer.Option(
            "--distill",
            help="A fourth arm: each MEM run teaches a student from the same pretraining on the unlabeled recordings "
            "(SimCLRv2), with the same steps.",
        ),
    ] = _LE.distill,
    baselines: Annotated[
        bool,
        typer.Option(
            "--baselines/--no-baselines",
            help="Train the arms that see no unlabeled recordings (the ViT from scratch, the yardstick CNN); "
            "--no-baselines runs MEM alone, e.g. another point of 'mem experiment unlabeled-curve', which takes "
            "their bands from the experiments that trained them.",
        ),
    ] = _LE.baselines,
) -> None:
    """Pretrain without labels, then finetune MEM, the same ViT from scratch and a CNN yardstick per label fraction
    and seed; the --choose-on split picks each run's epoch, and every kept model is scored on the data's val,
    val-apart and test splits (test, when there, is the headline)."""
    from mem_core.train.experiment import markdown_report, run

    overrides: dict[str, list[str]] = {}
    for item in set_ or []:
        stage, sep, rest = item.partition(":")
        if not sep or stage not in STAGE_OVERRIDES:
            raise fail(f"--set {item!r}: write STAGE:key=value with STAGE one of {', '.join(STAGE_OVERRIDES)}")
        overrides.setdefault(stage, []).append(rest)
    try:
        cfg = LabelEfficiencyConfig(
            dataset=dataset,
            data=str(data) if data else None,
            out=str(out),
            preset=preset,
            config_file=str(config) if config else None,
            fractions=tuple(float(f) for f in fractions.split(",")),
            seeds=tuple(int(s) for s in seeds.split(",")),
            overrides=overrides,
            jobs=jobs,
            yardstick=yardstick,
            choose_on=choose_on,
            unlabeled=tuple(str(p) for p in unlabeled or ()),
            pretrain_budget=pretrain_budget,
            pretrain_per_seed=pretrain_per_seed,
            distill=distill,
            baselines=baselines,
        )
    except ValueError as exc:
        raise fail(f"--fractions/--seeds/--jobs/--yardstick/--choose-on/--pretrain-budget: {exc}") from None
    report = run(cfg)
    typer.echo(markdown_report(report))
    typer.echo(f"results: {out / 'results.json'}, plot: {out / 'label_efficiency.png'}")


@experiment_app.command("unlabeled-curve")
def unlabeled_curve(
    experiments: Annotated[
        list[Path],
        typer.Argument(
            help="Finished label-efficiency experiments (their --out) that differ in what MEM saw, or curves written "
            "before (their unlabeled_curve.json: every experiment they were drawn from)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Where the table, JSON and plot go.")] = Path(
        "runs/unlabeled-curve"
    ),
) -> None:
    """MEM's accuracy against the unlabeled recordings it was pretrained on, from several experiments (--unlabeled,
    --pretrain-budget), the arms without pretraining as bands: unlabeled_curve.{md,json,png}."""
    from mem_core.train.experiment_curve import markdown_curve, write_curve

    result = write_curve(experiments, out)
    typer.echo(markdown_curve(result))
    typer.echo(f"plot: {out / 'unlabeled_curve.png'}")


@experiment_app.command("recipes")
def experiment_recipes(
    base: Annotated[Path, typer.Argument(help="The finished label-efficiency experiment (its --out) with the recipe.")],
    variants: Annotated[
        list[Path],
        typer.Argument(
            help="Finished experiments with the same data, seeds and choosing split, some arm trained otherwise."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Where recipes.json and recipes.md go.")] = Path("runs/recipes"),
) -> None:
    """Each variant against the recipe, seed by seed: what changed (read off the runs' configs), the gain on every
    scored split, taken when it gains on the split the experiments chose on: recipes.{md,json}."""
    from mem_core.train.experiment_recipes import markdown_recipes, write_recipes

    typer.echo(markdown_recipes(write_recipes(base, variants, out)))
