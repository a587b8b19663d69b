"""The ``mem`` command line. It only parses arguments, builds a config and calls one library function."""

from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="mem",
    help="Masked Event Modeling: self-supervised learning for event cameras.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
experiment_app = typer.Typer(help="Experiments that reproduce the paper's claims on real data.", no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")

DatasetOpt = Annotated[
    str,
    typer.Option("--dataset", help="Dataset name: ncars, nmnist, ncaltech101, nimagenet, dsec-semantic, corpus, sim."),
]
DataOpt = Annotated[Path | None, typer.Option("--data", help="Dataset root or corpus directory.")]
OutOpt = Annotated[Path, typer.Option("--out", help="Run directory to write.")]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="Bundled preset: cpu-tiny, paper-ncars, ...")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config file (one table per stage).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config field: key=value (repeatable).")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --out.")]


def fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def _stage_config(stage: str, dataset: str, data: Path | None, preset, config, overrides, **extra):
    from mem_core.configuration import resolve
    from mem_core.train.configs import STAGES

    base = {"data.dataset": dataset, **({"data.path": str(data)} if data else {}), **extra}
    return resolve(STAGES[stage], stage, preset=preset, config_file=config, overrides=overrides or [], base=base)


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="An event file or a corpus directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Describe an event file (format, events, sensor, time range, ON/OFF) or a corpus directory."""
    if path.is_dir():
        from mem_core.corpus import Corpus

        with Corpus(path) as corpus:
            info = corpus.describe()
    else:
        from mem_core.io import describe

        info = describe(path)
    if as_json:
        print(json.dumps(info))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=str(path), show_header=False)
    for key, value in info.items():
        table.add_row(key, str(value))
    Console().print(table)


@app.command()
def tokenizer(
    dataset: DatasetOpt,
    out: OutOpt,
    data: DataOpt = None,
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    resume: ResumeOpt = False,
) -> None:
    """Stage 1: train the dVAE event tokenizer (no labels needed)."""
    from mem_core.train import tokenizer as stage

    cfg = _stage_config("tokenizer", dataset, data, preset, config, set_)
    run = stage.run(cfg, out, resume=resume)
    typer.echo(f"tokenizer run: {run.path}")


@app.command()
def pretrain(
    dataset: DatasetOpt,
    out: OutOpt,
    data: DataOpt = None,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help="Tokenizer run (MEM targets).")] = None,
    method: Annotated[str, typer.Option("--method", help="mem (token targets) or emae (pixel targets).")] = "mem",
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    resume: ResumeOpt = False,
) -> None:
    """Stage 2: masked event pretraining (MEM), or the eMAE baseline with --method emae."""
    from mem_core.train import pretrain as stage

    cfg = _stage_config("pretrain", dataset, data, preset, config, set_, method=method)
    run = stage.run(cfg, out, tokenizer=tokenizer, resume=resume)
    typer.echo(f"pretrain run: {run.path}")


@app.command()
def finetune(
    dataset: DatasetOpt,
    out: OutOpt,
    data: DataOpt = None,
    init: Annotated[
        Path | None, typer.Option("--init", help="Pretraining run to start from (default: scratch).")
    ] = None,
    labels: Annotated[float | None, typer.Option("--labels", help="Fraction of labelled training samples.")] = None,
    probe: Annotated[bool, typer.Option("--probe", help="Linear probing: train only the head.")] = False,
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    resume: ResumeOpt = False,
) -> None:
    """Stage 3: finetune a classifier (or --probe linearly), from --init or from scratch."""
    from mem_core.train import finetune as stage

    extra = {"probe": probe} if probe else {}
    if labels is not None:
        extra["data.labels"] = labels
    cfg = _stage_config("finetune", dataset, data, preset, config, set_, **extra)
    run = stage.run(cfg, out, init=init, resume=resume)
    typer.echo(f"finetune run: {run.path}")
    typer.echo((run.path / "result.json").read_text() if (run.path / "result.json").exists() else "")


@app.command()
def segment(
    dataset: DatasetOpt,
    out: OutOpt,
    data: DataOpt = None,
    init: Annotated[
        Path | None, typer.Option("--init", help="Pretraining run to start from (default: scratch).")
    ] = None,
    labels: Annotated[float | None, typer.Option("--labels", help="Fraction of labelled training samples.")] = None,
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    resume: ResumeOpt = False,
) -> None:
    """Semantic segmentation (UperNet-style head on the last four blocks), from --init or from scratch."""
    from mem_core.train import segment as stage

    extra = {"data.labels": labels} if labels is not None else {}
    cfg = _stage_config("segment", dataset, data, preset, config, set_, **extra)
    run = stage.run(cfg, out, init=init, resume=resume)
    typer.echo(f"segment run: {run.path}")


