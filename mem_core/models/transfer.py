"""Starting a task model from a pretraining run: its ViT's weights loaded into a classifier's or a segmenter's
backbone, position tables resized to another patch grid."""

from __future__ import annotations

from typing import NamedTuple

import torch
from timm.layers import resample_abs_pos_embed, resize_rel_pos_bias_table

from mem_core.models.vit import BACKBONE_PREFIX, MEMViT


class LoadReport(NamedTuple):
    """What ``load_pretrained_backbone`` did: keys the backbone lacked, keys it did not know, keys it dropped."""

    missing: list[str]
    unexpected: list[str]
    dropped: list[str]


def load_pretrained_backbone(vit: MEMViT, state_dict: dict[str, torch.Tensor]) -> LoadReport:
    """Load pretrained weights into the ViT of a task model (a classifier itself, or a segmenter's ``backbone``).

    Accepts the state dict of a pretraining model (keys ``backbone.*``; its heads such as ``lm_head`` are dropped)
    or of a bare ``MEMViT``. The final token norm is dropped when the ViT normalizes after pooling instead
    (``fc_norm``, as BEiT finetunes). A ViT on another patch grid (a backbone pretrained at 224 x 224 segmenting at
    512 x 512) gets the position tables resized: relative position bias with BEiT's geometric-progression
    interpolation, absolute position embeddings bicubically (timm's functions). Every other tensor must match in
    shape. ``missing`` lists the ViT's weights the state dict lacks, apart from the fresh head and ``fc_norm``.

    Raises:
        ValueError: a tensor's shape differs from the ViT's (named in the message).
    """
    if any(key.startswith(BACKBONE_PREFIX) for key in state_dict):
        dropped = [key for key in state_dict if not key.startswith(BACKBONE_PREFIX)]
        weights = {key.removeprefix(BACKBONE_PREFIX): v for key, v in state_dict.items() if key not in dropped}
    else:
        dropped, weights = [], dict(state_dict)
    own = vit.state_dict()
    unused = [key for key in weights if key not in own and key.startswith("norm.")]
    dropped += unused
    weights = {key: _fit_positions(key, value, own, vit) for key, value in weights.items() if key not in unused}
    wrong = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in weights.items()
        if k in own and own[k].shape != v.shape
    ]
    if wrong:
        raise ValueError(
            "pretrained backbone does not fit (different architecture or patch grid?): " + "; ".join(wrong)
        )
    result = vit.load_state_dict(weights, strict=False)
    fresh = ("fc_norm.", "head.")
    missing = [key for key in result.missing_keys if not key.startswith(fresh)]
    return LoadReport(missing=missing, unexpected=list(result.unexpected_keys), dropped=dropped)


def _fit_positions(key: str, value: torch.Tensor, own: dict[str, torch.Tensor], vit: MEMViT) -> torch.Tensor:
    """A pretrained position table resized to ``vit``'s patch grid when the grids differ; other tensors unchanged."""
    if key not in own or own[key].shape == value.shape:
        return value
    if key.endswith("relative_position_bias_table"):
        return resize_rel_pos_bias_table(value, new_window_size=vit.grid_size, new_bias_shape=tuple(own[key].shape))
    if key == "pos_embed":
        return resample_abs_pos_embed(value, new_size=list(vit.grid_size), num_prefix_tokens=vit.num_prefix_tokens)
    return value
