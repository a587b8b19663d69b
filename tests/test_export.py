"""Model files: exports round-trip, and models saved before the timm pooling head still load and predict the same."""

from __future__ import annotations

import torch

from mem_core.configuration import to_dict
from mem_core.export import export_random, load_model
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
