"""``mem bench``: the benchmarks as a command group. ``mem`` finds it through the ``mem.commands`` entry point
(pyproject.toml), so no product code imports ``bench``; each command imports its benchmark only when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli.options import Renamed, refusing, writable_file
from app.cli.train import OLD_LABELS
from mem_core.fields import AT_LEAST_0, AT_LEAST_1, Range, WindowEvents, check_value
from mem_core.limits import MAX_SYNTHETIC_MEV_S

app = typer.Typer(help="Benchmarks: print a table and write JSON.", no_args_is_help=True)
SYNTHETIC_MEV_S = Range(0, MAX_SYNTHETIC_MEV_S, lo_open=True)  # what the live server's synthetic:MEV_S source takes
OLD_JSON = Renamed("--json", "--json-out", "--json alone asks evaluate and inspect to print JSON")
JsonOpt = Annotated[
    Path | None, typer.Option("--json-out", help="Write the results as JSON here.", callback=writable_file)
]


@app.command("data")
@refusing(OLD_JSON)
def data(json_path: JsonOpt = None) -> None:
    """Histogram throughput, window pipeline latency and DataLoader throughput."""
    from bench import bench_data

    bench_data.main(json_path)


@app.command("aedat4")
@refusing(OLD_JSON)
def aedat4(json_path: JsonOpt = None) -> None:
    """AEDAT4 read Mev/s: read_events vs dv-processing's own reader, a real file and a 3 M-event one."""
    from bench import bench_aedat4

    bench_aedat4.main(json_path)


@app.command("record")
@refusing(OLD_JSON)
def record(json_path: JsonOpt = None) -> None:
    """Ingest Mev/s per core (real N-Cars/N-MNIST, synthetic .dat/.bin) and recording Mev/s with loss."""
    from bench import bench_record

    bench_record.main(json_path)


@app.command("live")
@refusing(OLD_JSON, Renamed("--model", "--size", "--model names a run or export directory elsewhere"))
def live(
    json_path: JsonOpt = None,
    model: Annotated[
        str, typer.Option("--size", help="The model's size: cpu-tiny or vit-b (random init).")
    ] = "cpu-tiny",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N].")] = "cpu",
    viewer: Annotated[
        bool, typer.Option("--viewer/--no-viewer", help="Attach and measure the Qt viewer (a machine without Qt: no).")
    ] = True,
    rate: Annotated[float, typer.Option("--rate", help="The synthetic source's rate, Mev/s.")] = 30.0,
    starts: Annotated[int, typer.Option("--starts", help="`mem serve` launches to time (0: skip).")] = 3,
    variants: Annotated[
        str,
        typer.Option(
            "--variants",
            help="Comma-separated predictor variants timed alone, side by side, the first the reference: eager (as "
            "mem serve builds it) or switches joined by +: bf16-weights, cuda-graph.",
        ),
    ] = "",
    serve_with: Annotated[str, typer.Option("--serve-with", help="The predictor variant the server runs.")] = "eager",
    server: Annotated[
        bool, typer.Option("--server/--no-server", help="Run the server part (and the viewer's, and the starts).")
    ] = True,
) -> None:
    """Live server throughput and latency under a synthetic source (30 Mev/s unless --rate), and the viewer's frame
    rate; with --variants, the predictor alone under each."""
    from bench import bench_live

    check_value("--rate", rate, SYNTHETIC_MEV_S)
    check_value("--starts", starts, AT_LEAST_0)
    compared = tuple(v.strip() for v in variants.split(",") if v.strip())
    for variant, hint in (*((v, "--variants") for v in compared), (serve_with, "--serve-with")):
        try:
            bench_live.predictor_switches(variant)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint=hint) from None
    bench_live.main(
        json_path, model, device, viewer, rate * 1e6, starts, variants=compared, serve_with=serve_with, server=server
    )


