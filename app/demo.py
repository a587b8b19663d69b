"""``mem demo``: the whole product on the built-in simulated camera, in minutes on a CPU.

1. record an unlabeled corpus from the simulated camera (``recorders.record``),
2. train the tokenizer on it, then
3. pretrain MEM on it (no labels),
4. for each label seed, finetune three classifiers on the same few labels with the same steps: the MEM-initialised
   ViT, the same ViT from scratch, and the model a user would pick without MEM, a ResNet-18 from scratch (the
   label-efficiency experiment's yardstick, ``mem_core.train.finetune.yardstick_config``),
5. score every kept model on held-out simulated windows (``DemoConfig.held_out``); print, per held-out set, the
   per-seed table and where MEM stands against each arm, and write ``results.json``,
6. export the MEM model and start the live server + viewer on the simulated camera (headless: snapshots and a
   report instead of a window).

Every stage writes under ``--out`` and is reused by the next run unless ``--fresh``; each says which of the six it is
and about how long the rest will take. Ctrl-C says what was kept: a rerun goes on from there, a training run from its
last finished epoch.

The task is built so that the unlabeled recording carries what the labels cannot: 10 labelled 50 ms windows per
shape against a minute of unlabeled camera time (about 700 windows). 10 was measured against 5, 20 and 40 labels per
class over label seeds, and the held-out sets against each other (docs/RESULTS.md section 7).
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
from collections.abc import Callable
from pathlib import Path

from app.config import DemoConfig
from app.demo_results import ARM_NAMES, ARMS, MEM, SCRATCH, YARDSTICK, evaluate_all, print_tables, say

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
    # 10 labels per class are 50 windows: a batch holds them all, 150 steps; a checkpoint (the ResNet-18's weights
    # and optimizer: 134 MB) every 10 s, not after each one-step epoch
    "finetune": [
        "epochs=150",
        "checkpoint_every_s=10",
        "batch_size=50",
        "warmup_epochs=10",
        "eval_every=25",
        "head_init_scale=1.0",
        "input.randaug_ops=0",
    ],
}
CORPUS_SIM_SECONDS = 60
LIVE_SECONDS = 12
# the longest the live server may take to publish its first prediction: loading the model took 140 s on 2 cores
# shared with five other busy processes
SERVER_START_S = 300

# Each stage's wall time on 2 idle cores (docs/RESULTS.md section 7), for the estimate of what is left; a finetuning
# run's is its share of the stage with two runs at a time.
STAGE_SECONDS = {"record": 12.0, "tokenizer": 110.0, "pretrain": 115.0, "evaluate": 10.0, "live": 30.0}
FINETUNE_SECONDS = {MEM: 38.0, SCRATCH: 38.0, YARDSTICK: 52.0}  # runs of 1.25 and 1.7 min, two at a time
STAGES = ("record", "tokenizer", "pretrain", "finetune", "evaluate", "live")


def demo_stage_config(stage: str, dataset: str, *extra: str):
    """The demo's ``stage`` config on ``dataset``; pretraining and finetuning steps in bf16 where the CPU has it
    natively (1.5 x faster steps, as cpu-small takes them; docs/BENCHMARKS.md), fp32 elsewhere."""
    from mem_core.train.configs import stage_config
    from mem_core.train.runtime import cpu_has_native_bf16

    bf16 = ["cpu_bf16=true"] if stage in ("pretrain", "finetune") and cpu_has_native_bf16() else []
    overrides = [*DEMO_INPUT, *STAGE_SETTINGS[stage], *bf16, *extra]
    return stage_config(stage, preset="cpu-tiny", values={"data.dataset": dataset}, overrides=overrides)


class Progress:
    """Says which stage runs ("stage k of 6") and about how long the rest will take: what each stage has left in
    seconds on 2 idle cores (``planned``), times how much slower than that this machine ran the latest stages (at
    least ``RECENT_S`` of their planned work: the pace now, not the average since the start)."""

    RECENT_S = 60.0

    def __init__(self, planned: dict[str, float], clock: Callable[[], float] = time.perf_counter) -> None:
        self.planned, self.clock = planned, clock
        self.stage: str | None = None
        self._closed: list[tuple[float, float]] = []  # (seconds spent, seconds planned) of each stage that ran
        self._started = 0.0

    def start(self, stage: str, what: str) -> None:
        self._close()
        self.stage, self._started = stage, self.clock()
        number = f"stage {STAGES.index(stage) + 1} of {len(STAGES)}"
        if not self.planned[stage]:
            say(f"{number}: {what}")
            return
        left = sum(self.planned[s] for s in STAGES[STAGES.index(stage) :])
        pace = self._pace()
        minutes = max(1, round(left * (pace or 1) / 60))
        where = "at this machine's recent pace" if pace else "on 2 idle cores"
        say(f"{number}: {what} (about {minutes} min left {where})")

    def _close(self) -> None:
        if self.stage is not None and self.planned[self.stage]:
            self._closed.append((self.clock() - self._started, self.planned[self.stage]))

    def _pace(self) -> float | None:
        """Spent over planned of the latest stages that add up to ``RECENT_S`` of planned work (all of them, when
        they add up to less), once that is more than a few seconds' work; None before."""
        spent = planned = 0.0
        for took, expected in reversed(self._closed):
            spent, planned = spent + took, planned + expected
            if planned >= self.RECENT_S:
                break
        return spent / planned if planned >= 10 else None


