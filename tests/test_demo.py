"""``mem demo`` end to end at toy size: record, tokenizer, pretrain, both finetunes, evaluation, export, live
server + headless viewer, report; and a second run that reuses the first one's work."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from app import demo
from mem_core.datasets import sim as sim_dataset

TINY_STAGES = {
    "tokenizer": ["epochs=1", "batch_size=16", "model.temperature_anneal_steps=10"],
    "pretrain": ["epochs=1", "batch_size=16", "warmup_steps=1"],
    "finetune": ["epochs=2", "batch_size=5", "warmup_epochs=0", "eval_every=1", "input.randaug_ops=0"],
}


@pytest.fixture
def tiny_demo(monkeypatch):
    monkeypatch.setattr(demo, "STAGE_SETTINGS", TINY_STAGES)
    monkeypatch.setattr(demo, "CORPUS_SIM_SECONDS", 3)
    monkeypatch.setattr(demo, "LIVE_SECONDS", 4)
    monkeypatch.setattr(sim_dataset, "SIM_SPLITS", {"train": (10, 1), "val": (4, 2), "test": (6, 3)})


def stage_files(out):
    return {p: p.stat().st_mtime_ns for p in sorted(out.rglob("checkpoint.pt"))}


def test_demo_headless_reports_mem_and_scratch_per_label_seed_and_reuses_its_work(
    tmp_path, tiny_demo, capsys, monkeypatch
):
    out = tmp_path / "demo"
    cfg = demo.DemoConfig(out=out, headless=True, labels_per_class=2, label_seeds=(0, 1), jobs=1)
    report = demo.run(cfg)

    results = json.loads((out / "results.json").read_text())
    assert [row["label_seed"] for row in results["seeds"]] == [0, 1]
    assert results["test_samples"] == 30  # the held-out test split
    for row in results["seeds"]:
        assert 0 <= row["mem"] <= 100 and 0 <= row["scratch"] <= 100  # top-1 in %
    leads = [row["mem"] - row["scratch"] for row in results["seeds"]]
    assert results["lead"]["mean"] == pytest.approx(sum(leads) / 2, abs=0.051)
    assert results["lead"]["min"] == pytest.approx(min(leads), abs=0.051)
    for seed in (0, 1):  # each label seed draws its own labelled samples, the same for both arms
        configs = [
            json.loads((demo.finetune_runs(cfg)[arm, seed] / "config.json").read_text()) for arm in ("mem", "scratch")
        ]
        assert {c["config"]["data"]["label_seed"] for c in configs} == {seed}

    printed = capsys.readouterr()
    assert "label seed" in printed.out and "mean" in printed.out and "MEM's lead" in printed.out
    assert f"{results['lead']['mean']:+.1f} points on average" in printed.err
    text = report.read_text()
    assert "| label seed | MEM (pretrained, finetuned) | ViT from scratch | MEM's lead |" in text
    assert f"| 1 | {results['seeds'][1]['mem']:.1f} % |" in text
    assert "- link: connected" in text
    assert (out / "export" / "model.safetensors").is_file()

    state = json.loads((out / "live.json").read_text())  # the headless viewer saw the live server's frames
    assert state["link"] == "connected" and state["frames_shown"] > 0
    assert state["prediction"]["task"] == "classification"
    assert (out / "report" / "live.png").is_file() and "(report/live.png)" in text

    trained = stage_files(out)
    assert len(trained) == 6  # tokenizer, pretrain, two arms for each of two label seeds
    monkeypatch.setattr(demo, "live", lambda *args: None)  # the live part is checked above; the reruns check reuse
    demo.run(cfg)
    assert stage_files(out) == trained  # nothing retrained
    assert "exists: reusing it" in capsys.readouterr().err

    demo.run(dataclasses.replace(cfg, labels_per_class=3, label_seeds=(0,)))
    retrained = stage_files(out)
    assert {p: t for p, t in retrained.items() if p in trained} == trained  # the corpus stages are reused
    assert sorted(p.parent.name for p in set(retrained) - set(trained)) == [
        "finetune-mem-3-labels-seed0",
        "finetune-scratch-3-labels-seed0",
    ]
    assert [row["label_seed"] for row in json.loads((out / "results.json").read_text())["seeds"]] == [0]


def test_demo_messages_are_never_wrapped(monkeypatch, capsys):
    # scripts and tests read these lines: a narrow terminal or a long path must not break them
    monkeypatch.setenv("COLUMNS", "30")
    message = "corpus /tmp/" + "a-long-folder-name/" * 8 + "corpus exists: reusing it"
    demo.say(message)
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


@pytest.mark.parametrize(("args", "problem"), [(["--seeds", "0,0"], "distinct"), (["--seeds", "a"], "--seeds")])
def test_demo_rejects_bad_label_seeds_before_any_work(tmp_path, args, problem):
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and problem in r.stderr
    assert not out.exists()
