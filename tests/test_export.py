"""Model files: exports round-trip, an export of another format version is refused, and damaged or tampered exports,
runs and checkpoints (compute bombs included) are one error naming the file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mem_core.configuration import to_dict
from mem_core.inference import Predictor
from mem_core.limits import MAX_WINDOW_FLOPS
from mem_core.models import MEMViT, TokenizerConfig, ViTConfig
from mem_core.representation import InputSpec
from mem_core.runs import export
from mem_core.runs.export import (
    EXPORT_VERSION,
    TASKS,
    build_task_model,
    export_model,
    export_random,
    export_run,
    load_model,
    load_tokenizer,
    window_flops,
)
from mem_core.runs.rundir import RunDir, RunError
from mem_core.train.configs import stage_config

ARCH = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0)


def test_random_export_loads_as_the_model_it_describes(tmp_path):
    out = export_random(
        tmp_path / "export", classes=("a", "b", "c"), architecture=ARCH, input_spec=InputSpec(size=(32, 32))
    )
    model, meta = load_model(out)
    assert meta["task"] == "classification" and meta["classes"] == ["a", "b", "c"]
    assert model(torch.rand(2, 2, 32, 32)).shape == (2, 3) and not model.training


@pytest.mark.parametrize("stem", ["conv", "resnet"])
def test_a_convolutional_stem_exports_with_its_batch_norm_statistics(tmp_path, stem):
    """A model with a convolutional stem predicts the same after export: its batch norms' running statistics,
    which training moved away from their defaults, travel in the safetensors file and the architecture says which
    stem to build."""
    arch = replace(ARCH, stem=stem)
    meta = {"task": "classification", "architecture": to_dict(arch), "classes": ["a", "b"], "head_channels": 32}
    model = build_task_model(meta)
    x = torch.rand(4, 2, 32, 32) * 3
    with torch.no_grad():
        model.train()(x)  # one training forward moves the running statistics
        expected = model.eval().forward_features(x)
    spec = InputSpec(size=(32, 32))
    out = export_model(
        model,
        tmp_path / stem,
        task="classification",
        architecture=meta["architecture"],
        classes=meta["classes"],
        input_spec=spec,
    )
    loaded, loaded_meta = load_model(out)
    assert loaded_meta["architecture"]["stem"] == stem
    with torch.no_grad():
        assert torch.allclose(loaded.forward_features(x), expected, atol=1e-5)
        for norm in loaded.modules():
            if isinstance(norm, torch.nn.BatchNorm2d):
                norm.reset_running_stats()
        assert not torch.allclose(loaded.forward_features(x), expected, atol=1e-2)  # the statistics mattered


TOKENIZER = TokenizerConfig(img_size=32, num_layers=2, num_tokens=16, hidden_dim=8, codebook_dim=8, num_resnet_blocks=1)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    return export_random(
        tmp_path_factory.mktemp("export") / "e",
        architecture=ARCH,
        input_spec=InputSpec(size=(32, 32)),
        tokenizer=TOKENIZER,
    )


def edit_json(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        meta = json.loads((folder / name).read_text())
        change(meta)
        (folder / name).write_text(json.dumps(meta))

    return damage


def write(name: str, content: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(content)


def cut(name: str, keep: float) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(
        (folder / name).read_bytes()[: int((folder / name).stat().st_size * keep)]
    )


def rename_tensor(folder: Path) -> None:
    model, _ = load_model(folder)
    weights = {k.replace("head.", "header."): v.contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    ("damage", "file", "message"),
    [
        (write("model.json", b"{not json"), "model.json", "not valid JSON"),
        (write("model.json", b"[1, 2]"), "model.json", "expected a JSON object"),
        (write("model.json", b" " * (2 << 20)), "model.json", "larger than 1048576 bytes"),
        (write("model.json", bytes(range(256))), "model.json", "not valid JSON"),
        (edit_json("model.json", lambda m: m.update(task="detection")), "model.json", "task: must be"),
        (edit_json("model.json", lambda m: m.update(classes="cars")), "model.json", "classes: expected a list"),
        (edit_json("model.json", lambda m: m.update(classes=["a", "a"])), "model.json", "distinct"),
        (edit_json("model.json", lambda m: m.update(classes=["a", "b\x00"])), "model.json", "classes.1: .*printable"),
        (
            edit_json("model.json", lambda m: m["architecture"].update(depth=10**6)),
            "model.json",
            r"architecture.depth must be in \[1, 256\], got 1000000",
        ),
        (
            edit_json("model.json", lambda m: m["architecture"].update(patch_size=0)),
            "model.json",
            r"architecture.patch_size must be in \[1, 2048\], got 0",
        ),
        (edit_json("model.json", lambda m: m["architecture"].update(embed_dim="wide")), "model.json", "embed_dim"),
        (
            edit_json("model.json", lambda m: m["architecture"].update(embed_dim=100_000, num_heads=1)),
            "model.json",
            "embed_dim must be in",
        ),
        (
            edit_json("model.json", lambda m: m["architecture"].update(embed_dim=64, num_heads=2)),
            "model.safetensors",
            "do not fit",
        ),
        (edit_json("model.json", lambda m: m["input"].update(n_max=10**12)), "model.json", "input.n_max must be in"),
        (edit_json("model.json", lambda m: m.pop("architecture")), "model.json", "architecture: missing"),
        (edit_json("model.json", lambda m: m.pop("training_window")), "model.json", "training_window: missing"),
        (edit_json("model.json", lambda m: m.update(training_window={"events": -1})), "model.json", "training_window"),
        (edit_json("model.json", lambda m: m.update(training_window=[1e40])), "model.json", "training_window"),
        (write("model.safetensors", b"garbage" * 10), "model.safetensors", "not a readable safetensors file"),
        (cut("model.safetensors", 0.5), "model.safetensors", "not a readable safetensors file"),
        (rename_tensor, "model.safetensors", r"missing \['head.bias', 'head.weight'\], unexpected \['header"),
        (edit_json("tokenizer.json", lambda m: m["architecture"].update(num_layers=0)), "tokenizer.json", "num_layers"),
        (cut("tokenizer.safetensors", 0.9), "tokenizer.safetensors", "not a readable safetensors file"),
    ],
)
def test_a_damaged_export_is_one_error_naming_the_file(export_dir, tmp_path, damage, file, message):
    folder = tmp_path / "export"
    folder.mkdir()
    for path in export_dir.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    damage(folder)
    with pytest.raises(RunError, match=message) as info:
        Predictor(folder)  # what mem serve does: the model, then its tokenizer
    assert str(info.value).startswith(f"{folder / file}: ")


def write_export(folder: Path, arch: ViTConfig, spec: InputSpec) -> Path:
    """An export of a classifier ``arch`` on inputs ``spec`` with zero weights, written without building the model."""
    meta = {"task": "classification", "architecture": to_dict(arch), "classes": ["a", "b"], "head_channels": None}
    with torch.device("meta"):
        skeleton = build_task_model(meta).state_dict()
    folder.mkdir()
    window = {"events": spec.n_max, "ms": None}
    meta.update(format_version=EXPORT_VERSION, input=to_dict(spec), training_window=window)
    (folder / "model.json").write_text(json.dumps(meta))
    save_file({k: torch.zeros(v.shape, dtype=v.dtype) for k, v in skeleton.items()}, str(folder / "model.safetensors"))
    return folder


def test_an_export_of_another_format_version_is_refused_naming_both_versions(export_dir, tmp_path):
    folder = tmp_path / "export"
    shutil.copytree(export_dir, folder)
    edit_json("model.json", lambda m: m.update(format_version=1))(folder)
    with pytest.raises(RunError) as info:
        load_model(folder)
    assert str(info.value) == (
        f"{folder / 'model.json'}: export format version 1, this MEM reads version {EXPORT_VERSION} "
        "(export the model again with `mem export`)"
    )


def test_an_architecture_whose_derived_buffers_would_not_fit_is_refused_before_building(tmp_path):
    # 2048 px in 32 px patches: each of 32 blocks would compute a 4097^2 relative position index (134 MB) no file stores
    arch = ViTConfig(img_size=2048, patch_size=32, embed_dim=8, depth=32, num_heads=1, drop_path=0.0)
    folder = write_export(tmp_path / "export", arch, InputSpec(size=(2048, 2048)))
    with pytest.raises(RunError, match=r"model\.safetensors: .*would compute \d+ bytes of buffers"):
        load_model(folder)


def test_a_compute_bomb_is_refused_before_it_is_built(tmp_path):
    """A model.json that asks for 4 million tokens (4096 px in 2 px patches): a warm-up that never ends."""
    arch = ViTConfig(
        img_size=2048, patch_size=2, embed_dim=2, depth=1, num_heads=1, rel_pos_bias=False, abs_pos_emb=True
    )
    folder = write_export(tmp_path / "export", arch, InputSpec(size=(2048, 2048)))
    # no ViTConfig or InputSpec holds 4096 px: written by hand
    edit_json("model.json", lambda m: m["architecture"].update(img_size=4096))(folder)
    edit_json("model.json", lambda m: m["input"].update(size=[4096, 4096]))(folder)
    with pytest.raises(RunError, match=r"model\.json: architecture\.img_size must be in \[1, 2048\], got 4096"):
        Predictor(folder)


def test_a_model_whose_window_takes_more_work_than_the_limit_is_refused(export_dir, monkeypatch):
    flops = load_model(export_dir)[1]["window_flops"]
    assert flops > 0
    monkeypatch.setattr(export.cost, "MAX_WINDOW_FLOPS", flops - 1)
    with pytest.raises(RunError, match=re.escape(f"model.json: one window through this model takes {flops:.3g} FLOP")):
        load_model(export_dir)


def test_the_paper_presets_models_are_within_the_limits():
    """ViT-B/16 at 224 px (classification) and at 512 px (DSEC segmentation) export and serve."""
    seen = []
    for preset in ("paper-ncars", "paper-ncaltech101", "paper-nimagenet"):
        for stage, classes in (("finetune", 1000), ("segment", 11)):
            config = stage_config(stage, preset=preset)
            meta = {
                "task": TASKS[stage],
                "architecture": to_dict(replace(config.model, img_size=config.input.size[0])),
                "classes": [f"class {i}" for i in range(classes)],
                "input": to_dict(config.input),
                "head_channels": getattr(config, "head_channels", None),
                "training_window": {"events": config.input.n_max, "ms": None},
            }
            export.check_meta(meta, Path("model.json"))
            if meta not in seen:
                seen.append(meta)
                assert window_flops(meta) <= MAX_WINDOW_FLOPS


def finetune_run(folder: Path) -> Path:
    run = RunDir.create(
        folder, "finetune", {"model": to_dict(ARCH), "input": to_dict(InputSpec(size=(32, 32)))}, resume=False
    )
    run.write_json("classes.json", {"classes": ["a", "b", "c"]})
    run.save_checkpoint({"model": MEMViT(ARCH, 3).state_dict(), "epoch": 0}, best=True)
    return folder


@pytest.mark.parametrize(
    ("damage", "file", "message"),
    [
        (cut("best.pt", 0.5), "best.pt", "not a readable MEM checkpoint"),
        (lambda run: torch.save([1, 2], run / "best.pt"), "best.pt", "not a MEM checkpoint .*list"),
        (lambda run: torch.save({"epoch": 1}, run / "best.pt"), "best.pt", "no model weights"),
        (lambda run: (run / "classes.json").unlink(), "classes.json", "no such file or directory"),
        (write("config.json", b"\xff\xfe"), "config.json", "corrupt"),
        (
            edit_json("config.json", lambda c: c["config"].pop("model")),
            "config.json",
            "architecture: expected an object",
        ),
        (write("init.json", b'{"path": 7}'), "init.json", "no 'path'"),
    ],
)
def test_a_damaged_run_is_one_error_naming_the_file(tmp_path, damage, file, message):
    run = finetune_run(tmp_path / "run")
    damage(run)
    with pytest.raises(RunError, match=message) as info:
        Predictor(run)
    assert str(info.value).startswith(f"{run / file}: ")


def test_a_tokenizer_run_with_a_damaged_checkpoint_names_it(tmp_path):
    run = RunDir.create(tmp_path / "tok", "tokenizer", {"model": to_dict(TOKENIZER)}, resume=False)
    run.save_checkpoint({"model": {"encoder.0.weight": torch.zeros(3)}})
    with pytest.raises(RunError, match=r"checkpoint\.pt: the weights do not fit .*missing"):
        load_tokenizer(run.path)


def test_cli_export_reports_a_damaged_checkpoint_in_one_line(tmp_path):
    run = finetune_run(tmp_path / "run")
    (run / "best.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    args = ["export", "--model", str(run), "--out", str(tmp_path / "x")]
    done = subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {run / 'best.pt'}: not a readable MEM checkpoint"), lines


@pytest.mark.parametrize(("dataset", "ms"), [("ncars", 100.0), ("sim", 50.0), ("nmnist", None)])
def test_an_export_records_the_window_its_model_was_trained_on(tmp_path, dataset, ms):
    """``mem serve`` serves a model on windows like its training samples: N-Cars 100 ms, sim 50 ms, N-MNIST (samples
    of varying length) by event count only."""
    spec = to_dict(InputSpec(n_max=5000, size=(32, 32)))
    config = {"model": to_dict(ARCH), "input": spec, "data": {"dataset": dataset}}
    run = RunDir.create(tmp_path / "run", "finetune", config, resume=False)
    run.write_json("classes.json", {"classes": ["a", "b"]})
    run.save_checkpoint({"model": MEMViT(ARCH, 2).state_dict(), "epoch": 0}, best=True)
    out = export_run(run.path, tmp_path / "export")
    assert json.loads((out / "model.json").read_text())["training_window"] == {"events": 5000, "ms": ms}
    assert load_model(out)[1]["training_window"] == load_model(run.path)[1]["training_window"]