@app.command("deploy")
@refusing(OLD_JSON)
def deploy(
    json_path: JsonOpt = None,
    sizes: Annotated[str, typer.Option("--sizes", help="Comma-separated: cpu-small, vit-b (random weights).")] = (
        "cpu-small,vit-b"
    ),
    starts: Annotated[int, typer.Option("--starts", help="`mem serve` launches per runtime (0: skip).")] = 3,
    trained: Annotated[
        Path | None,
        typer.Option("--trained", help="A finetune run on N-Cars: top-1 on ncars-dev/test of torch, ONNX and int8."),
    ] = None,
    accuracy_samples: Annotated[
        int | None, typer.Option("--accuracy-samples", help="Test samples for --trained (default: all).")
    ] = None,
    threads: Annotated[
        str, typer.Option("--threads", help="Comma-separated thread counts to time windows on.")
    ] = "1,2",
) -> None:
    """The live path with torch against the ONNX model in onnxruntime: start to first prediction, memory, window
    latency on 1 and 2 threads, and int8 quantization (speed; accuracy with --trained)."""
    from bench import bench_deploy

    check_value("--starts", starts, AT_LEAST_0)
    check_value("--accuracy-samples", accuracy_samples, AT_LEAST_1)
    chosen = tuple(s.strip() for s in sizes.split(",") if s.strip())
    if not chosen or any(s not in bench_deploy.SIZES for s in chosen):
        raise typer.BadParameter(f"{sizes!r}: expected some of {', '.join(bench_deploy.SIZES)}", param_hint="--sizes")
    try:
        counts = tuple(int(t) for t in threads.split(",") if t.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise typer.BadParameter(f"{threads!r}: expected thread counts such as 1,2", param_hint="--threads")
    bench_deploy.main(json_path, chosen, starts, trained, accuracy_samples, counts)


@app.command("train")
@refusing(OLD_JSON, Renamed("--events", "--window-events", "events per window, as mem serve --window-events"))
def train(
    json_path: JsonOpt = None,
    preset: Annotated[
        str, typer.Option("--preset", help="The preset whose model sizes and batches to measure.")
    ] = "cpu-tiny",
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda[:N].")] = "auto",
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the models.")] = False,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", help="Batch of every stage (default: the preset's; at most 64 on a CPU)."),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Timed steps per stage (after 3 warm-up steps).")] = 10,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="Write each stage's torch.profiler table into this folder.")
    ] = None,
    sensor: Annotated[
        str,
        typer.Option("--sensor", help="WIDTHxHEIGHT of the synthetic windows (N-Cars: 120x100; N-ImageNet: 640x480)."),
    ] = "640x480",
    window_events: Annotated[
        int | None,
        typer.Option("--window-events", help="Events per synthetic window (default: the preset's n_max)."),
    ] = None,
    sync_check: Annotated[
        bool,
        typer.Option(
            "--sync-check",
            help="On a GPU, run one more step of each stage in CUDA's sync debug mode and list where the host waited.",
        ),
    ] = False,
    stages: Annotated[
        str, typer.Option("--stages", help="Comma-separated stages to time: tokenizer, pretrain, finetune.")
    ] = "tokenizer,pretrain,finetune",
    loader: Annotated[bool, typer.Option("--loader/--no-loader", help="Also measure the training DataLoader.")] = True,
    variants: Annotated[
        str,
        typer.Option(
            "--variants",
            help="Comma-separated variants measured side by side, the first the reference: eager (no switch) or "
            "switches joined by +: compile, blocks, flex, bf16-targets.",
        ),
    ] = "",
) -> None:
    """Training steps per second of the tokenizer, pretraining and finetuning, peak GPU memory, loader rate."""
    from mem_core.events import SensorSize, sensor_problem

    try:
        width, height = (int(v) for v in sensor.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(
            f"{sensor!r} is not WIDTHxHEIGHT in pixels, e.g. 120x100", param_hint="--sensor"
        ) from None
    size = SensorSize(height, width)
    if problem := sensor_problem(size):
        raise typer.BadParameter(problem, param_hint="--sensor")
    from bench import bench_train

    check_value("--window-events", window_events, WindowEvents)

    chosen = tuple(s.strip() for s in stages.split(",") if s.strip())
    if not chosen or any(s not in bench_train.STAGES for s in chosen):
        raise typer.BadParameter(
            f"{stages!r}: name one or more of {', '.join(bench_train.STAGES)}", param_hint="--stages"
        )
    compared = tuple(v.strip() for v in variants.split(",") if v.strip())
    for variant in compared:
        try:
            bench_train.parse_variant(variant)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--variants") from None
    if compared and compile_model:
        raise typer.BadParameter("name compile (or blocks) as a variant instead", param_hint="--compile")
    bench_train.main(
        json_path,
        preset,
        device,
        compile_model,
        batch_size,
        steps,
        profile=profile,
        sensor=size,
        events=window_events,
        sync_check=sync_check,
        stages=chosen,
        loader=loader,
        variants=compared,
    )


@app.command("cnn-reference")
@refusing(OLD_JSON, OLD_LABELS)
def cnn_reference(
    dataset: Annotated[str, typer.Option("--dataset", help="A labelled dataset (ncars, nmnist, ...).")],
    json_path: JsonOpt = None,
    data: Annotated[Path | None, typer.Option("--data", help="Dataset root.")] = None,
    preset: Annotated[str, typer.Option("--preset", help="The preset whose finetuning input to use.")] = "cpu-small",
    label_fraction: Annotated[
        float, typer.Option("--label-fraction", help="Fraction of labelled training samples.")
    ] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Weights, augmentation and label subset.")] = 0,
    epochs: Annotated[
        int, typer.Option("--epochs", help="Epochs with all labels (below: as many as make up their steps).")
    ] = 20,
    arch: Annotated[str, typer.Option("--arch", help="A timm CNN, trained from scratch.")] = "resnet18",
    out: Annotated[Path | None, typer.Option("--out", help="Keep the run directory here.")] = None,
) -> None:
    """Validation top-1 of a CNN trained from scratch on a preset's finetuning input: what the input allows."""
    from bench import cnn_reference as bench

    bench.main(json_path, dataset, data, preset, label_fraction, seed, epochs, arch, out=out)
