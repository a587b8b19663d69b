"""The eMAE baseline: the same masked ViT, but a linear head regresses each patch's histogram values."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .vit import BackboneModel, MEMViT


def patchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Histograms ``(B, C, H, W)`` -> patches ``(B, N, p * p * C)`` in row-major patch order, values (p, q, c)."""
    batch, channels, height, width = x.shape
    p = patch_size
    if height % p or width % p:
        raise ValueError(f"image {height} x {width} is not a multiple of patch size {p}")
    h, w = height // p, width // p
    x = x.reshape(batch, channels, h, p, w, p)  # (B, C, h, p, w, q)
    x = x.permute(0, 2, 4, 3, 5, 1)  # (B, h, w, p, q, C)
    return x.reshape(batch, h * w, p * p * channels)  # (B, N, p * q * C)


def unpatchify(patches: torch.Tensor, patch_size: int, grid: tuple[int, int]) -> torch.Tensor:
    """Inverse of ``patchify``: patches ``(B, N, p * p * C)`` on a ``grid`` (h, w) -> ``(B, C, h * p, w * p)``."""
    batch, num_patches, dim = patches.shape
    p = patch_size
    h, w = grid
    if num_patches != h * w or dim % (p * p):
        raise ValueError(f"patches {tuple(patches.shape)} do not fit a {h} x {w} grid of {p} x {p} patches")
    channels = dim // (p * p)
    x = patches.reshape(batch, h, w, p, p, channels)  # (B, h, w, p, q, C)
    x = x.permute(0, 5, 1, 3, 2, 4)  # (B, C, h, p, w, q)
    return x.reshape(batch, channels, h * p, w * p)


class EMAEPretrainModel(BackboneModel):
    """Masked histogram reconstruction with a linear pixel head.

    Args:
        backbone: the ``MEMViT`` (its mask token replaces the masked patches at the input).
        loss_on: ``"masked"`` = MSE on the masked patches only; ``"all"`` = MSE on the whole histogram.
    """

    def __init__(self, backbone: MEMViT, loss_on: Literal["masked", "all"] = "masked") -> None:
        super().__init__()
        if loss_on not in ("masked", "all"):
            raise ValueError(f"loss_on must be 'masked' or 'all', got {loss_on!r}")
        self.backbone = backbone
        self.loss_on = loss_on
        self.patch_size = backbone.patch_embed.patch_size[0]
        self.pixel_head = nn.Linear(backbone.embed_dim, self.patch_size**2 * backbone.in_chans)

    def forward_loss(self, x: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """MSE between predicted patches ``(B, N, p * p * C)`` and ``x`` ``(B, C, H, W)``; ``mask`` ``(B, N)``."""
        per_patch = (pred.float() - patchify(x, self.patch_size).float()).pow(2).mean(dim=-1)  # (B, N)
        if self.loss_on == "all":
            return per_patch.mean()
        weight = mask.to(per_patch.dtype)
        return (per_patch * weight).sum() / weight.sum().clamp(min=1.0)

    def forward(self, x: torch.Tensor, bool_masked_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """Returns ``loss`` and ``pred`` ``(B, N, p * p * C)`` (``unpatchify`` it to view the reconstruction)."""
        mask = bool_masked_pos.reshape(x.shape[0], -1)  # (B, N)
        pred = self.pixel_head(self.backbone.forward_tokens(x, mask))  # (B, N, p * p * C)
        return {"loss": self.forward_loss(x, pred, mask), "pred": pred}