def record_corpus(corpus: Path) -> None:
    """Record the unlabeled corpus into ``corpus``: into a folder beside it that is renamed when the recording is
    complete, so a recording cut short (Ctrl-C, a crash) is recorded again rather than trained on."""
    from mem_core.simulator import task_config
    from recorders.config import RecordConfig
    from recorders.record import run
    from recorders.simulated import SimulatorSource

    partial = corpus.with_name(corpus.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    source = SimulatorSource(task_config(seed=7), speed=0, duration_us=CORPUS_SIM_SECONDS * 1_000_000)
    result = run(RecordConfig(source="sim", out=partial, name="sim-session", speed=0), source=source)
    if result.error:
        raise RuntimeError(f"recording the demo corpus failed: {result.error}")
    if result.stop_reason.startswith("interrupted"):  # the recorder stops at the first Ctrl-C, keeping what it has
        raise KeyboardInterrupt
    partial.rename(corpus)
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
        for arm in ARMS
    }


def epochs_done(path: Path) -> int:
    """The epochs of a training run that its checkpoint holds: where a rerun goes on from."""
    from mem_core.runs.rundir import RunDir, load_checkpoint

    checkpoint = RunDir(path).checkpoint_path
    return load_checkpoint(checkpoint)["epoch"] + 1 if checkpoint.is_file() else 0


def planned_seconds(cfg: DemoConfig) -> dict[str, float]:
    """What each stage has left to do, in seconds on 2 idle cores (0: finished by an earlier run)."""
    from mem_core.runs.rundir import RunDir

    out = cfg.out

    def training_left(stage: str) -> float:
        if RunDir(out / stage).finished:
            return 0.0
        epochs = demo_stage_config(stage, "corpus").epochs
        return STAGE_SECONDS[stage] * (1 - min(epochs_done(out / stage), epochs) / epochs)

    pending = [arm for (arm, _), path in finetune_runs(cfg).items() if not RunDir(path).finished]
    return {
        "record": 0.0 if (out / "corpus").exists() else STAGE_SECONDS["record"],
        "tokenizer": training_left("tokenizer"),
        "pretrain": training_left("pretrain"),
        "finetune": sum(FINETUNE_SECONDS[arm] for arm in pending),
        "evaluate": STAGE_SECONDS["evaluate"] * len(cfg.held_out),
        "live": STAGE_SECONDS["live"],
    }


def train_all(cfg: DemoConfig, progress: Progress) -> dict[str, Path]:
    """Record, tokenizer, pretraining, then every finetuning run; returns the unlabeled stages' run directories."""
    from mem_core.runs.rundir import RunDir
    from mem_core.train import pretrain, tokenizer
    from mem_core.train.experiment import finetune_all
    from mem_core.train.finetune import scratch_config, yardstick_config

    fraction = label_fraction(cfg.labels_per_class)
    out = cfg.out
    corpus = out / "corpus"
    if corpus.exists():
        progress.start("record", f"corpus {corpus} exists: reusing it")
    else:
        progress.start("record", f"recording {CORPUS_SIM_SECONDS} s of the simulated camera without labels")
        record_corpus(corpus)
    runs = {name: out / name for name in ("tokenizer", "pretrain")}
    if RunDir(runs["tokenizer"]).finished:
        progress.start("tokenizer", f"tokenizer {runs['tokenizer']} is trained: reusing it")
    else:
        progress.start("tokenizer", "training the event tokenizer on the unlabeled corpus")
        cfg_tok = demo_stage_config("tokenizer", "corpus", f"data.path={corpus}")
        tokenizer.run(cfg_tok, runs["tokenizer"], resume=runs["tokenizer"].exists())
    if RunDir(runs["pretrain"]).finished:
        progress.start("pretrain", f"pretraining {runs['pretrain']} is done: reusing it")
    else:
        progress.start("pretrain", "masked event pretraining on the unlabeled corpus")
        cfg_pre = demo_stage_config("pretrain", "corpus", f"data.path={corpus}")
        pretrain.run(cfg_pre, runs["pretrain"], tokenizer=runs["tokenizer"], resume=runs["pretrain"].exists())
    pending = []
    for (arm, seed), path in finetune_runs(cfg).items():
        if RunDir(path).finished:
            continue
        # the label seed draws which samples are labelled, the same ones for every arm; the run seed follows it
        ft = demo_stage_config(
            "finetune", "sim", f"data.label_fraction={fraction}", f"data.label_seed={seed}", f"seed={seed}"
        )
        if arm == YARDSTICK:  # the same labels, epochs and batches; the CNN's own optimiser settings
            ft = yardstick_config(ft, YARDSTICK)
        elif arm == SCRATCH:  # no layer decay from random weights
            ft = scratch_config(ft)
        pending.append((path, arm, ft, runs["pretrain"] if arm == MEM else None))
    seeds = ", ".join(map(str, cfg.label_seeds))
    if pending:
        progress.start(
            "finetune",
            f"finetuning MEM, the ViT from scratch and a ResNet-18 from scratch with {cfg.labels_per_class} labels "
            f"per class, label seeds {seeds} ({len(pending)} runs, {cfg.jobs} at a time)",
        )
    else:
        progress.start("finetune", f"the finetuning runs of label seeds {seeds} are done: reusing them")
    finetune_all(pending, cfg.jobs, out / "logs")
    return runs


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
        serve_cmd += ["--stop-after", str(LIVE_SECONDS + SERVER_START_S)]
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


