"""MEM models: tokenizer, masking, ViT + pretraining / classification / segmentation heads, eMAE (tiny sizes)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2

from mem_core.errors import ConfigError
from mem_core.fields import ConfigConflict, FieldError
from mem_core.models import (
    BlockMaskGenerator,
    DiscreteVAE,
    EMAEPretrainModel,
    MEMPretrainModel,
    MEMViT,
    SegmentationModel,
    TokenizerConfig,
    ViTConfig,
    codebook_stats,
    confusion_matrix,
    load_pretrained_backbone,
    patchify,
    segmentation_metrics,
    unpatchify,
    vit_base,
    vit_tiny,
)
from mem_core.models.tokenizer import gumbel_softmax
from mem_core.models.vit import TensorDropPath, compile_blocks, masked_positions

IMG, PATCH, DIM, DEPTH, TOKENS = 32, 8, 64, 2, 64
GRID = (IMG // PATCH, IMG // PATCH)
N = GRID[0] * GRID[1]


@pytest.fixture(autouse=True)
def _seed_weights():
    torch.manual_seed(0)  # weight initialisation (timm) draws from torch's default generator


def tiny_config(**overrides) -> ViTConfig:
    return ViTConfig(
        **{"img_size": IMG, "patch_size": PATCH, "embed_dim": DIM, "depth": DEPTH, "num_heads": 4, **overrides}
    )


def tiny_vit(**overrides) -> MEMViT:
    return MEMViT(tiny_config(**overrides))


def histograms(batch: int = 2, seed: int = 0, channels: int = 2) -> torch.Tensor:
    return torch.rand(batch, channels, IMG, IMG, generator=torch.Generator().manual_seed(seed))


def half_mask(batch: int = 2, seed: int = 0) -> torch.Tensor:
    return BlockMaskGenerator(GRID, 0.5, min_block=2).batch(batch, np.random.default_rng(seed))


# ---------------------------------------------------------------- ViT


def test_vit_shapes():
    vit = tiny_vit().eval()
    x = histograms()
    assert vit.forward_features(x).shape == (2, 1 + N, DIM)
    assert vit.forward_tokens(x, half_mask()).shape == (2, N, DIM)
    assert vit(x).shape == (2, DIM)
    maps = vit.forward_intermediates(x, [0, 1], intermediates_only=True)  # timm's: raw block outputs as maps
    assert [m.shape for m in maps] == [(2, DIM, *GRID)] * 2
    assert torch.equal(maps[0], vit.forward_intermediates(x, [0], stop_early=True, intermediates_only=True)[0])


@pytest.mark.parametrize("channels", [3, 8])
def test_vit_input_variants(channels):
    vit = tiny_vit(in_chans=channels).eval()
    assert vit(histograms(channels=channels)).shape == (2, DIM)


def test_vit_rejects_wrong_input_and_indices():
    vit = tiny_vit()
    with pytest.raises(ValueError, match=r"\(B, 2, 32, 32\)"):
        vit(torch.rand(1, 2, 64, 64))
    with pytest.raises(ValueError, match="4 blocks"):
        SegmentationModel(vit, num_classes=3, indices=(0, 1, 2, DEPTH))
    with pytest.raises(ValueError, match="bool"):
        vit.forward_features(histograms(), torch.zeros(2, N))


def test_vit_config_presets_and_validation():
    base = vit_base()
    assert (base.depth, base.num_heads, base.embed_dim, base.patch_size, base.grid_size) == (12, 12, 768, 16, (14, 14))
    assert vit_tiny().grid_size == (14, 14)
    assert vit_tiny(img_size=112, patch_size=8).grid_size == (14, 14)
    with pytest.raises(ConfigConflict, match="patch_size"):
        ViTConfig(img_size=100, patch_size=16)
    with pytest.raises(ConfigConflict, match="positive multiple of patch_size"):
        ViTConfig(img_size=8, patch_size=16)
    for field in ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads"):  # no ZeroDivisionError
        with pytest.raises(FieldError, match=rf"^{field} must be in \[1, \d+\], got 0$"):
            ViTConfig(**{field: 0})
    with pytest.raises(ConfigConflict, match="num_heads"):
        ViTConfig(embed_dim=100, num_heads=12)


@pytest.mark.parametrize("stem", ["patch", "conv", "resnet"])
def test_masked_patches_are_hidden_from_the_model(stem):
    """With a mask, what lies under masked patches cannot influence any output, also through a convolutional stem
    whose receptive fields overlap the neighbouring patches; visible content does."""
    vit = tiny_vit(stem=stem).eval()
    mask = half_mask()
    x = histograms()
    pixel_mask = mask.reshape(2, 1, *GRID).repeat_interleave(PATCH, 2).repeat_interleave(PATCH, 3)  # (B, 1, H, W)
    changed_under_mask = torch.where(pixel_mask, histograms(seed=1), x)
    changed_visible = torch.where(pixel_mask, x, histograms(seed=1))
    with torch.no_grad():
        reference = vit.forward_tokens(x, mask)
        assert torch.equal(vit.forward_tokens(changed_under_mask, mask), reference)
        assert not torch.allclose(vit.forward_tokens(changed_visible, mask), reference)
        # at the input, masking replaces the masked embeddings by the mask token (and with the patch stem only them)
        plain, masked = vit.embed(x)[:, 1:], vit.embed(x, mask)[:, 1:]
        assert torch.equal(masked[mask], vit.mask_token[0].expand(int(mask.sum()), -1))
        if stem == "patch":
            assert torch.equal(masked[~mask], plain[~mask])


def test_conv_stem_keeps_the_patch_grid_and_is_checked():
    """``stem = "conv"``: stride-2 convolutions down to the same token grid; a patch size it cannot reach by
    halving, or an unknown stem, is refused by name."""
    vit = tiny_vit(stem="conv").eval()
    assert vit.forward_tokens(histograms()).shape == (2, N, DIM)
    strides = [m.stride[0] for m in vit.patch_embed.proj.modules() if isinstance(m, torch.nn.Conv2d)]
    assert math.prod(strides) == PATCH and strides[-1] == 1  # log2(PATCH) halvings, then the 1 x 1 projection
    with pytest.raises(ConfigConflict, match="power of two"):
        ViTConfig(img_size=96, patch_size=12, stem="conv")
    with pytest.raises(ConfigError, match="unknown stem 'hmlp'"):
        ViTConfig(stem="hmlp")


def test_resnet_stem_is_a_hybrid_vit_on_the_patch_grid():
    """``stem = "resnet"``: ResNet-18's stages up to the patch size's stride, projected to the tokens; it trains
    with the rest of the model, and a patch size that is not one of ResNet-18's strides is refused by name."""
    vit = tiny_vit(stem="resnet")
    stem = vit.patch_embed.proj
    assert [name for name, _ in stem.body.named_children()][-1] == "layer2"  # stride 8 ends after layer2
    assert vit.forward_tokens(histograms()).shape == (2, N, DIM)
    vit(histograms()).square().mean().backward()
    assert stem.body.conv1.weight.grad.abs().sum() > 0
    with pytest.raises(ConfigConflict, match=r"one of \(2, 4, 8, 16, 32\), got 12"):
        ViTConfig(img_size=96, patch_size=12, stem="resnet")


