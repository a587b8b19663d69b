"""``mem demo`` end to end at toy size: record, tokenizer, pretrain, the three arms' finetuning, evaluation, export,
live server + headless viewer, report; a second run that reuses the first one's work; Ctrl-C in the middle and the
run after it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from demo_child import shrink

from app import demo, demo_results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny_demo(monkeypatch):
    shrink(monkeypatch.setattr)


def stage_files(out):
    return {p: p.stat().st_mtime_ns for p in sorted(out.rglob("checkpoint.pt"))}


@pytest.mark.timeout(1200)  # the whole demo three times over at toy size: minutes, more where cores are shared
def test_demo_headless_reports_three_arms_per_label_seed_and_reuses_its_work(tmp_path, tiny_demo, capsys, monkeypatch):
    out = tmp_path / "demo"
    cfg = demo.DemoConfig(out=out, headless=True, labels_per_class=2, label_seeds=(0, 1), jobs=1)
    report = demo.run(cfg)

    results = json.loads((out / "results.json").read_text())
    assert list(results["held_out"]) == list(cfg.held_out) == ["test", "test-motion"]
    for held in results["held_out"].values():
        assert held["samples"] == 30  # the test split's scenes
        assert [row["label_seed"] for row in held["seeds"]] == [0, 1]
        for row in held["seeds"]:
            assert all(0 <= row[arm] <= 100 for arm in ("mem", "scratch", "resnet18"))  # top-1 in %
        for arm in ("scratch", "resnet18"):
            leads = [row["mem"] - row[arm] for row in held["seeds"]]
            assert held["mem_lead"][arm]["mean"] == pytest.approx(sum(leads) / 2, abs=0.051)
            assert held["mem_lead"][arm]["min"] == pytest.approx(min(leads), abs=0.051)
    for seed in (0, 1):  # every arm learns from the same labelled samples for as many steps
        runs = {arm: demo.finetune_runs(cfg)[arm, seed] for arm in ("mem", "scratch", "resnet18")}
        configs = {arm: json.loads((path / "config.json").read_text())["config"] for arm, path in runs.items()}
        assert {c["data"]["label_seed"] for c in configs.values()} == {seed}
        assert len({(c["data"]["label_fraction"], c["epochs"], c["batch_size"]) for c in configs.values()}) == 1
        assert [configs[arm]["arch"] for arm in runs] == ["vit", "vit", "resnet18"]
        trained = {arm: json.loads((path / "result.json").read_text())["train_samples"] for arm, path in runs.items()}
        assert set(trained.values()) == {10}  # 2 labels for each of the 5 shapes

    printed = capsys.readouterr()
    for k, stage in enumerate(("recording", "tokenizer", "pretraining", "finetuning", "scoring", "live"), 1):
        assert f"stage {k} of 6: " in printed.err and stage in printed.err.split(f"stage {k} of 6: ")[1].split("\n")[0]
    assert "min left" in printed.err
    assert "ResNet-18 from scratch" in printed.out and "mean ± std" in printed.out
    for held in results["held_out"].values():
        # where MEM stands against each arm, in words
        assert demo_results.summary(held) in printed.err.replace("\n", " ")
    text = report.read_text()
    header = "| label seed | MEM (pretrained ViT) | ViT from scratch | ResNet-18 from scratch |"
    assert text.count(header) == 2  # one table per held-out set
    row = results["held_out"]["test"]["seeds"][1]
    assert f"| 1 | {row['mem']:.1f} | {row['scratch']:.1f} | {row['resnet18']:.1f} |" in text
    assert "- link: connected" in text
    assert (out / "export" / "model.safetensors").is_file()

    state = json.loads((out / "live.json").read_text())  # the headless viewer saw the live server's frames
    assert state["link"] == "connected" and state["frames_shown"] > 0
    assert state["prediction"]["task"] == "classification"
    assert (out / "report" / "live.png").is_file() and "(report/live.png)" in text

    trained = stage_files(out)
    assert len(trained) == 8  # tokenizer, pretrain, three arms for each of two label seeds
    monkeypatch.setattr(demo, "live", lambda *args: None)  # the live part is checked above; the reruns check reuse
    demo.run(cfg)
    assert stage_files(out) == trained  # nothing retrained
    assert "exists: reusing it" in capsys.readouterr().err

    demo.run(dataclasses.replace(cfg, labels_per_class=3, label_seeds=(0,), held_out=("test-sensor",)))
    retrained = stage_files(out)
    assert {p: t for p, t in retrained.items() if p in trained} == trained  # the corpus stages are reused
    assert sorted(p.parent.name for p in set(retrained) - set(trained)) == [
        "finetune-mem-3-labels-seed0",
        "finetune-resnet18-3-labels-seed0",
        "finetune-scratch-3-labels-seed0",
    ]
    results = json.loads((out / "results.json").read_text())
    assert list(results["held_out"]) == ["test-sensor"]
    assert [row["label_seed"] for row in results["held_out"]["test-sensor"]["seeds"]] == [0]


def _demo_until(out: Path, line: str, sigint=signal.SIG_DFL) -> tuple[int, str]:
    """Run the toy demo in a child process started with ``sigint`` as its SIGINT action (``SIG_IGN``: a script's
    background job), press Ctrl-C as a terminal does (SIGINT to its process group) once it has printed ``line``; its
    exit status and what it printed on stderr."""
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "demo_child.py"), "--headless", "--out", str(out), "--jobs", "1"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),  # whatever the process running pytest inherited
    )
    err = []
    try:
        for text in child.stderr:
            err.append(text)
            if line in text:
                os.killpg(child.pid, signal.SIGINT)
                break
        err += child.stderr.readlines()
        return child.wait(timeout=120), "".join(err)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


def test_ctrl_c_says_what_was_kept_and_a_rerun_goes_on_from_there(tmp_path):
    out = tmp_path / "demo"
    code, err = _demo_until(out, "tokenizer epoch 2/3")  # the first epoch's checkpoint is written
    assert code == 130, err
    said = " ".join(err.split())
    assert "interrupted in stage 2 of 6" in said
    assert "the recorded corpus, the tokenizer's first" in said and "of 3 epochs" in said
    assert "Run the same command again to go on from there" in said
    assert "Traceback" not in err

    code, err = _demo_until(out, "stage 3 of 6", signal.SIG_IGN)  # between two trainings, started by `mem demo &`
    assert code == 130, err
    assert "exists: reusing it" in err  # the corpus is not recorded again
    assert "tokenizer epoch 1/3" not in err and "tokenizer epoch 3/3" in err  # training went on after its epoch
    said = " ".join(err.split())
    assert "Kept in" in said and "the recorded corpus, the tokenizer." in said  # the tokenizer whole, now


@pytest.mark.parametrize(
    ("leads", "said"),
    [
        ([2.0, 3.0], "ahead of the CNN on every label seed (+2.5 points on average, +2.0 at the least)"),
        ([-1.0, -2.0], "behind the CNN on every label seed (-1.5 points on average, -1.0 at the closest)"),
        (
            [3.5, -3.5, 0.0],
            "ahead of the CNN on 1 and behind it on 1 of 3 label seeds (+0.0 points on average, -3.5 to +3.5)",
        ),
        ([0.0, 0.0], "level with the CNN on every label seed"),
    ],
)
def test_the_demo_says_where_mem_stands_against_an_arm_whichever_arm_wins(leads, said):
    assert demo_results.standing({"per_seed": leads, **demo_results.spread(leads)}, "CNN") == said


def test_the_estimate_of_what_is_left_follows_the_machines_pace(capsys):
    planned = dict.fromkeys(demo.STAGES, 60.0) | {"tokenizer": 0.0}  # a minute each on 2 idle cores; tokenizer done
    progress = demo.Progress(planned, clock=iter([0.0, 120.0, 120.0, 120.0]).__next__)
    progress.start("record", "recording")
    progress.start("tokenizer", "reusing the tokenizer")
    progress.start("pretrain", "pretraining")  # recording took twice its minute: the four stages left take 8
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("stage 1 of 6: recording (about 5 min left on 2 idle cores)")
    assert lines[1].endswith("stage 2 of 6: reusing the tokenizer")
    assert lines[2].endswith("stage 3 of 6: pretraining (about 8 min left at this machine's recent pace)")


def test_the_estimate_forgets_a_slow_start_once_the_machine_runs_faster(capsys):
    """A stage that ran 10 times slower than planned (a busy machine) weighs on the estimate only until a minute of
    planned work has run at the new pace."""
    planned = dict.fromkeys(demo.STAGES, 60.0)
    clock = iter([0.0, 600.0, 600.0, 660.0, 660.0, 720.0]).__next__  # record: 10 x; tokenizer and pretrain: 1 x
    progress = demo.Progress(planned, clock=clock)
    progress.start("record", "recording")
    progress.start("tokenizer", "the tokenizer")  # after the slow stage alone: 10 x the 5 minutes left
    progress.start("pretrain", "pretraining")  # the last minute of work ran as planned: 4 minutes left, not 22
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].endswith("(about 50 min left at this machine's recent pace)")
    assert lines[2].endswith("(about 4 min left at this machine's recent pace)")


def test_demo_messages_are_never_wrapped(monkeypatch, capsys):
    # scripts and tests read these lines: a narrow terminal or a long path must not break them
    monkeypatch.setenv("COLUMNS", "30")
    message = "corpus /tmp/" + "a-long-folder-name/" * 8 + "corpus exists: reusing it"
    demo_results.say(message)
    assert message in capsys.readouterr().err


def test_demo_rejects_impossible_label_counts_before_any_work(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", "--labels-per-class", "201", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--labels-per-class" in r.stderr and "1..200" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--label-seeds", "0,0"], "distinct"),
        (["--label-seeds", "a"], "--label-seeds"),
        (["--seeds", "0,1"], "--seeds 0,1: use --label-seeds 0,1"),  # the old spelling, named
        (
            ["--held-out", "train"],
            "held-out sets are test, test-sensor, test-motion, not 'train'",
        ),  # the labelled windows' own split is not held out
        (["--held-out", "test,test"], "distinct"),
    ],
)
def test_demo_rejects_bad_label_seeds_and_held_out_sets_before_any_work(tmp_path, args, problem):
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and problem in r.stderr
    assert not out.exists()


def test_the_demo_offers_every_held_out_set_of_the_sim_dataset_and_no_other():
    from app.config import DEMO_HELD_OUT
    from mem_core.datasets.sim import SIM_SHIFTED_SPLITS

    assert set(DEMO_HELD_OUT) == {"test", *SIM_SHIFTED_SPLITS}