def write_report(cfg: DemoConfig, runs: dict[str, Path], tables_md: str, live_state: dict | None) -> Path:
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
    for arm in ARMS:
        pictures[f"finetuning curves ({ARM_NAMES[arm]}, label seed {first_seed})"] = (
            finetuned[arm, first_seed] / "curves.png"
        )
    n_classes = len(task_config().classes)
    lines = [
        "# MEM demo report",
        "",
        f"The simulated camera's {n_classes} shapes (chance {100 / n_classes:.0f} %), {cfg.labels_per_class} labels per"
        f" class, drawn anew for each label seed. MEM was pretrained on a {CORPUS_SIM_SECONDS} s recording without"
        " labels; the ViT from scratch has the same architecture, finetuning recipe and labels, and the ResNet-18 from"
        " scratch the same labels and steps with a CNN's optimiser settings. Top-1 of each run's kept model (its best"
        " epoch on the validation split) on held-out simulated windows (`results.json`):",
        "",
        tables_md,
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
    *("corpus", "corpus.partial", "tokenizer", "pretrain", "finetune-*", "logs", "export"),
    *("report", "report.md", "results.json", "live.png", "live.json"),
)


def kept(cfg: DemoConfig) -> str:
    """What the demo's folder holds for the next run, in words (after an interruption)."""
    from mem_core.runs.rundir import RunDir

    out, parts = cfg.out, []
    if (out / "corpus").exists():
        parts.append("the recorded corpus")
    for stage, name in (("tokenizer", "the tokenizer"), ("pretrain", "the pretraining")):
        if RunDir(out / stage).finished:
            parts.append(name)
        elif done := epochs_done(out / stage):
            parts.append(f"{name}'s first {done} of {demo_stage_config(stage, 'corpus').epochs} epochs")
    runs = list(finetune_runs(cfg).values())
    finished = sum(RunDir(path).finished for path in runs)
    begun = sum(not RunDir(path).finished and epochs_done(path) > 0 for path in runs)
    if finished or begun:
        parts.append(f"{finished} of {len(runs)} finetuning runs" + (f" and {begun} begun" if begun else ""))
    return ", ".join(parts) or "nothing yet"


def run(cfg: DemoConfig) -> Path:
    from mem_core.runs.rundir import RunError, make_dir

    label_fraction(cfg.labels_per_class)
    make_dir(cfg.out, "the demo's work")
    if cfg.fresh:
        foreign = [p.name for p in cfg.out.iterdir() if not any(fnmatch.fnmatch(p.name, e) for e in DEMO_ENTRIES)]
        if foreign:
            raise RunError(f"{cfg.out}: holds {foreign[0]!r}, not the demo's: --fresh would delete it with the folder")
        shutil.rmtree(cfg.out)
        cfg.out.mkdir()
    t0 = time.perf_counter()
    progress = Progress(planned_seconds(cfg))
    from mem_core.train.runtime import interruptible

    try:
        with interruptible():  # Ctrl-C stops every stage, also of a demo started in the background with SIGINT ignored
            report = _run_stages(cfg, progress)
    except KeyboardInterrupt:
        where = f"stage {STAGES.index(progress.stage) + 1} of {len(STAGES)}" if progress.stage else "its first stage"
        say(
            f"interrupted in {where}. Kept in {cfg.out}: {kept(cfg)}. Run the same command again to go on from there "
            "(a training run from its last finished epoch)."
        )
        raise
    say(f"done in {time.perf_counter() - t0:.0f} s; report: {report}")
    return report


def _run_stages(cfg: DemoConfig, progress: Progress) -> Path:
    from mem_core.runs.export import export_run

    runs = train_all(cfg, progress)
    progress.start("evaluate", f"scoring every kept model on held-out windows ({', '.join(cfg.held_out)})")
    results = evaluate_all(cfg, finetune_runs(cfg))
    tables_md = print_tables(results)
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    progress.start("live", "exporting the MEM model and running it live on the simulated camera")
    served = finetune_runs(cfg)[MEM, cfg.label_seeds[0]]
    export_dir = export_run(served, cfg.out / "export")
    say(f"exported the MEM model of label seed {cfg.label_seeds[0]} to {export_dir}")
    headless = (not has_display()) if cfg.headless is None else cfg.headless
    live_state = live(export_dir, cfg.out, headless)
    return write_report(cfg, runs, tables_md, live_state)