def test_frozen_layers_of_a_hybrid_vit_keep_their_batch_norm_statistics_and_get_no_gradient():
    """``freeze_layers(2)``: in training mode the stem's batch norm still normalizes with its pretrained statistics
    (and leaves them), the stem and the first block get no gradient, the second block does."""
    vit = tiny_vit(stem="resnet")
    vit.freeze_layers(2)
    vit.train()
    bn = vit.patch_embed.proj.body.bn1
    before = bn.running_mean.clone()
    vit(histograms()).square().mean().backward()
    assert not bn.training and torch.equal(bn.running_mean, before)
    assert vit.patch_embed.proj.body.conv1.weight.grad is None and vit.blocks[0].mlp.fc1.weight.grad is None
    assert vit.blocks[1].mlp.fc1.weight.grad.abs().sum() > 0 and vit.blocks[1].training
    with pytest.raises(ValueError, match="frozen layers must be 0"):
        vit.freeze_layers(len(vit.blocks) + 1)


def test_grad_checkpointing_gives_the_same_result():
    vit = tiny_vit().eval()
    x = histograms()
    reference = vit.forward_features(x)
    vit.set_grad_checkpointing(True)
    assert torch.allclose(vit.forward_features(x), reference)


def test_cpu_attention_takes_the_plain_path_and_matches_sdpa(monkeypatch):
    """A training step on a CPU computes softmax(q k^T + bias) v in the blocks themselves (SDPA's masked path is
    slower there), with SDPA's result and gradients; inference keeps SDPA."""
    import copy

    import timm.models.beit

    vit = tiny_vit(drop_path=0.0).train()
    sdpa = copy.deepcopy(vit)
    for block in sdpa.blocks:  # the reference: timm's SDPA call, the kernel choice switched off
        block.attn._forward_pre_hooks.clear()
        block.attn.fused_attn = True
    calls = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        timm.models.beit.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real_sdpa(*a, **k)
    )
    x = histograms()
    out = vit(x)
    out.square().sum().backward()
    assert calls == []  # training on the CPU: the plain product
    reference = sdpa(x)
    reference.square().sum().backward()
    assert len(calls) == DEPTH
    assert torch.allclose(out, reference, atol=1e-5)
    for (name, p), q in zip(vit.named_parameters(), sdpa.parameters(), strict=True):
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-5), name
    calls.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        vit(x)
    assert calls == []  # a bf16 step on the CPU, as cpu_bf16 runs it
    with torch.inference_mode():
        assert torch.allclose(vit.eval()(x), sdpa.eval()(x), atol=1e-5)
    assert len(calls) == 2 * DEPTH  # fp32 inference (validation, the live server) on a CPU: SDPA


# ---------------------------------------------------------------- masking