@app.command()
def evaluate(
    model: Annotated[Path, typer.Option("--model", help="A finetune or segment run directory.")],
    dataset: DatasetOpt,
    data: DataOpt = None,
    split: Annotated[str, typer.Option("--split", help="train, val or test.")] = "val",
    batch_size: Annotated[int, typer.Option("--batch-size")] = 64,
    workers: Annotated[int, typer.Option("--workers", help="DataLoader worker processes.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Last line of stdout is the JSON result.")] = False,
) -> None:
    """Evaluate a trained model on a split (deterministic windows): top-1 and n, or mIoU / mAcc / aAcc."""
    from mem_core.train.evaluate import evaluate_run

    result = evaluate_run(model, dataset, data, split, batch_size=batch_size, num_workers=workers)
    if as_json:
        print(json.dumps(result))
    elif "top1" in result:
        typer.echo(f"{dataset} {split}: top-1 {result['top1']:.4f} on {result['n']} samples")
    else:
        typer.echo(f"{dataset} {split}: mIoU {result['miou']:.4f} mAcc {result['macc']:.4f} aAcc {result['aacc']:.4f}")


@app.command()
def export(
    model: Annotated[Path, typer.Option("--model", help="A finetune or segment run directory.")],
    out: Annotated[Path, typer.Option("--out", help="Export directory (safetensors + JSON).")],
) -> None:
    """Export a trained model for the live server: safetensors weights + JSON (architecture, classes, input)."""
    from mem_core.export import export_run

    path = export_run(model, out)
    typer.echo(f"exported to {path}")


@experiment_app.command("label-efficiency")
def label_efficiency(
    out: OutOpt,
    dataset: DatasetOpt = "ncars",
    data: DataOpt = None,
    preset: Annotated[str, typer.Option("--preset", help="Preset of every stage.")] = "cpu-tiny",
    config: ConfigOpt = None,
    fractions: Annotated[str, typer.Option("--fractions", help="Comma-separated label fractions.")] = "0.1,1.0",
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated finetuning seeds.")] = "0,1,2",
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="STAGE:key=value (STAGE: tokenizer, pretrain, finetune or all); repeatable."),
    ] = None,
) -> None:
    """Pretrain without labels, then finetune MEM and scratch models per label fraction and seed; table + plot."""
    from mem_core.train.experiment import LabelEfficiencyConfig, run

    overrides: dict[str, list[str]] = {}
    for item in set_ or []:
        stage, sep, rest = item.partition(":")
        if not sep or stage not in ("tokenizer", "pretrain", "finetune", "all"):
            fail(f"--set {item!r}: write STAGE:key=value with STAGE tokenizer, pretrain, finetune or all")
        overrides.setdefault(stage, []).append(rest)
    try:
        cfg = LabelEfficiencyConfig(
            dataset=dataset,
            data=str(data) if data else "",
            out=str(out),
            preset=preset,
            config_file=str(config) if config else None,
            fractions=tuple(float(f) for f in fractions.split(",")),
            seeds=tuple(int(s) for s in seeds.split(",")),
            overrides=overrides,
        )
    except ValueError as exc:
        fail(f"--fractions/--seeds: {exc}")
    report = run(cfg)
    from mem_core.train.experiment import markdown_table

    typer.echo(markdown_table(report["summary"]))
    typer.echo(f"results: {out / 'results.json'}, plot: {out / 'label_efficiency.png'}")


def _register_commands() -> None:
    """Commands whose code lives in its own module (recording and ingest, the live app, the demo), and command
    groups other packages add through the ``mem.commands`` entry point (``mem bench``, from ``bench/``)."""
    from app import demo, live_cli, record_cli

    app.command("record")(record_cli.record)
    app.command("ingest")(record_cli.ingest)
    app.command("serve")(live_cli.serve)
    app.command("view")(live_cli.view)
    app.command("demo")(demo.demo)
    for plugin in entry_points(group="mem.commands"):
        app.add_typer(plugin.load(), name=plugin.name)


_register_commands()


def main() -> None:
    """Entry point: bad input (``MemError``, a missing file) becomes one clear line and exit status 2."""
    from mem_core.errors import MemError

    try:
        app()
    except (MemError, FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
