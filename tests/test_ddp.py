"""``torchrun`` + DDP (gloo on CPU): two processes reach the one-process result, in training and in evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mem_core.runs.rundir import RunDir, load_checkpoint
from mem_core.train.data import EpochBatchSampler

SETTINGS = [
    "epochs=2",
    "batch_size=8",
    "data.max_samples=32",
    "data.num_workers=0",
    "input.size=[32, 32]",
    "input.n_max=2000",
    "input.randaug_ops=0",
    "model.patch_size=8",
    "model.embed_dim=32",
    "model.depth=2",
    "model.num_heads=2",
    "model.drop_path=0.0",
    "warmup_epochs=0",
]


def finetune_command(out) -> list[str]:
    args = ["finetune", "--dataset", "sim", "--out", str(out), "--preset", "cpu-tiny"]
    for setting in SETTINGS:
        args += ["--set", setting]
    return args


def run(cmd: list[str]) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def in_process(args: list[str], monkeypatch, capsys) -> str:
    """``mem ARGS`` in this process (the one-process reference: its process is not what is tested): its stdout."""
    from app.cli import main

    monkeypatch.setattr(sys, "argv", ["mem", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main()
    out, err = capsys.readouterr()
    assert done.value.code == 0, err[-3000:]
    return out


# ---- evaluation counts every sample once, also with an uneven last batch ----------------------------------------


@pytest.mark.parametrize(("n", "batch", "world"), [(18, 16, 2), (17, 16, 2), (5, 4, 3), (64, 8, 2)])
def test_evaluation_shares_every_sample_exactly_once_and_never_an_empty_batch(n, batch, world):
    shares = [
        list(EpochBatchSampler(n, batch, seed=0, shuffle=False, drop_last=False, rank=r, world_size=world))
        for r in range(world)
    ]
    indices = sorted(i for rank in shares for b in rank for i, _ in b)
    assert indices == list(range(n))  # each once: no padding duplicates, nothing left out
    assert all(b for rank in shares for b in rank)  # no empty batch (it crashed the collate)
    for r, rank in enumerate(shares):
        assert len(rank) == len(
            EpochBatchSampler(n, batch, seed=0, shuffle=False, drop_last=False, rank=r, world_size=world)
        )


def test_training_batches_must_split_evenly_over_the_processes():
    with pytest.raises(ValueError, match="multiple of the 3 processes"):
        EpochBatchSampler(30, 16, seed=0, shuffle=True, drop_last=True, rank=0, world_size=3)


@pytest.fixture
def uneven_ncars(tmp_path, data_dir):
    """An N-Cars root with 32 training and 18 validation samples: batch 16 leaves 2 for the last batch."""
    for split, per_class in (("train", 16), ("val", 9)):
        for cls in ("background", "cars"):
            (tmp_path / split / cls).mkdir(parents=True)
            for src in sorted((data_dir / "ncars-dev" / split / cls).glob("*.dat"))[:per_class]:
                (tmp_path / split / cls / src.name).symlink_to(src)
    return tmp_path


def test_two_processes_train_and_evaluate_an_uneven_split_like_one(tmp_path, uneven_ncars, monkeypatch, capsys):
    """``torchrun`` with two processes reaches the one-process weights, metrics and scores (the global batch is split
    between them), on a validation split whose last batch is uneven."""
    settings = [s for s in SETTINGS if not s.startswith(("batch_size", "data.max_samples", "epochs"))]
    args = ["finetune", "--dataset", "ncars", "--data", str(uneven_ncars), "--preset", "cpu-tiny"]
    args += [a for s in [*settings, "epochs=2", "batch_size=16"] for a in ("--set", s)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "app.cli"]
    run([*torchrun, *args, "--out", str(tmp_path / "two")])
    result = json.loads((tmp_path / "two" / "result.json").read_text())
    assert result["n"] == 18  # the validation split, each sample once
    in_process([*args, "--out", str(tmp_path / "one")], monkeypatch, capsys)
    one = load_checkpoint(tmp_path / "one" / "checkpoint.pt")["model"]
    two = load_checkpoint(tmp_path / "two" / "checkpoint.pt")["model"]
    for key in one:
        assert torch.allclose(one[key], two[key], rtol=1e-4, atol=1e-5), key
    m1, m2 = RunDir(tmp_path / "one").metrics(), RunDir(tmp_path / "two").metrics()
    assert [r["val_top1"] for r in m1] == [r["val_top1"] for r in m2] and len(m1) == 2
    assert abs(m1[-1]["train_loss"] - m2[-1]["train_loss"]) < 1e-4

    evaluate = [
        "evaluate",
        "--model",
        str(tmp_path / "two"),
        "--dataset",
        "ncars",
        "--data",
        str(uneven_ncars),
        "--json",
    ]
    one = json.loads(in_process(evaluate, monkeypatch, capsys).strip().splitlines()[-1])
    two = json.loads(run([*torchrun, *evaluate]).strip().splitlines()[-1])
    assert one["n"] == two["n"] == 18
    assert one["top1"] == two["top1"] == result["top1"] and one["confusion"] == two["confusion"]