@pytest.mark.parametrize(
    ("grid", "ratio", "min_block"),
    [((14, 14), 0.5, 16), ((14, 14), 0.25, 16), ((14, 14), 0.75, 16), ((4, 4), 0.5, 2), ((7, 5), 0.4, 4)],
)
def test_block_mask_masks_exactly_the_ratio(grid, ratio, min_block):
    generator = BlockMaskGenerator(grid, ratio, min_block=min_block)
    rng = np.random.default_rng(0)
    expected = round(ratio * grid[0] * grid[1])
    for _ in range(20):
        mask = generator(rng)
        assert mask.dtype == torch.bool and mask.shape == grid
        assert int(mask.sum()) == expected


def test_block_mask_tops_up_when_blocks_do_not_fit():
    generator = BlockMaskGenerator((4, 4), 0.5, min_block=100)  # no block fits: all patches come from the top-up
    assert int(generator(np.random.default_rng(0)).sum()) == 8
    assert int(BlockMaskGenerator((4, 4), 1.0)(np.random.default_rng(0)).sum()) == 16
    assert int(BlockMaskGenerator((4, 4), 0.0)(np.random.default_rng(0)).sum()) == 0


def test_block_size_scales_with_the_grid():
    # BEiT's smallest block is 16 of 196 patches; a small grid keeps that share instead of masking huge blocks
    assert BlockMaskGenerator((14, 14), 0.5).min_block == 16
    assert BlockMaskGenerator((8, 8), 0.5).min_block == 5
    assert BlockMaskGenerator((2, 2), 0.5).min_block == 1
    with pytest.raises(ValueError, match="min_block"):
        BlockMaskGenerator((8, 8), 0.5, min_block=0)


def test_block_mask_forms_blocks():
    """Block-wise masking masks contiguous rectangles: most masked patches have a masked 4-neighbour."""
    mask = BlockMaskGenerator((14, 14), 0.5)(np.random.default_rng(0)).numpy()
    padded = np.pad(mask, 1)
    neighbour = padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2] | padded[1:-1, 2:]
    assert (neighbour[mask]).mean() > 0.9


def test_block_mask_is_reproducible_with_a_seed():
    generator = BlockMaskGenerator((14, 14), 0.5)
    a = generator.batch(4, np.random.default_rng(7))
    assert a.shape == (4, 196) and a.dtype == torch.bool
    assert torch.equal(a, generator.batch(4, np.random.default_rng(7)))
    assert not torch.equal(a, generator.batch(4, np.random.default_rng(8)))
    assert not torch.equal(a[0], a[1])  # samples of a batch are independent
    t = generator.batch(4, torch.Generator().manual_seed(7))
    assert torch.equal(t, generator.batch(4, torch.Generator().manual_seed(7)))
    with pytest.raises(TypeError, match="Generator"):
        generator(7)


def beit_mask(generator: BlockMaskGenerator, rng: np.random.Generator, cells: np.ndarray | None = None) -> np.ndarray:
    """One mask by BEiT's rule (microsoft/unilm beit/masking_generator.py) in plain Python and numpy, drawing from
    ``rng`` block by block: the reference the compiled generator must reproduce. ``cells`` (h, w): only those patches
    count, ``round(mask_ratio * cells.sum())`` of them masked."""
    height, width = generator.grid
    cells = np.ones(generator.grid, dtype=bool) if cells is None else cells
    target = round(generator.mask_ratio * int(cells.sum()))
    mask = np.zeros(generator.grid, dtype=bool)
    count = 0
    while count < target:
        budget = min(target - count, generator.max_block)
        for _ in range(10):
            area = rng.uniform(*sorted((generator.min_block, budget)))
            aspect = math.exp(rng.uniform(*generator.log_aspect))
            h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 1 <= h <= height and 1 <= w <= width:
                top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
                block = (slice(top, top + h), slice(left, left + w))
                new = int((cells[block] & ~mask[block]).sum())
                if 0 < new <= budget:
                    mask[block] = True
                    count += new
                    break
        else:
            free = np.flatnonzero(cells & ~mask)
            mask.flat[rng.choice(free, target - count, replace=False)] = True
            break
    return mask


@pytest.mark.parametrize(
    ("grid", "ratio", "min_block", "max_block"),
    [
        ((14, 14), 0.5, None, None),
        ((14, 14), 0.25, None, None),
        ((14, 14), 0.75, None, 40),
        ((7, 5), 0.4, 4, None),
        ((4, 4), 0.5, 100, None),  # no block fits: every patch from the top-up
        ((8, 8), 1.0, None, None),
        ((8, 8), 0.0, None, None),
    ],
)
def test_a_batch_of_block_masks_is_beits_rule_drawn_mask_after_mask(grid, ratio, min_block, max_block):
    """The compiled batch generator gives exactly the masks of BEiT's rule applied one mask after the other with the
    same seed, top-ups included: a resumed or repeated run draws the masks it drew before."""
    generator = BlockMaskGenerator(grid, ratio, min_block=min_block, max_block=max_block)
    for seed in range(3):
        rng = np.random.default_rng([seed, 1])
        expected = np.stack([beit_mask(generator, rng) for _ in range(64)]).reshape(64, -1)
        np.testing.assert_array_equal(generator.batch(64, np.random.default_rng([seed, 1])).numpy(), expected)


