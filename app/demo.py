"""``mem demo``: the whole product on the built-in simulated camera, in minutes on a CPU.

1. record an unlabeled corpus from the simulated camera (``recorders.record``),
2. train the tokenizer and pretrain MEM on it (no labels),
3. for each label seed, finetune a MEM-initialised and a from-scratch classifier on the same few labels,
4. evaluate every run on held-out simulated samples; print the per-seed table and MEM's lead, write
   ``results.json``,
5. export the MEM model and start the live server + viewer on the simulated camera (headless: snapshots and a
   report instead of a window).

Every step writes under ``--out`` and is reused by the next run unless ``--fresh``.

The task is built so that the unlabeled recording carries what the labels cannot: 10 labelled 50 ms windows per
shape against a minute of unlabeled camera time (about 700 windows). With so few labels a ViT from scratch does not
learn what an outline is; pretraining has learned it from the recording. 10 was measured against 5, 20 and 40 labels
per class over label seeds (docs/RESULTS.md section 7): the widest lead for the least finetuning time.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from app.config import DemoConfig

# The demo's recipe: cpu-tiny with windows the size of a simulated sample (50 ms, ~5 000 events).
DEMO_INPUT = ["input.n_max=5000", "data.num_workers=1"]
STAGE_SETTINGS = {
    # ~430 steps (an epoch reads the 60 s corpus once, ~700 windows): codebook usage ~70-80 %
    "tokenizer": [
        "epochs=40",
        "batch_size=64",
        "lr=1e-3",
        "lr_gamma=0.95",
        "model.temperature_anneal_steps=400",
        "eval_every=5",
    ],
    # ~1000 steps: small batches buy more steps from the same minute of camera time
    "pretrain": ["epochs=50", "batch_size=32", "warmup_steps=50", "eval_every=5"],
    # 10 labels per class are 50 windows: a batch holds them all, 150 steps
    "finetune": [
        "epochs=150",
        "batch_size=50",
        "warmup_epochs=10",
        "eval_every=25",
        "head_init_scale=1.0",
        "input.randaug_ops=0",
    ],
}
CORPUS_SIM_SECONDS = 60
LIVE_SECONDS = 12
SERVER_START_S = 120  # the longest the live server may take to publish its first message


def say(message: str) -> None:
    from rich.console import Console

    # soft wrap: a line's words are never broken onto the next line, so what scripts and tests read does not depend
    # on the terminal's width or the length of a path
    Console(stderr=True, soft_wrap=True).print(f"[bold cyan]mem demo[/] {message}")


def demo_stage_config(stage: str, dataset: str, *extra: str):
    from mem_core.train.configs import stage_config

    overrides = [*DEMO_INPUT, *STAGE_SETTINGS[stage], *extra]
    return stage_config(stage, preset="cpu-tiny", values={"data.dataset": dataset}, overrides=overrides)


def record_corpus(corpus: Path) -> None:
    from mem_core.simulator import task_config
    from recorders.config import RecordConfig
    from recorders.record import run
    from recorders.simulated import SimulatorSource

    if (corpus / "manifest.json").exists():
        say(f"corpus {corpus} exists: reusing it")
        return
    say(f"recording {CORPUS_SIM_SECONDS} s of the simulated camera (as fast as it computes) into {corpus}")
    source = SimulatorSource(task_config(seed=7), speed=0, duration_us=CORPUS_SIM_SECONDS * 1_000_000)
    result = run(RecordConfig(source="sim", out=corpus, name="sim-session", speed=0), source=source)
    if result.error:
        raise RuntimeError(f"recording the demo corpus failed: {result.error}")
    say(f"recorded {result.stored:,} events in {result.seconds:.1f} s")


def label_fraction(labels_per_class: int) -> float:
    """The share of the simulated train split that ``labels_per_class`` labelled samples per class make."""
    from mem_core.datasets.sim import SIM_SPLITS

    per_class = SIM_SPLITS["train"][0]
    if not 0 < labels_per_class <= per_class:
        raise ValueError(
            f"labels per class must be in 1..{per_class} (the simulated train split), got {labels_per_class}"
        )
    return labels_per_class / per_class


def finetune_runs(cfg: DemoConfig) -> dict[tuple[str, int], Path]:
    """The finetuning run of each (arm, label seed): one set per label count, so another ``--labels-per-class``
    trains its own runs and reuses the corpus, tokenizer and pretraining."""
    return {
        (arm, seed): cfg.out / f"finetune-{arm}-{cfg.labels_per_class}-labels-seed{seed}"
        for seed in cfg.label_seeds
        for arm in ("mem", "scratch")
    }


def train_all(cfg: DemoConfig) -> dict[str, Path]:
    """Record, tokenizer, pretraining, then every finetuning run; returns the unlabeled stages' run directories."""
    from mem_core.runs.rundir import RunDir
    from mem_core.train import pretrain, tokenizer
    from mem_core.train.experiment import finetune_all

    fraction = label_fraction(cfg.labels_per_class)
    out = cfg.out
    corpus = out / "corpus"
    record_corpus(corpus)
    runs = {name: out / name for name in ("tokenizer", "pretrain")}
    if not RunDir(runs["tokenizer"]).finished:
        say("stage 1: training the event tokenizer on the unlabeled corpus")
        cfg_tok = demo_stage_config("tokenizer", "corpus", f"data.path={corpus}")
        tokenizer.run(cfg_tok, runs["tokenizer"], resume=runs["tokenizer"].exists())
    if not RunDir(runs["pretrain"]).finished:
        say("stage 2: masked event pretraining on the unlabeled corpus")
        cfg_pre = demo_stage_config("pretrain", "corpus", f"data.path={corpus}")
        pretrain.run(cfg_pre, runs["pretrain"], tokenizer=runs["tokenizer"], resume=runs["pretrain"].exists())
    pending = []
    for (arm, seed), path in finetune_runs(cfg).items():
        if RunDir(path).finished:
            continue
        # the label seed draws which samples are labelled, the same ones for both arms; the run seed follows it
        ft = demo_stage_config("finetune", "sim", f"data.labels={fraction}", f"data.label_seed={seed}", f"seed={seed}")
        pending.append((path, arm, ft, runs["pretrain"] if arm == "mem" else None))
    if pending:
        say(
            f"stage 3: finetuning MEM and from-scratch models with {cfg.labels_per_class} labels per class, "
            f"label seeds {', '.join(map(str, cfg.label_seeds))}"
        )
    finetune_all(pending, cfg.jobs, out / "logs")
    return runs


