"""Model files: exports round-trip, and models saved before the timm pooling head still load and predict the same."""

from __future__ import annotations

import json

import pytest
import torch

from mem_core.configuration import to_dict
from mem_core.export import export_random, export_run, load_model
from mem_core.models import MEMViT, ViTConfig
from mem_core.representation import InputSpec
from mem_core.train.rundir import RunDir

ARCH = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0)


def test_random_export_loads_as_the_model_it_describes(tmp_path):
    out = export_random(
        tmp_path / "export", classes=("a", "b", "c"), architecture=ARCH, input_spec=InputSpec(size=(32, 32))
    )
    model, meta = load_model(out)
    assert meta["task"] == "classification" and meta["classes"] == ["a", "b", "c"]
    assert model(torch.rand(2, 2, 32, 32)).shape == (2, 3) and not model.training


def test_a_classifier_saved_in_the_old_layout_loads_and_predicts_as_it_was_trained(tmp_path):
    # Before November 2026 a classifier wrapped its ViT (keys backbone.*) and normalized every token before the
    # mean as well as after it: tokens -> LayerNorm -> mean -> fc_norm -> head.
    torch.manual_seed(0)
    old = MEMViT(ARCH, 3)
    old.norm = torch.nn.LayerNorm(ARCH.embed_dim, eps=1e-6)
    torch.nn.init.normal_(old.norm.weight)  # a trained token norm, not the identity it starts as
    head_keys = ("fc_norm.", "head.")
    legacy = {(k if k.startswith(head_keys) else f"backbone.{k}"): v for k, v in old.state_dict().items()}
    run = RunDir.create(
        tmp_path / "run", "finetune", {"model": to_dict(ARCH), "input": to_dict(InputSpec(size=(32, 32)))}, resume=False
    )
    run.write_json("classes.json", {"classes": ["a", "b", "c"]})
    run.save_checkpoint({"model": legacy, "epoch": 0}, best=True)

    model, _ = load_model(run.path)
    x = torch.rand(4, 2, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), old(x), atol=1e-6)


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


def test_an_export_written_before_the_window_was_recorded_loads_with_its_event_count(tmp_path):
    out = export_random(tmp_path / "export", architecture=ARCH, input_spec=InputSpec(n_max=7000, size=(32, 32)))
    meta = json.loads((out / "model.json").read_text())
    del meta["training_window"]
    (out / "model.json").write_text(json.dumps(meta))
    assert load_model(out)[1]["training_window"] == {"events": 7000, "ms": None}