def test_masks_over_the_patches_with_events_follow_the_same_rule_on_those_patches():
    """With ``occupied`` (``mask_empty=false``), each mask holds ``round(ratio * occupied)`` of its sample's occupied
    patches, drawn by BEiT's rule counting those only (blocks may also cover empty patches); a sample without events
    gets no mask, and every patch occupied is the plain rule."""
    generator = BlockMaskGenerator((8, 8), 0.4)
    rng = np.random.default_rng(5)
    occupied = rng.random((64, 8, 8)) < rng.uniform(0.0, 1.0, (64, 1, 1))  # from empty to full samples
    occupied[0] = False
    masks = generator.batch(64, np.random.default_rng(9), torch.from_numpy(occupied.reshape(64, -1))).numpy()
    masks = masks.reshape(64, 8, 8)
    reference = np.random.default_rng(9)
    for mask, cells in zip(masks, occupied, strict=True):
        np.testing.assert_array_equal(mask, beit_mask(generator, reference, cells))
        assert (mask & cells).sum() == round(0.4 * cells.sum())
    assert not masks[0].any()
    full = torch.ones(64, 64, dtype=torch.bool)
    assert torch.equal(
        generator.batch(64, np.random.default_rng(3), full), generator.batch(64, np.random.default_rng(3))
    )


# ---------------------------------------------------------------- pretraining (MEM)


def test_pretrain_loss_is_cross_entropy_on_masked_patches_only():
    model = MEMPretrainModel(tiny_vit(), TOKENS).eval()
    x, mask = histograms(), half_mask()
    targets = torch.randint(0, TOKENS, (2, N), generator=torch.Generator().manual_seed(0))
    out = model(x, mask, targets.reshape(2, *GRID))
    with torch.no_grad():
        all_logits = model.lm_head(model.backbone.forward_tokens(x, mask))  # (B, N, V)
    manual = F.cross_entropy(all_logits[mask], targets[mask])
    assert out["logits"].shape == (int(mask.sum()), TOKENS)
    assert torch.allclose(out["loss"], manual, atol=1e-6)
    assert float(out["acc"]) == pytest.approx(float((all_logits[mask].argmax(-1) == targets[mask]).float().mean()))
    # the targets of visible patches play no part
    other_visible = torch.where(mask, targets, (targets + 1) % TOKENS)
    assert torch.allclose(model(x, mask, other_visible)["loss"], out["loss"])
    assert not torch.allclose(model(x, mask, (targets + 1) % TOKENS)["loss"], out["loss"])


def test_pretrain_loss_is_the_same_with_the_masked_positions_passed_in():
    """What pretraining does: the masked positions found on the host and passed in, so that a compiled model never
    searches for them in its graph."""
    model = MEMPretrainModel(tiny_vit(), TOKENS).eval()
    x, mask = histograms(), half_mask()
    targets = torch.randint(0, TOKENS, (2, N), generator=torch.Generator().manual_seed(0))
    positions = masked_positions(mask)
    assert torch.equal(positions, mask.flatten().nonzero()[:, 0])
    given, found = model(x, mask, targets, positions), model(x, mask, targets)
    assert torch.equal(given["logits"], found["logits"]) and torch.equal(given["loss"], found["loss"])


def test_pretrain_runs_under_bf16_autocast():
    model = MEMPretrainModel(tiny_vit(), TOKENS)
    targets = torch.randint(0, TOKENS, (2, N))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(histograms(), half_mask(), targets)
    out["loss"].backward()
    assert math.isfinite(out["loss"].item())
    assert model.backbone.mask_token.grad is not None


# ---------------------------------------------------------------- compiling the blocks


def test_compile_blocks_compiles_each_block_in_place_and_keeps_the_weights():
    """``compile = "blocks"``: every transformer block (the encoder's, an eMAE decoder's) compiled on its own, the
    model, its parameters and its state dict's names as they were, so checkpoints and exports do not change."""
    model = MEMPretrainModel(tiny_vit(drop_path=0.1), TOKENS)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = list(model.parameters())
    assert compile_blocks(model) == DEPTH
    assert all(block._compiled_call_impl is not None for block in model.backbone.blocks)
    assert list(model.parameters()) == parameters
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    rates = [(b.drop_path1.rate, b.drop_path2.rate) for b in model.backbone.blocks]
    assert all(type(b.drop_path1) is TensorDropPath for b in model.backbone.blocks)
    assert rates == [(0.0, 0.0), pytest.approx((0.1, 0.1))]  # timm's linear rule over the depth
    encoder = tiny_vit(rel_pos_bias=False, abs_pos_emb=True)
    emae = EMAEPretrainModel(encoder, loss_on="all", decoder_dim=32, decoder_depth=2, decoder_heads=2)
    assert compile_blocks(emae) == DEPTH + 2
    assert compile_blocks(DiscreteVAE(TokenizerConfig(img_size=IMG, num_layers=3, num_tokens=TOKENS))) == 0


