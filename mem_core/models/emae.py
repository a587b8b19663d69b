"""The eMAE baseline, as the paper's: a masked autoencoder (MAE) that reconstructs the histogram values of patches.

The encoder (a ``MEMViT`` with absolute position embeddings and no relative position bias) sees only the visible
patches; a light decoder (timm ``Block`` s) gets the encoded tokens back in place, a mask token at every masked
patch, and predicts each patch's values. Position embeddings are fixed 2-D sine-cosine tables in both, as in MAE;
finetuning then learns the encoder's from there. The loss is the MSE on the masked patches or on the whole histogram.
"""

from __future__ import annotations

from typing import Literal

import torch
from timm.layers import build_sincos2d_pos_embed, trunc_normal_
from timm.models.vision_transformer import Block
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


def sincos_positions(grid: tuple[int, int], dim: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position table ``(1, 1 + h * w, dim)``, the cls position first (zeros)."""
    table = build_sincos2d_pos_embed(list(grid), dim)  # (h * w, dim)
    return torch.cat([torch.zeros(1, dim), table])[None]


class EMAEPretrainModel(BackboneModel):
    """MAE on event histograms: encode the visible patches, decode every patch's values.

    Args:
        backbone: the encoder, a ``MEMViT`` with ``abs_pos_emb`` and without ``rel_pos_bias`` (attention over a
            subset of the patches has no fixed grid for a relative bias table).
        loss_on: ``"masked"`` = MSE on the masked patches only; ``"all"`` = MSE on the whole histogram.
        decoder_dim, decoder_depth, decoder_heads: the decoder (the paper's: 512 wide, 8 blocks, 16 heads).
    """

    def __init__(
        self,
        backbone: MEMViT,
        loss_on: Literal["masked", "all"] = "masked",
        decoder_dim: int = 512,
        decoder_depth: int = 8,
        decoder_heads: int = 16,
    ) -> None:
        super().__init__()
        if loss_on not in ("masked", "all"):
            raise ValueError(f"loss_on must be 'masked' or 'all', got {loss_on!r}")
        if backbone.pos_embed is None or backbone.rel_pos_bias is not None or backbone.blocks[0].attn.window_size:
            raise ValueError(
                "eMAE encodes the visible patches only, which needs absolute position embeddings and no relative "
                "position bias: model.abs_pos_emb = true, model.rel_pos_bias = false"
            )
        self.backbone = backbone
        self.loss_on = loss_on
        self.patch_size = backbone.patch_embed.patch_size[0]
        backbone.mask_token.requires_grad_(False)  # MAE drops masked patches instead of replacing them
        with torch.no_grad():  # MAE's fixed sine-cosine positions; finetuning learns from there
            backbone.pos_embed.copy_(sincos_positions(backbone.grid_size, backbone.embed_dim))
        backbone.pos_embed.requires_grad_(False)
        self.decoder_embed = nn.Linear(backbone.embed_dim, decoder_dim)
        self.decoder_mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        self.register_buffer("decoder_pos_embed", sincos_positions(backbone.grid_size, decoder_dim), persistent=False)
        self.decoder_blocks = nn.ModuleList(
            [Block(decoder_dim, decoder_heads, qkv_bias=True, norm_layer=nn.LayerNorm) for _ in range(decoder_depth)]
        )
        self.decoder_norm = nn.LayerNorm(decoder_dim)
        self.decoder_pred = nn.Linear(decoder_dim, self.patch_size**2 * backbone.in_chans)
        trunc_normal_(self.decoder_mask_token, std=0.02)

    def forward_encoder(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The visible patches of ``x`` ``(B, C, H, W)`` (``mask`` ``(B, N)``, the same count per sample) encoded:
        ``(B, 1 + V, D)``, cls first, visible patches in row-major order."""
        vit = self.backbone
        vit.check_input(x)
        tokens = vit.patch_tokens(x, mask) + vit.pos_embed[:, 1:]  # (B, N, D); a conv stem sees no masked pixel
        batch, _, dim = tokens.shape
        visible = tokens.gather(1, _visible_index(mask, x.device)[..., None].expand(-1, -1, dim))  # (B, V, D)
        cls = (vit.cls_token + vit.pos_embed[:, :1]).expand(batch, -1, -1)
        h = vit.pos_drop(torch.cat([cls, visible], dim=1))  # (B, 1 + V, D)
        for block in vit.blocks:
            h = block(h)
        return vit.norm(h)

    def forward_decoder(self, latent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Encoded tokens ``(B, 1 + V, D)`` -> values of every patch ``(B, N, p * p * C)``."""
        h = self.decoder_embed(latent)  # (B, 1 + V, Dd)
        batch, num_patches = mask.shape
        visible = _visible_index(mask, h.device)[..., None].expand(-1, -1, h.shape[-1])  # (B, V, Dd)
        full = self.decoder_mask_token.expand(batch, num_patches, -1).to(h.dtype)  # (B, N, Dd)
        full = full.scatter(1, visible, h[:, 1:])  # visible tokens back in place
        h = torch.cat([h[:, :1], full], dim=1) + self.decoder_pos_embed
        for block in self.decoder_blocks:
            h = block(h)
        return self.decoder_pred(self.decoder_norm(h)[:, 1:])

    def forward_loss(self, x: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """MSE between predicted patches ``(B, N, p * p * C)`` and ``x`` ``(B, C, H, W)``; ``mask`` ``(B, N)``."""
        per_patch = (pred.float() - patchify(x, self.patch_size).float()).pow(2).mean(dim=-1)  # (B, N)
        if self.loss_on == "all":
            return per_patch.mean()
        weight = mask.to(per_patch.device, per_patch.dtype, non_blocking=True)
        return (per_patch * weight).sum() / weight.sum().clamp(min=1.0)

    def forward(self, x: torch.Tensor, bool_masked_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """Returns ``loss`` and ``pred`` ``(B, N, p * p * C)`` (``unpatchify`` it to view the reconstruction).

        The mask may stay on the CPU (as pretraining passes it): the visible positions are found there, so a GPU step
        never waits to learn how many patches are visible."""
        mask = bool_masked_pos.reshape(x.shape[0], -1)  # (B, N)
        counts = mask.sum(1)
        if (counts != counts[0]).any():
            raise ValueError("eMAE needs the same number of masked patches in every sample")
        pred = self.forward_decoder(self.forward_encoder(x, mask), mask)
        return {"loss": self.forward_loss(x, pred, mask), "pred": pred}


def _visible_index(mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Positions of the unmasked patches of ``mask`` ``(B, N)`` (the same count per sample), ``(B, V)`` on ``device``,
    computed where the mask lives."""
    visible = (~mask).nonzero()[:, 1].reshape(mask.shape[0], -1)
    if visible.device.type == "cpu" and device.type == "cuda":
        visible = visible.pin_memory()  # copied as it comes, not after the work queued on the GPU
    return visible.to(device, non_blocking=True)
