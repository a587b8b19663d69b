"""The MEM Vision Transformer: timm's BEiT plus a mask token, and its pretraining / classification wrappers.

``MEMViT`` subclasses ``timm.models.beit.Beit`` to reuse relative position bias, layer scale, drop path and its
attention (the kernel chosen per call: ``models.attention``); it adds the learnable mask embedding of masked event
modeling. The wrappers hold the backbone
under the attribute ``backbone`` so every state dict names its weights ``backbone.*`` and transfer between
stages is a prefix match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from timm.layers import DropPath, trunc_normal_
from timm.models import beit, group_parameters, vision_transformer
from timm.models.beit import Beit
from torch import nn
from torch.utils.checkpoint import checkpoint

from mem_core.errors import ConfigError
from mem_core.fields import AT_LEAST_0, FRACTION, Channels, ConfigConflict, Range, Side, Width, check_fields
from mem_core.limits import MAX_DEPTH, MAX_MLP_RATIO
from mem_core.models.attention import choose_kernel_per_call
from mem_core.models.stems import RESNET_STRIDES, STEM_CLASSES, STEMS

BACKBONE_PREFIX = "backbone."


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of the MEM ViT (defaults: the paper's ViT-B/16 on 2-channel 224 x 224 histograms).

    The bounds of its sizes are generous for ViT-B/16 (``mem_core/limits.py``); ``models.sizes.check_model_sizes``
    bounds the patch grid and the parameter count they give together.
    """

    img_size: Side = 224
    patch_size: Side = 16
    in_chans: Channels = 2
    embed_dim: Width = 768
    depth: Annotated[int, Range(1, MAX_DEPTH)] = 12
    num_heads: Width = 12
    mlp_ratio: Annotated[float, Range(0, MAX_MLP_RATIO, lo_open=True)] = 4.0
    drop_path: Annotated[float, FRACTION] = 0.1
    layer_scale_init: Annotated[float, AT_LEAST_0] = 0.1
    rel_pos_bias: bool = True
    abs_pos_emb: bool = False
    # "conv": stride-2 convolutions instead of one linear map per patch; "resnet": ResNet-18's stages (a hybrid ViT)
    stem: Literal["patch", "conv", "resnet"] = "patch"

    def __post_init__(self) -> None:
        check_fields(self)
        if self.stem not in STEMS:
            raise ConfigError(f"unknown stem {self.stem!r}; expected one of {STEMS}")
        if self.stem == "conv" and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ConfigConflict(
                f"the conv stem halves the input per layer: patch_size must be a power of two >= 2, "
                f"got {self.patch_size}"
            )
        if self.stem == "resnet" and self.patch_size not in RESNET_STRIDES:
            raise ConfigConflict(
                f"the resnet stem ends at one of ResNet-18's strides: patch_size must be one of "
                f"{RESNET_STRIDES}, got {self.patch_size}"
            )
        if self.img_size < self.patch_size or self.img_size % self.patch_size:
            raise ConfigConflict(f"img_size {self.img_size} is not a positive multiple of patch_size {self.patch_size}")
        if self.embed_dim % self.num_heads:
            raise ConfigConflict(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if not (self.rel_pos_bias or self.abs_pos_emb):
            raise ConfigConflict("a ViT needs position information: enable rel_pos_bias or abs_pos_emb")

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patch grid (h, w), e.g. 14 x 14 for 224 / 16."""
        side = self.img_size // self.patch_size
        return side, side


def vit_base(**overrides: Any) -> ViTConfig:
    """The paper's ViT-B/16: 12 blocks, 12 heads, width 768."""
    return replace(ViTConfig(), **overrides)


def vit_tiny(**overrides: Any) -> ViTConfig:
    """A CPU-sized ViT (4 blocks, 4 heads, width 192) on the same 14 x 14 grid at 224 / 16."""
    return replace(ViTConfig(embed_dim=192, depth=4, num_heads=4), **overrides)


VIT_PRESETS = {"vit_base": vit_base, "vit_tiny": vit_tiny}


def prefix_group_matcher(matcher: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Re-root a timm ``group_matcher`` dict under a submodule name such as ``"backbone."``.

    Each regex is anchored at ``prefix`` and wrapped in a non-capturing group, so the layer ordinals timm reads
    from capturing groups (``blocks.(\\d+)``) are unchanged.
    """

    def wrap(pattern: str) -> str:
        return "^" + re.escape(prefix) + "(?:" + pattern.removeprefix("^") + ")"

    out: dict[str, Any] = {}
    for name, spec in matcher.items():
        if isinstance(spec, list | tuple):
            out[name] = [(wrap(pattern), suffix) for pattern, suffix in spec]
        else:
            out[name] = wrap(spec)
    return out


class MEMViT(Beit):
    """BEiT-style ViT (timm's ``Beit``) whose patch embeddings can be replaced by a learnable mask token.

    Input ``(B, C, H, W)`` histograms in [0, 1]. The same class serves every stage through timm's own interface:

    - ``MEMViT(config)``: the final LayerNorm on every token, which pretraining's heads read
      (``MEMPretrainModel`` / ``EMAEPretrainModel``); ``forward`` gives the mean of the normalized patch tokens;
    - ``MEMViT(config, num_classes=K)``: a classifier with timm's head, mean of the patch tokens -> ``fc_norm``
      -> dropout -> linear (the paper's finetuning head; the token norm is then an identity, as in BEiT);
    - segmentation reads ``forward_intermediates`` of four blocks (``SegmentationModel``).
    """

    def __init__(
        self,
        config: ViTConfig,
        num_classes: int = 0,
        *,
        dropout: float = 0.0,
        drop_rate: float = 0.0,
        head_init_scale: float = 0.001,
    ) -> None:
        """``dropout``: BEiT's ``drop_rate``, after the position embedding and in every block (attention projection,
        MLP); ``drop_rate``: before the classifier head only (timm's name)."""
        super().__init__(
            img_size=config.img_size,
            patch_size=config.patch_size,
            in_chans=config.in_chans,
            num_classes=num_classes,
            global_pool="avg",
            embed_dim=config.embed_dim,
            depth=config.depth,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
            drop_rate=drop_rate,
            pos_drop_rate=dropout,
            proj_drop_rate=dropout,
            drop_path_rate=config.drop_path,
            init_values=config.layer_scale_init,
            use_abs_pos_emb=config.abs_pos_emb,
            use_rel_pos_bias=config.rel_pos_bias,
            use_fc_norm=num_classes > 0,  # a classifier normalizes after pooling, a backbone every token
            head_init_scale=head_init_scale,
        )
        self.config = config
        if config.stem != "patch":  # timm's PatchEmbed keeps its size checks and flattening around the new stem
            self.patch_embed.proj = STEM_CLASSES[config.stem](config.in_chans, config.embed_dim, config.patch_size)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, config.embed_dim))
        trunc_normal_(self.mask_token, std=0.02)
        if num_classes > 0:
            self.mask_token.requires_grad_(False)  # a classifier never masks (and DDP rejects unused parameters)
        self.frozen: list[nn.Module] = []  # the modules ``freeze_features`` or ``freeze_layers`` keep in eval mode
        for block in self.blocks:
            choose_kernel_per_call(block.attn)

    @property
    def grid_size(self) -> tuple[int, int]:
        return tuple(self.patch_embed.grid_size)

    @property
    def num_patches(self) -> int:
        return self.patch_embed.num_patches

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm layer groups: stem (embeddings, mask token), one group per block, then the final norm."""
        return dict(
            stem=r"^cls_token|mask_token|pos_embed|patch_embed|rel_pos_bias",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"mask_token"}

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``x`` is ``(B, C, H, W)`` of this ViT's channels and input size."""
        expected = (self.in_chans, *self.patch_embed.img_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"MEMViT expects input (B, {', '.join(map(str, expected))}), got {tuple(x.shape)}")

    def embed(self, x: torch.Tensor, bool_masked_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Patch-embed ``x``, swap masked patches for the mask token, prepend cls: ``(B, 1 + N, D)``.

        Args:
            x: ``(B, C, H, W)`` histograms.
            bool_masked_pos: ``(B, N)`` or ``(B, h, w)`` bool, True where the patch is masked.
        """
        self.check_input(x)
        mask = None if bool_masked_pos is None else self._patch_mask(x, bool_masked_pos)
        x = self.patch_tokens(x, mask)  # (B, N, D)
        batch = x.shape[0]
        if mask is not None:
            x = torch.where(mask.unsqueeze(-1), self.mask_token.to(x.dtype), x)
        x = torch.cat((self.cls_token.expand(batch, -1, -1).to(x.dtype), x), dim=1)  # (B, 1 + N, D)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.pos_drop(x)

    def _patch_mask(self, x: torch.Tensor, bool_masked_pos: torch.Tensor) -> torch.Tensor:
        """``bool_masked_pos`` as ``(B, N)``, checked against the batch and the patch grid."""
        mask = bool_masked_pos.reshape(bool_masked_pos.shape[0], -1)
        if tuple(mask.shape) != (x.shape[0], self.num_patches) or mask.dtype != torch.bool:
            raise ValueError(
                f"bool_masked_pos must be a bool tensor of {x.shape[0]} x {self.num_patches} patches, "
                f"got {mask.dtype} {tuple(bool_masked_pos.shape)}"
            )
        return mask

    def patch_tokens(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The stem: ``(B, C, H, W)`` -> patch embeddings ``(B, N, D)``. A convolutional stem first zeroes the pixels
        of the patches that ``mask`` ``(B, N)`` marks, so no other patch's embedding carries them."""
        if mask is not None and self.config.stem != "patch":
            h, w = self.grid_size
            p = self.config.patch_size
            hidden = mask.reshape(-1, 1, h, 1, w, 1).expand(-1, -1, -1, p, -1, p).reshape(-1, 1, h * p, w * p)
            x = x.masked_fill(hidden, 0.0)
        return self.patch_embed(x)

    def forward_features(self, x: torch.Tensor, bool_masked_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens ``(B, 1 + N, D)`` (cls first) after the final norm, masked patches replaced by the mask token.

        timm's ``Beit.forward_features`` with the masking step added to the embedding.
        """
        x = self.embed(x, bool_masked_pos)
        rel_pos_bias = self.rel_pos_bias() if self.rel_pos_bias is not None else None
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(blk, x, shared_rel_pos_bias=rel_pos_bias, use_reentrant=False)
            else:
                x = blk(x, shared_rel_pos_bias=rel_pos_bias)
        return self.norm(x)

    def forward_tokens(self, x: torch.Tensor, bool_masked_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Normalized patch tokens without cls: ``(B, N, D)``."""
        return self.forward_features(x, bool_masked_pos)[:, self.num_prefix_tokens :]

    def freeze_features(self) -> None:
        """Linear probing: only ``fc_norm`` and ``head`` stay trainable, and everything before them stays in eval
        mode (no drop path or dropout noise in frozen features)."""
        for name, parameter in self.named_parameters():
            parameter.requires_grad_(name.startswith(("fc_norm.", "head.")))
        self.frozen = [m for m in self.children() if m not in (self.fc_norm, self.head_drop, self.head)]
        self.train(self.training)

    def freeze_layers(self, layers: int) -> None:
        """Keep the bottom ``layers`` of layer decay's groups (timm's, of ``group_matcher``) as they are: 1 the stem
        (with the embeddings and the shared position bias), 1 + k the stem and the first k blocks. They stay in eval
        mode, so a convolutional stem's batch norm keeps its statistics and the frozen blocks draw no drop path."""
        if not 0 <= layers <= len(self.blocks):
            raise ValueError(f"frozen layers must be 0 (none) to {len(self.blocks)} (the stem and all but one block)")
        groups = group_parameters(self, self.group_matcher())
        frozen = {name for layer, names in groups.items() if layer < layers for name in names}
        for name, parameter in self.named_parameters():
            if name in frozen:
                parameter.requires_grad_(False)
        self.frozen = [self.patch_embed, self.pos_drop, *self.blocks[: layers - 1]] if layers else []
        self.train(self.training)

    def train(self, mode: bool = True) -> MEMViT:
        super().train(mode)
        for module in self.frozen:  # what freeze_features or freeze_layers keeps as it is
            module.eval()
        return self


class BackboneModel(nn.Module):
    """Base of the models that wrap a ViT (pretraining, segmentation): holds ``self.backbone`` (a ``MEMViT``) and
    exposes timm's optimizer interface.

    ``group_matcher`` puts the backbone's stem and blocks in their layer groups and every head parameter in the
    top group, so ``timm.optim.create_optimizer_v2(model, ..., layer_decay=...)`` decays the backbone only.
    """

    backbone: MEMViT

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return prefix_group_matcher(self.backbone.group_matcher(coarse), BACKBONE_PREFIX)

    def no_weight_decay(self) -> set[str]:
        return {BACKBONE_PREFIX + name for name in self.backbone.no_weight_decay()}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.backbone.set_grad_checkpointing(enable)


class MEMPretrainModel(BackboneModel):
    """Masked event modeling: predict the tokenizer's id of every masked patch (BEiT's masked image modeling)."""

    def __init__(self, backbone: MEMViT, num_tokens: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.num_tokens = num_tokens
        self.lm_head = nn.Linear(backbone.embed_dim, num_tokens)
        trunc_normal_(self.lm_head.weight, std=0.02)
        nn.init.zeros_(self.lm_head.bias)

    def forward(
        self,
        x: torch.Tensor,
        bool_masked_pos: torch.Tensor,
        target_ids: torch.Tensor,
        masked: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Cross-entropy over the masked patches only.

        Args:
            x: ``(B, C, H, W)`` histograms.
            bool_masked_pos: ``(B, N)`` or ``(B, h, w)`` bool, True = masked.
            target_ids: ``(B, N)`` or ``(B, h, w)`` token ids from ``DiscreteVAE.token_ids``.
            masked: ``(M,)`` the masked patches' positions, ``masked_positions(bool_masked_pos)``, on ``x``'s device
                with the mask (what pretraining passes). Without them they are found here, where the mask is: on the
                CPU a GPU step does not wait for them, but ``torch.compile`` cannot trace a search whose result's size
                depends on the data, so a compiled model breaks its graph there.

        Returns:
            ``loss`` (scalar), ``acc`` (fraction of masked patches predicted right), ``logits`` ``(M, num_tokens)``
            for the ``M`` masked patches in row-major (batch, patch) order.
        """
        batch = x.shape[0]
        mask = bool_masked_pos.reshape(batch, -1)  # (B, N)
        targets = target_ids.reshape(batch, -1)  # (B, N)
        if targets.shape != mask.shape:
            raise ValueError(f"target_ids {tuple(target_ids.shape)} do not match the mask {tuple(mask.shape)}")
        if masked is None:
            masked = to_device(masked_positions(mask), x.device)
            mask = to_device(mask, x.device)
        tokens = self.backbone.forward_tokens(x, mask)  # (B, N, D)
        logits = self.lm_head(tokens.flatten(0, 1)[masked])  # (M, num_tokens): the head only runs on masked patches
        target = targets.flatten().to(x.device)[masked]  # (M,)
        loss = F.cross_entropy(logits.float(), target)
        acc = (logits.argmax(-1) == target).float().mean()
        return {"loss": loss, "acc": acc, "logits": logits}


def masked_positions(bool_masked_pos: torch.Tensor) -> torch.Tensor:
    """``(M,)`` flat (sample, patch) positions of the masked patches of a ``(B, N)`` or ``(B, h, w)`` mask, in row-major
    order, found where the mask is: pretraining finds them on the CPU, where its masks are made."""
    return bool_masked_pos.reshape(bool_masked_pos.shape[0], -1).flatten().nonzero()[:, 0]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t``, a tensor on the host, on ``device`` without waiting for the work queued there: a GPU copies it from
    page-locked memory as it comes (from pageable memory, a copy first waits until the GPU has caught up)."""
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


TRANSFORMER_BLOCKS = (beit.Block, vision_transformer.Block)  # the MEM ViT's blocks, the eMAE decoder's


def compile_blocks(model: nn.Module, **options: Any) -> int:
    """Compile every transformer block of ``model`` on its own, in place (``Module.compile``, ``options`` for
    ``torch.compile``); returns how many. The parameters, the state dict's names and the model object stay what
    they were, so checkpoints, EMA and exports see the same model.

    A block is where the element-wise half of a ViT step sits (layer scale, casts, drop path, GELU, residuals) and
    what inductor fuses; the code around the blocks (masking, heads, losses) runs as it is, so no host work there can
    break a graph. The blocks' drop path rates differ (0 to ``drop_path`` over the depth), and dynamo compiles a float
    attribute as a constant: each block would be a program of its own, past dynamo's recompilation limit for ViT-B's
    12. Their drop paths become ``TensorDropPath``, the rate a tensor, so all the blocks share one program.
    """
    blocks = [m for m in model.modules() if isinstance(m, TRANSFORMER_BLOCKS)]
    for block in blocks:
        for name in ("drop_path1", "drop_path2"):
            path = getattr(block, name)
            if isinstance(path, nn.Identity) or (isinstance(path, DropPath) and path.scale_by_keep):
                setattr(block, name, TensorDropPath(path.drop_prob if isinstance(path, DropPath) else 0.0))
        block.compile(**options)
    return len(blocks)


class TensorDropPath(nn.Module):
    """Stochastic depth as timm's ``DropPath`` (a sample's residual branch dropped with probability ``rate``, the
    kept ones scaled by 1 / (1 - rate)), the rate held in buffers: blocks of different rates are one compiled
    program. A rate of 0 draws and keeps every sample (what timm's ``Identity`` there computes)."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate
        self.register_buffer("keep", torch.tensor(1.0 - rate), persistent=False)
        self.register_buffer("scale", torch.tensor(1.0 / (1.0 - rate) if rate < 1 else 0.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        kept = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(self.keep)  # (B, 1, ...), p in fp32
        return x * (kept * self.scale.to(x.dtype))

    def extra_repr(self) -> str:
        return f"rate={self.rate:.3f}"