def test_tensor_drop_path_drops_samples_at_its_rate_and_keeps_the_mean():
    drop = TensorDropPath(0.25).train()
    x = torch.ones(20_000, 3, 4)
    torch.manual_seed(0)
    y = drop(x)
    per_sample = y[:, 0, 0]
    assert per_sample.unique().tolist() == [0.0, pytest.approx(1 / 0.75)]
    assert (y == y[:, :1, :1]).all()  # a whole sample is dropped or kept
    assert (per_sample == 0).float().mean().item() == pytest.approx(0.25, abs=0.01)
    assert y.mean().item() == pytest.approx(1.0, abs=0.02)
    assert torch.equal(TensorDropPath(0.0).train()(x), x)
    assert torch.equal(drop.eval()(x), x)


# ---------------------------------------------------------------- task models and the optimizer interface


def make_task_model(kind: str) -> torch.nn.Module:
    if kind in ("pretrain", "pretrain-conv"):
        return MEMPretrainModel(tiny_vit(stem="conv" if kind == "pretrain-conv" else "patch"), TOKENS)
    if kind == "classifier":
        return MEMViT(tiny_config(), num_classes=5)
    if kind == "segmentation":
        return SegmentationModel(tiny_vit(), num_classes=3, channels=16)
    return tiny_emae(kind.removeprefix("emae-"))


def tiny_emae(loss_on: str = "masked", stem: str = "patch") -> EMAEPretrainModel:
    encoder = tiny_vit(abs_pos_emb=True, rel_pos_bias=False, stem=stem)
    return EMAEPretrainModel(encoder, loss_on=loss_on, decoder_dim=32, decoder_depth=1, decoder_heads=2)


def task_loss(kind: str, model: torch.nn.Module) -> torch.Tensor:
    x, mask = histograms(), half_mask()
    if kind.startswith("pretrain"):
        return model(x, mask, torch.randint(0, TOKENS, (2, N)))["loss"]
    if kind == "classifier":
        return F.cross_entropy(model(x), torch.tensor([0, 4]))
    if kind == "segmentation":
        return F.cross_entropy(model(x), torch.randint(0, 3, (2, IMG, IMG)))
    return model(x, mask)["loss"]


TASKS = ["pretrain", "pretrain-conv", "classifier", "segmentation", "emae-masked", "emae-all"]


@pytest.mark.parametrize("kind", TASKS)
def test_every_trainable_parameter_gets_a_gradient(kind):
    """DDP fails on trainable parameters that receive no gradient: every task model must have none."""
    model = make_task_model(kind).train()
    task_loss(kind, model).backward()
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []


@pytest.mark.parametrize("kind", TASKS)
def test_layer_decay_groups_scale_lr_down_with_depth(kind):
    model = make_task_model(kind)
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.65)
    scale_of = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            scale_of[id(p)] = (group["lr_scale"], group["weight_decay"])
    named = dict(model.named_parameters())

    def scale(name: str) -> float:
        return scale_of[id(named[name])][0]

    vit = "" if kind == "classifier" else "backbone."  # a classifier is the ViT itself, the others wrap it
    # stem < block 0 < block 1 < final norm / heads, each step a factor 0.65
    stem = scale(next(n for n in named if n.startswith(f"{vit}patch_embed.proj.")))
    block0 = scale(f"{vit}blocks.0.attn.qkv.weight")
    block1 = scale(f"{vit}blocks.1.attn.qkv.weight")
    assert stem == pytest.approx(0.65 * block0) and block0 == pytest.approx(0.65 * block1)
    assert scale(f"{vit}cls_token") == stem
    head = next(
        n for n in named if named[n].ndim >= 2 and n.split(".")[0] in ("head", "lm_head", "decode_head", "decoder_pred")
    )
    assert scale(head) == 1.0
    assert block1 < 1.0
    # embeddings and relative position tables are excluded from weight decay
    assert scale_of[id(named[f"{vit}cls_token"])][1] == 0.0
    assert scale_of[id(named[f"{vit}blocks.0.attn.qkv.weight"])][1] == 0.05
    if named[f"{vit}mask_token"].requires_grad:
        assert scale_of[id(named[f"{vit}mask_token"])] == (stem, 0.0)
    if not kind.startswith("emae"):  # eMAE's encoder has absolute positions, no relative tables
        assert scale_of[id(named[f"{vit}blocks.0.attn.relative_position_bias_table"])][1] == 0.0


# ---------------------------------------------------------------- classification, transfer, probing


def test_classifier_shapes_and_small_head():
    model = MEMViT(tiny_config(), num_classes=5).eval()
    x = histograms()
    assert model(x).shape == (2, 5)
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (2, DIM)
    assert model.head.weight.abs().max() < 1e-3  # near-zero head: finetuning starts from the pretrained features
    model.reset_classifier(7)
    assert model(x).shape == (2, 7)
    assert model.get_classifier() is model.head