def evaluate_all(cfg: DemoConfig) -> dict:
    """Top-1 (%) of every finetuning run on the held-out test split, per label seed, with the means and MEM's lead."""
    from mem_core.train.evaluate import evaluate_runs

    runs = finetune_runs(cfg)
    results = dict(zip(runs, evaluate_runs(list(runs.values()), "sim", None, "test", num_workers=0), strict=True))
    seeds = [
        {"label_seed": seed} | {arm: round(100 * results[arm, seed]["top1"], 1) for arm in ("mem", "scratch")}
        for seed in cfg.label_seeds
    ]
    n = next(iter(results.values()))["n"]
    leads = [row["mem"] - row["scratch"] for row in seeds]
    mean = {arm: round(sum(row[arm] for row in seeds) / len(seeds), 1) for arm in ("mem", "scratch")}
    return {
        "labels_per_class": cfg.labels_per_class,
        "test_samples": n,
        "seeds": seeds,
        "mean": mean,
        "lead": {"mean": round(sum(leads) / len(leads), 1), "min": round(min(leads), 1)},
        "mem_wins_every_seed": all(lead > 0 for lead in leads),
    }


def print_table(results: dict) -> str:
    """Print MEM and scratch per label seed, their means and MEM's lead; returns the same table as Markdown."""
    from rich.console import Console
    from rich.table import Table

    lpc, n = results["labels_per_class"], results["test_samples"]
    table = Table(title=f"Simulated camera, {lpc} labels per class, top-1 on {n} held-out test samples")
    for column in ("label seed", "MEM (pretrained, finetuned)", "ViT from scratch", "MEM's lead"):
        table.add_column(column, justify="right")
    rows = [
        (
            str(row["label_seed"]),
            f"{row['mem']:.1f} %",
            f"{row['scratch']:.1f} %",
            f"{row['mem'] - row['scratch']:+.1f}",
        )
        for row in results["seeds"]
    ]
    mean, lead = results["mean"], results["lead"]
    rows.append(("mean", f"{mean['mem']:.1f} %", f"{mean['scratch']:.1f} %", f"{lead['mean']:+.1f}"))
    for i, row in enumerate(rows):
        table.add_row(*row, end_section=i == len(rows) - 2)
    Console().print(table)
    if results["mem_wins_every_seed"]:
        say(f"MEM leads on every label seed: by {lead['mean']:+.1f} points on average, {lead['min']:+.1f} at the least")
    else:
        say(f"MEM's lead is {lead['mean']:+.1f} points on average and {lead['min']:+.1f} on its worst label seed")
    lines = ["| label seed | MEM (pretrained, finetuned) | ViT from scratch | MEM's lead |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live(export_dir: Path, out: Path, headless: bool) -> dict | None:
    """Start ``mem serve`` on the simulated camera and ``mem view`` as users would; headless: one snapshot."""
    from mem_core.datasets.sim import SIM_DURATION_US

    port = _free_port()
    pub = f"tcp://127.0.0.1:{port}"
    base = [sys.executable, "-m", "app.cli"]
    # windows as long as the labelled samples the model learned from (50 ms), not 5 000 events of any length
    window_ms = str(SIM_DURATION_US // 1000)
    serve_cmd = [*base, "serve", "--model", str(export_dir), "--source", "sim", "--pub", pub, "--window-ms", window_ms]
    env = dict(os.environ)
    if headless:
        env["QT_QPA_PLATFORM"] = "offscreen"
        serve_cmd += ["--duration", str(LIVE_SECONDS + SERVER_START_S)]
    say(f"live: mem serve on the simulated camera, publishing on {pub}")
    server = subprocess.Popen(serve_cmd, env=env)
    try:
        _wait_for_server(pub, server)
        view_cmd = [*base, "view", "--connect", pub]
        if headless:
            snapshot = out / "live.png"
            view_cmd += ["--snapshot", str(snapshot), "--quit-after", str(LIVE_SECONDS)]
            say(f"live: headless viewer for {LIVE_SECONDS} s, snapshot -> {snapshot}")
            subprocess.run(view_cmd, env=env, check=True, timeout=LIVE_SECONDS + 120)
            state_path = snapshot.with_suffix(".json")
            return json.loads(state_path.read_text()) if state_path.exists() else None
        say("live: opening the viewer (close the window to finish)")
        subprocess.run(view_cmd, env=env, check=False)
        return None
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def _wait_for_server(pub: str, server: subprocess.Popen) -> None:
    """Block until ``mem serve`` publishes its first prediction, so the headless viewer's seconds are spent on
    predicted frames: the server streams sensor views while it loads the model, and on a fresh clone it first
    compiles its kernels, which can take longer than the viewer's whole window."""
    import zmq

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"pred")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(pub)
    deadline = time.monotonic() + SERVER_START_S
    try:
        while not sub.poll(250):
            if server.poll() is not None:
                raise RuntimeError(f"mem serve exited with code {server.returncode} before predicting on {pub}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"mem serve published no prediction on {pub} within {SERVER_START_S} s")
    finally:
        sub.close()


def write_report(cfg: DemoConfig, runs: dict[str, Path], table_md: str, live_state: dict | None) -> Path:
    from mem_core.simulator import task_config

    out = cfg.out
    pictures = {
        "tokenizer reconstructions (top: input histograms, bottom: decoded tokens)": runs["tokenizer"]
        / "reconstructions.png",
        "most used codebook entries": runs["tokenizer"] / "codebook.png",
        "masked event modeling (rows: input, masked input, predicted tokens decoded, target tokens decoded)": runs[
            "pretrain"
        ]
        / "predictions.png",
    }
    first_seed, finetuned = cfg.label_seeds[0], finetune_runs(cfg)
    for arm, name in (("mem", "MEM"), ("scratch", "scratch")):
        pictures[f"finetuning curves ({name}, label seed {first_seed})"] = finetuned[arm, first_seed] / "curves.png"
    n_classes = len(task_config().classes)
    lines = [
        "# MEM demo report",
        "",
        f"The simulated camera's {n_classes} shapes (chance {100 / n_classes:.0f} %), {cfg.labels_per_class} labels per"
        f" class, drawn anew for each label seed. MEM was pretrained on a {CORPUS_SIM_SECONDS} s recording without"
        " labels; the from-scratch ViT has the same architecture, finetuning recipe and labels. Top-1 on held-out"
        " simulated windows (`results.json`):",
        "",
        table_md,
        "",
    ]
    if live_state:
        lines += ["## Live: the exported model on the simulated camera", "", *_live_summary(live_state), ""]
        lines += ["The viewer's whole state is in `live.json`.", ""]
    if (out / "live.png").exists():
        (out / "report").mkdir(exist_ok=True)
        shutil.copy2(out / "live.png", out / "report" / "live.png")
        lines += ["![the live viewer: histogram, token grid, top-k, timeline](report/live.png)", ""]
    for title, path in pictures.items():
        if path.exists():
            target = out / "report" / path.name.replace(".png", f"-{path.parent.name}.png")
            target.parent.mkdir(exist_ok=True)
            shutil.copy2(path, target)
            lines += [f"## {title}", "", f"![{title}]({target.relative_to(out)})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


def _live_summary(state: dict) -> list[str]:
    """The headless viewer's state at the snapshot, as Markdown bullets."""
    stats, messages = state.get("stats") or {}, state.get("messages") or {}
    lines = [f"- link: {state.get('link')}, {state.get('frames_shown', 0)} frames in {state.get('elapsed_s', 0):.0f} s"]
    top = ((state.get("prediction") or {}).get("top_k") or [None])[0]
    if top:
        lines.append(f"- prediction at the snapshot: {top['name']} ({100 * top['prob']:.0f} %)")
    if stats.get("window_events") is not None:
        lines.append(f"- window: {stats['window_events']:,} events over {stats.get('window_ms', 0):.0f} ms")
    latency = stats.get("latency_ms") or {}
    if latency:
        lines.append(f"- server latency: p50 {latency.get('p50', 0):.1f} ms, p95 {latency.get('p95', 0):.1f} ms")
    lines.append(f"- messages: {messages.get('received', 0)} received, {messages.get('missed', 0)} missed")
    return lines


def has_display() -> bool:
    """Whether the viewer can open a window here; says why not (then the demo runs headless)."""
    from app.qt_platform import window_problem

    problem = window_problem()
    if problem is not None and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        say(f"no live window: {problem}")
    return problem is None


# What the demo writes into its folder: --fresh deletes the folder only when it holds nothing else.
DEMO_ENTRIES = (
    *("corpus", "tokenizer", "pretrain", "finetune-*", "logs", "export"),
    *("report", "report.md", "results.json", "live.png", "live.json"),
)


def run(cfg: DemoConfig) -> Path:
    from mem_core.runs.rundir import RunError, make_dir

    make_dir(cfg.out, "the demo's work")
    if cfg.fresh:
        foreign = [p.name for p in cfg.out.iterdir() if not any(fnmatch.fnmatch(p.name, e) for e in DEMO_ENTRIES)]
        if foreign:
            raise RunError(f"{cfg.out}: holds {foreign[0]!r}, not the demo's: --fresh would delete it with the folder")
        shutil.rmtree(cfg.out)
        cfg.out.mkdir()
    t0 = time.perf_counter()
    runs = train_all(cfg)
    results = evaluate_all(cfg)
    table_md = print_table(results)
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from mem_core.runs.export import export_run

    served = finetune_runs(cfg)["mem", cfg.label_seeds[0]]
    export_dir = export_run(served, cfg.out / "export")
    say(f"exported the MEM model of label seed {cfg.label_seeds[0]} to {export_dir}")
    headless = (not has_display()) if cfg.headless is None else cfg.headless
    live_state = live(export_dir, cfg.out, headless)
    report = write_report(cfg, runs, table_md, live_state)
    say(f"done in {time.perf_counter() - t0:.0f} s; report: {report}")
    return report
