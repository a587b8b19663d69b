"""The GPU evidence call, run as its CPU smoke: the same script packs a few real N-Cars files, measures, trains every
stage within its time, scores MEM, scratch and the CNN on the test split, and returns the pretrained model in parts
that rebuild a pretraining run a CPU finetunes from."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench.gpu_evidence import SMOKE, main
from mem_core.runs.rundir import load_checkpoint
from mem_core.train import finetune
from mem_core.train.configs import stage_config
from mem_core.train.evaluate import evaluate_run

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_call_runs_as_its_cpu_smoke_and_its_model_comes_back(tmp_path, data_dir):
    out = tmp_path / "out"
    smoke = ["bash", "bench/gpu_evidence.sh", "smoke", "--out", str(out), "--data", str(data_dir / "ncars-dev")]
    done = subprocess.run(smoke, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "# GPU evidence: smoke on CPU" in done.stdout and "**test top-1 (kept model)**" in done.stdout
    report = json.loads((out / "results.json").read_text())
    assert report["scale"] == "smoke" and report["seconds"] > 0
    # packed as the GPU call packs ncars-dev: val-apart, recorded apart from training, chooses; val stays behind
    assert report["choose_on"] == "val-apart" and "val" not in report["data"]["per_split"]
    assert set(report["stages"]) == {"tokenizer", "pretrain", "finetune"}
    assert all(stage["epochs"] >= 1 and stage["images_per_s"] > 0 for stage in report["stages"].values())
    rows = report["experiment"]["rows"]
    assert {(r["labels"], r["arm"]) for r in rows if r["labels"] == 0.1} == {
        (0.1, arm) for arm in ("mem", "scratch", "resnet10t")
    }
    assert all(0 <= r["test_top1"] <= 1 for r in rows)
    timing = report["run_timing"]  # where each run's time went, for the next call's plan
    assert len(timing) == len(rows) and all(t["epochs"] >= 1 and t["epochs_s"] > 0 for t in timing)
    assert set(report["not_run"]) <= {"100% of the labels"}  # what did not fit is named, never dropped silently
    assert (out / "results.md").read_text().startswith("# GPU evidence: smoke")
    assert (out / "label_efficiency.png").stat().st_size > 10_000
    parts = sorted(out.glob("pretrained-*.safetensors"))
    assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts)

    run = tmp_path / "pretrain"
    main(["assemble", str(out), "--out", str(run)])  # what `bash bench/gpu_evidence.sh assemble` runs
    rebuilt = load_checkpoint(run / "checkpoint.pt")["model"]
    returned = {k: v for p in parts for k, v in load_file(str(p)).items()}
    assert rebuilt.keys() == returned.keys()
    assert all(torch.equal(rebuilt[k], v.float()) for k, v in returned.items() if v.is_floating_point())
    assert json.loads((run / "config.json").read_text())["stage"] == "pretrain"

    # a CPU finetunes from it with the call's own settings (the same ViT), and scores the result on test
    few = tmp_path / "few"  # a few real files of each split, so the check costs seconds
    for split in ("train", "val", "test"):
        for cls in ("cars", "background"):
            (few / split / cls).mkdir(parents=True)
            for path in sorted((data_dir / "ncars-dev" / split / cls).iterdir())[:8]:
                shutil.copy(path, few / split / cls / path.name)
    smoke = [*SMOKE.overrides["all"], *SMOKE.overrides["finetune"], "epochs=1"]
    cfg = stage_config(
        "finetune", preset="gpu-small", values={"data.dataset": "ncars", "data.path": str(few)}, overrides=smoke
    )
    tuned = finetune.run(cfg, tmp_path / "ft", init=run)
    scored = evaluate_run(tuned.path, "ncars", few, "test")
    assert scored["n"] == 16 and 0 <= scored["top1"] <= 1


def test_a_call_whose_setup_overran_its_budget_plans_no_negative_time(tmp_path, monkeypatch):
    """On a busy machine the smoke's packing and calibration took 13 s of its 15: the stages were planned with a
    negative budget and a negative time limit, and the call stopped on the config's bound."""
    from bench.gpu_evidence import Call

    call = Call(SMOKE, tmp_path / "out", tmp_path / "work")
    monkeypatch.setattr(call, "started", call.started - 2 * SMOKE.budget_s)
    assert call.left() == 0.0