def test_classifier_normalizes_once_after_pooling():
    # timm's avg-pool head: no LayerNorm on the tokens before the mean, one (fc_norm) after it
    model = MEMViT(tiny_config(), num_classes=5).eval()
    assert isinstance(model.norm, torch.nn.Identity) and isinstance(model.fc_norm, torch.nn.LayerNorm)
    x = histograms()
    with torch.no_grad():
        tokens = model.forward_features(x)[:, 1:]
        assert torch.allclose(model(x), model.head(model.fc_norm(tokens.mean(1))))


def test_pretrained_weights_transfer_to_the_classifier():
    pretrain = MEMPretrainModel(tiny_vit(), TOKENS)
    classifier = MEMViT(tiny_config(drop_path=0.0), num_classes=5)  # a different random init
    report = load_pretrained_backbone(classifier, pretrain.state_dict())
    assert report.missing == [] and report.unexpected == []
    # the classifier normalizes after pooling (fc_norm): the token norm and the pretraining-only parts stay behind
    dropped = ["lm_head.bias", "lm_head.weight", "norm.bias", "norm.weight"]
    assert sorted(report.dropped) == dropped
    source = pretrain.backbone.state_dict()
    for name, tensor in classifier.state_dict().items():
        if name in source:
            assert torch.equal(tensor, source[name]), name
    # a bare backbone state dict works too
    assert sorted(load_pretrained_backbone(classifier, pretrain.backbone.state_dict()).dropped) == dropped[2:]


def test_transfer_rejects_a_different_patch_size():
    pretrain = MEMPretrainModel(MEMViT(tiny_config(patch_size=4)), TOKENS)
    with pytest.raises(ValueError, match="patch_embed"):
        load_pretrained_backbone(MEMViT(tiny_config(), 5), pretrain.state_dict())


def test_transfer_to_a_larger_input_resizes_the_relative_position_tables():
    # the paper segments DSEC at 512 x 512 with a backbone pretrained at 224 x 224: 14 x 14 -> 32 x 32 patches
    pretrain = MEMPretrainModel(tiny_vit(), TOKENS)  # 32 x 32 input, 4 x 4 grid
    bigger = MEMViT(tiny_config(img_size=64), 5)  # 8 x 8 grid
    report = load_pretrained_backbone(bigger, pretrain.state_dict())
    assert report.missing == [] and report.unexpected == []
    source = pretrain.backbone.blocks[0].attn.relative_position_bias_table  # (7 * 7 + 3, heads)
    resized = bigger.blocks[0].attn.relative_position_bias_table  # (15 * 15 + 3, heads)
    assert resized.shape == (15 * 15 + 3, source.shape[1])
    assert torch.allclose(resized[7 * 15 + 7], source[3 * 7 + 3], atol=1e-5)  # offset (0, 0) keeps its bias
    assert torch.equal(resized[-3:], source[-3:])  # the cls entries are copied
    assert torch.equal(bigger.blocks[1].mlp.fc1.weight, pretrain.backbone.blocks[1].mlp.fc1.weight)
    assert bigger(torch.rand(2, 2, 64, 64)).shape == (2, 5)


