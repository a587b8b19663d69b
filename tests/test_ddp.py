"""``torchrun`` + DDP (gloo on CPU): two processes with the same global batch reach the one-process result."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from mem_core.train.rundir import RunDir, load_checkpoint

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


def run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_two_processes_match_one(tmp_path):
    run([sys.executable, "-m", "app.cli", *finetune_command(tmp_path / "one")])
    run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "app.cli",
            *finetune_command(tmp_path / "two"),
        ]
    )
    one = load_checkpoint(tmp_path / "one" / "checkpoint.pt")["model"]
    two = load_checkpoint(tmp_path / "two" / "checkpoint.pt")["model"]
    for key in one:
        assert torch.allclose(one[key], two[key], rtol=1e-4, atol=1e-5), key
    m1, m2 = RunDir(tmp_path / "one").metrics(), RunDir(tmp_path / "two").metrics()
    assert [r["val_top1"] for r in m1] == [r["val_top1"] for r in m2]
    assert abs(m1[-1]["train_loss"] - m2[-1]["train_loss"]) < 1e-4