def test_finetuning_leaves_out_the_last_fractions_rather_than_train_every_run_a_few_epochs(tmp_path):
    """An H200 call gave 27 runs 4-7 epochs each: none trained. The plan keeps the fractions that matter most and
    gives their runs ``min_epochs`` or more, at the slower of each arm's step and its loader."""
    from types import SimpleNamespace

    import bench.gpu_evidence as evidence

    call = evidence.Call(evidence.GPU, tmp_path / "out", tmp_path / "work")
    call.efficiency = 0.6
    experiment = SimpleNamespace(fractions=(0.1, 1.0, 0.01), seeds=(0, 1, 2))
    # the H200's steps (images/s) and loaders (samples/s): every arm is bound by its loader
    rates = {"finetune vit": 3934, "finetune cnn": 16954, "loader vit": 2000, "loader cnn": 2000}
    epochs, fractions = evidence.plan_finetuning(call, experiment, rates, budget=300, samples=3000)
    assert fractions == (0.1, 1.0) and epochs >= evidence.GPU.min_epochs
    loader_bound = epochs
    overhead = len(fractions) * 3 * 3 * evidence.GPU.run_overhead_s
    assert overhead + epochs * len(fractions) * 3 * 3000 * 3 / 2000 <= 300  # the plan fits its budget

    epochs, fractions = evidence.plan_finetuning(call, experiment, rates, budget=1200, samples=3000)
    assert fractions == (0.1, 1.0, 0.01) and epochs >= evidence.GPU.min_epochs
    faster = dict(rates, **{"loader vit": 20_000, "loader cnn": 20_000})  # then the steps bind
    assert evidence.plan_finetuning(call, experiment, faster, budget=300, samples=3000) == (
        13,
        (0.1, 1.0),
    )  # 2,360 / 10,172 img/s
    assert loader_bound == 8


def test_choosing_on_val_apart_trains_on_the_whole_training_split_where_the_data_has_no_val(tmp_path, data_dir):
    """A GPU call carries val-apart in val's place; N-Cars carves a val out of a train/ that has no val/ beside it,
    which would train the arms on 90 % of the split the CPU's arms train on (and score them on their own split)."""
    from mem_core.datasets.ncars import ncars
    from mem_core.train.experiment import (
        LabelEfficiencyConfig,
        finetune_config,
        score_on_splits,
        stage_config_of,
        training_split,
    )

    for split in ("train", "val-apart", "test"):
        for cls in ("cars", "background"):
            (tmp_path / split / cls).mkdir(parents=True)
            for path in sorted((data_dir / "ncars-dev" / split / cls).iterdir())[:20]:
                shutil.copy(path, tmp_path / split / cls / path.name)
    assert len(ncars(tmp_path, "train")) < 40  # what a run validating on a carved val trains on
    common = {"dataset": "ncars", "data": str(tmp_path), "out": str(tmp_path / "x"), "preset": "cpu-tiny"}
    carving = LabelEfficiencyConfig(**common)
    assert len(training_split(finetune_config(carving, "mem", 1.0, 0))) < 40

    experiment = LabelEfficiencyConfig(**common, choose_on="val-apart")
    for arm in ("mem", "scratch", "resnet18"):
        cfg = finetune_config(experiment, arm, 1.0, 0)
        assert len(training_split(cfg)) == 40 and cfg.data.val_split == "val-apart"
    for stage in ("tokenizer", "pretrain"):  # they choose nothing, and watch the split that chooses
        cfg = stage_config_of(experiment, stage)
        assert (cfg.data.held_out, cfg.data.val_split) == (False, "val-apart")
    assert list(score_on_splits(experiment, [])) == ["test"]  # no val is scored: a carved one would be train's
