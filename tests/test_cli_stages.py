"""The stage commands as users and outside checks run them: ``mem tokenizer/pretrain/finetune/evaluate/export``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TINY = [
    "epochs=1",
    "batch_size=8",
    "data.max_samples=24",
    "data.num_workers=0",
    "input.size=[32, 32]",
    "input.n_max=2000",
]
TINY_VIT = ["model.patch_size=8", "model.embed_dim=32", "model.depth=2", "model.num_heads=2"]
TINY_TOK = ["model.num_layers=3", "model.num_tokens=32", "model.hidden_dim=8", "model.codebook_dim=8"]


def mem(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=600)
    return result


def sets(*settings: str) -> list[str]:
    return [arg for s in settings for arg in ("--set", s)]


def test_tokenizer_pretrain_finetune_evaluate_export(tmp_path):
    def stage(name: str, out: str, *args: str) -> None:
        r = mem(name, "--dataset", "sim", "--preset", "cpu-tiny", "--out", str(tmp_path / out), *args)
        assert r.returncode == 0, r.stderr[-3000:]

    stage("tokenizer", "tok", *sets(*TINY, *TINY_TOK))
    stage("pretrain", "pre", "--tokenizer", str(tmp_path / "tok"), *sets(*TINY, *TINY_VIT))
    stage("finetune", "ft", "--init", str(tmp_path / "pre"), "--labels", "0.5", *sets(*TINY, *TINY_VIT))
    r = mem("evaluate", "--model", str(tmp_path / "ft"), "--dataset", "sim", "--split", "test", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0 <= result["top1"] <= 1 and result["n"] == 300
    r = mem("export", "--model", str(tmp_path / "ft"), "--out", str(tmp_path / "export"))
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.loads((tmp_path / "export" / "model.json").read_text())
    assert meta["task"] == "classification" and len(meta["classes"]) == 5
    assert (tmp_path / "export" / "model.safetensors").is_file()
    assert (tmp_path / "export" / "tokenizer.safetensors").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["finetune", "--dataset", "sim", "--out", "X", "--set", "epoch=1"], "unknown config key 'epoch'"),
        (["finetune", "--dataset", "sim", "--out", "X", "--set", "epochs=one"], "epochs: expected an integer"),
        (["finetune", "--dataset", "sim", "--out", "X", "--preset", "gpu-huge"], "unknown preset 'gpu-huge'"),
        (["pretrain", "--dataset", "sim", "--out", "X"], "needs --tokenizer"),
        (["evaluate", "--model", "nowhere", "--dataset", "sim"], "not a MEM run directory"),
    ],
)
def test_bad_arguments_are_one_clear_line(tmp_path, args, message, monkeypatch, capsys):
    from app.cli import main

    args = [str(tmp_path / a) if a == "X" else a for a in args]
    monkeypatch.setattr(sys, "argv", ["mem", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