def test_linear_probe_trains_only_the_head():
    model = MEMViT(tiny_config(), num_classes=5)
    model.freeze_features()
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == ["fc_norm.bias", "fc_norm.weight", "head.bias", "head.weight"]
    model.train()
    assert model.training and model.head.training  # frozen features without drop-path noise:
    assert not any(m.training for m in (model.patch_embed, model.blocks, model.blocks[0].drop_path1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    task_loss("classifier", model).backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {"fc_norm.bias", "fc_norm.weight", "head.bias", "head.weight"}


# ---------------------------------------------------------------- segmentation


def test_segmentation_output_and_feature_blocks():
    model = SegmentationModel(tiny_vit(depth=6), num_classes=3, channels=16).eval()
    assert model.indices == (2, 3, 4, 5)  # the last four blocks (8-11 for ViT-B)
    assert model(histograms()).shape == (2, 3, IMG, IMG)
    with pytest.raises(ValueError, match="4 blocks"):
        SegmentationModel(tiny_vit(), num_classes=3, indices=(0, 1))


def test_confusion_matrix_counts_and_ignores():
    target = torch.tensor([[0, 0, 1, 255], [2, 2, 1, 0]])
    pred = torch.tensor([[0, 1, 1, 2], [2, 0, 1, 0]])
    confusion = confusion_matrix(pred, target, 3, ignore_index=255)
    expected = torch.zeros(3, 3, dtype=torch.long)
    for t, p in zip(target.flatten().tolist(), pred.flatten().tolist(), strict=True):
        if t != 255:
            expected[t, p] += 1
    assert torch.equal(confusion, expected)
    with pytest.raises(ValueError, match="outside"):
        confusion_matrix(pred, torch.full_like(target, 3), 3)


def test_segmentation_metrics_on_a_hand_made_confusion():
    # rows = truth, columns = prediction; class 2 never occurs and is never predicted
    confusion = torch.tensor([[3, 1, 0], [0, 4, 0], [0, 0, 0]])
    metrics = segmentation_metrics(confusion)
    iou = [3 / (4 + 3 - 3), 4 / (4 + 5 - 4)]  # tp / (row + column - tp)
    acc = [3 / 4, 4 / 4]  # tp / row
    assert metrics["miou"] == pytest.approx(sum(iou) / 2)
    assert metrics["macc"] == pytest.approx(sum(acc) / 2)
    assert metrics["aacc"] == pytest.approx(7 / 8)
    assert math.isnan(metrics["iou"][2]) and math.isnan(metrics["acc"][2])


# ---------------------------------------------------------------- eMAE


def test_patchify_round_trip_and_layout():
    x = torch.rand(2, 2, 8, 12)
    patches = patchify(x, 4)  # (B, 2 * 3 patches, 4 * 4 * 2)
    assert patches.shape == (2, 6, 32)
    assert torch.equal(unpatchify(patches, 4, (2, 3)), x)
    # patch 4 is row 1, column 1: its values are that 4 x 4 window, (row, column, channel) order
    assert torch.equal(patches[:, 4], x[:, :, 4:8, 4:8].permute(0, 2, 3, 1).reshape(2, -1))


@pytest.mark.parametrize("loss_on", ["masked", "all"])
def test_emae_loss(loss_on):
    model = tiny_emae(loss_on).eval()
    x, mask = histograms(), half_mask()
    out = model(x, mask)
    assert out["pred"].shape == (2, N, PATCH * PATCH * 2)
    error = (out["pred"] - patchify(x, PATCH)).pow(2).mean(-1)  # (B, N)
    expected = error[mask].mean() if loss_on == "masked" else error.mean()
    assert torch.allclose(out["loss"], expected, atol=1e-6)
    # perturbing the prediction of visible patches matters only when the loss covers the whole histogram
    perturbed = torch.where(mask.unsqueeze(-1), out["pred"], out["pred"] + 1.0)
    same = torch.allclose(model.forward_loss(x, perturbed, mask), out["loss"])
    assert same == (loss_on == "masked")


def test_emae_rejects_unknown_loss_and_a_relative_position_bias():
    with pytest.raises(ValueError, match="loss_on"):
        tiny_emae("visible")
    with pytest.raises(ValueError, match="abs_pos_emb"):
        EMAEPretrainModel(tiny_vit(), loss_on="all")


@pytest.mark.parametrize("stem", ["patch", "conv", "resnet"])
def test_emae_encoder_sees_only_the_visible_patches(stem):
    """MAE: what lies under masked patches cannot reach the encoder (also through a conv stem); the decoder
    predicts every patch."""
    model = tiny_emae(stem=stem).eval()
    x, mask = histograms(), half_mask()
    pixel_mask = mask.reshape(2, 1, *GRID).repeat_interleave(PATCH, 2).repeat_interleave(PATCH, 3)  # (B, 1, H, W)
    with torch.no_grad():
        latent = model.forward_encoder(x, mask)
        assert latent.shape == (2, 1 + N // 2, DIM)  # cls + the visible half
        assert torch.equal(model.forward_encoder(torch.where(pixel_mask, histograms(seed=1), x), mask), latent)
        assert model.forward_decoder(latent, mask).shape == (2, N, PATCH * PATCH * 2)
    assert not model.backbone.pos_embed.requires_grad  # fixed sine-cosine positions, as MAE


# ---------------------------------------------------------------- tokenizer (dVAE)


def tiny_tokenizer_config(**overrides) -> TokenizerConfig:
    return TokenizerConfig(img_size=IMG, num_tokens=TOKENS, codebook_dim=8, num_layers=3, hidden_dim=16, **overrides)


def test_dvae_shapes_and_ids():
    vae = DiscreteVAE(tiny_tokenizer_config())
    x = histograms()
    out = vae(x, temperature=1.0)
    assert out["recon"].shape == x.shape
    assert out["logits"].shape == (2, TOKENS, 4, 4)
    assert out["kl"] >= 0
    ids = vae.token_ids(x)
    assert ids.shape == (2, 4, 4) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < TOKENS
    assert vae.decode_ids(ids).shape == x.shape
    with pytest.raises(ValueError, match=r"\(B, 2, 32, 32\)"):
        vae.token_ids(torch.rand(2, 2, 30, 30))


def test_dvae_loss_decreases_on_a_fixed_batch():
    vae = DiscreteVAE(tiny_tokenizer_config())
    x = histograms(batch=4)
    optimizer = torch.optim.Adam(vae.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(20):
        loss = vae(x, temperature=1.0, generator=generator)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_dvae_diversity_is_zero_for_even_usage_and_one_for_a_single_entry():
    vae = DiscreteVAE(tiny_tokenizer_config())
    to_logits = vae.encoder[-1]  # the 1x1 conv giving the logits: steer it to fixed posteriors
    torch.nn.init.zeros_(to_logits.weight)
    with torch.no_grad():
        to_logits.bias.copy_(torch.zeros(TOKENS))
    assert vae(histograms(), 1.0)["diversity"].item() == pytest.approx(0.0, abs=1e-6)  # every entry equally
    with torch.no_grad():
        to_logits.bias[3] = 100.0
    assert vae(histograms(), 1.0)["diversity"].item() == pytest.approx(1.0, abs=1e-6)  # entry 3 takes everything


def test_diversity_weight_keeps_the_dvae_from_collapsing_onto_few_entries():
    # Sparse histograms (mostly empty cells, a few events): the paper's loss lets one entry take almost every
    # cell; the diversity term spreads the cells over the codebook at a similar reconstruction error.
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(32, 2, IMG, IMG, generator=generator) < 0.04).float()

    def used_entries(weight: float) -> int:
        torch.manual_seed(0)
        vae = DiscreteVAE(tiny_tokenizer_config(diversity_weight=weight))
        optimizer = torch.optim.Adam(vae.parameters(), lr=3e-3)
        for step in range(40):
            loss = vae(x, temperature=max(1 / 16, 0.9**step), generator=generator)["loss"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return len(vae.token_ids(x).unique())

    assert used_entries(0.5) > 2 * used_entries(0.0)


def test_dvae_sampling_is_reproducible_with_a_generator():
    vae = DiscreteVAE(tiny_tokenizer_config())
    x = histograms()
    a = vae(x, 1.0, generator=torch.Generator().manual_seed(3))["recon"]
    b = vae(x, 1.0, generator=torch.Generator().manual_seed(3))["recon"]
    assert torch.equal(a, b)


def test_straight_through_gumbel_is_one_hot_with_gradients():
    logits = torch.randn(2, 5, 3, 3, requires_grad=True)
    sample = gumbel_softmax(logits, 0.5, hard=True, dim=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample.sum(1), torch.ones(2, 3, 3))
    assert set(sample.detach().unique().tolist()) == {0.0, 1.0}
    (sample * torch.arange(5.0).reshape(1, 5, 1, 1)).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_temperature_schedule_anneals_from_start_to_min():
    config = TokenizerConfig(temperature_min=1 / 16, temperature_anneal_steps=100)
    temps = [config.temperature(step) for step in range(0, 150, 10)]
    assert temps[0] == pytest.approx(1.0)
    assert config.temperature(100) == pytest.approx(1 / 16) and temps[-1] == pytest.approx(1 / 16)
    assert all(a >= b for a, b in itertools.pairwise(temps))
    assert config.grid_size == (14, 14) and config.patch_size == 16
    with pytest.raises(ConfigConflict, match="img_size"):
        TokenizerConfig(img_size=100)
    with pytest.raises(FieldError, match="img_size must be in"):  # a grid of no tokens: found by the model-file fuzzer
        TokenizerConfig(img_size=0)
    with pytest.raises(FieldError, match="num_layers"):  # refused before 2**num_layers, which would never finish
        TokenizerConfig(num_layers=2**31)


def test_codebook_stats():
    one_token = codebook_stats(torch.zeros(4, 3, 3, dtype=torch.long), TOKENS)
    assert one_token == {"usage": 1 / TOKENS, "perplexity": pytest.approx(1.0)}
    every_token = codebook_stats(torch.arange(TOKENS).repeat(3), TOKENS)
    assert every_token["usage"] == 1.0 and every_token["perplexity"] == pytest.approx(TOKENS, rel=1e-4)
    half = codebook_stats(torch.arange(TOKENS // 2), TOKENS)
    assert half["usage"] == 0.5 and half["perplexity"] == pytest.approx(TOKENS / 2, rel=1e-4)
    with pytest.raises(ValueError, match="out of range"):
        codebook_stats(torch.tensor([TOKENS]), TOKENS)


def test_dropout_acts_in_the_blocks_and_head_dropout_before_the_head():
    # the paper's finetuning "dropout" is BEiT's drop_rate: position embedding, attention projection and MLP
    model = MEMViT(tiny_config(), num_classes=3, dropout=0.1, drop_rate=0.2)
    assert model.pos_drop.p == 0.1 and model.head_drop.p == 0.2
    block = model.blocks[0]
    assert block.attn.proj_drop.p == 0.1 and block.mlp.drop2.p == 0.1
    plain = MEMViT(tiny_config(), num_classes=3)
    assert plain.pos_drop.p == plain.blocks[0].attn.proj_drop.p == plain.head_drop.p == 0.0


def test_tokenizer_layer_decay_scales_the_lr_from_the_output_back():
    from mem_core.train.tokenizer import layer_groups

    model = DiscreteVAE(tiny_tokenizer_config())
    groups = layer_groups(model, 0.98)
    assert groups[-1]["lr_scale"] == 1.0 and groups[0]["lr_scale"] == pytest.approx(0.98 ** (len(groups) - 1))
    assert groups[0]["params"][0] is model.encoder[0].weight  # the input layer decays most
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))  # every parameter, once


def test_default_temperature_is_the_papers_exp_minus_1e6_per_step_down_to_one_half():
    config = TokenizerConfig()
    for step in (0, 10_000, 300_000, 690_000):
        assert config.temperature(step) == pytest.approx(max(math.exp(-1e-6 * step), 0.5), rel=1e-5)
    assert config.temperature(2_000_000) == 0.5
