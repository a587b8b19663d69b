"""Semantic segmentation on the MEM ViT: four block outputs -> multi-scale pyramid -> UperNet-style head.

The ViT's single-scale features (stride ``p``) become a pyramid at strides p/4, p/2, p, 2p (deconv x4, deconv x2,
identity, max-pool, as BEiT and ViTDet do). The head runs a pyramid pooling module on the coarsest level, fuses
the levels top-down (FPN), concatenates them and classifies every pixel.
"""

# Structure adapted from the UperNet head of open-mmlab/mmsegmentation mmseg/models/decode_heads/uper_head.py
# (Apache-2.0) and BEiT's semantic_segmentation/backbone/beit.py multi-scale necks (microsoft/unilm, MIT).

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .vit import BackboneModel, MEMViT


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def resize(x: torch.Tensor, size: tuple[int, int] | torch.Size) -> torch.Tensor:
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class MultiScaleNeck(nn.Module):
    """Four ``(B, D, h, w)`` maps -> ``(B, D, 4h, 4w)``, ``(B, D, 2h, 2w)``, ``(B, D, h, w)``, ``(B, D, h/2, w/2)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scales = nn.ModuleList(
            [
                nn.Sequential(
                    nn.ConvTranspose2d(dim, dim, 2, stride=2),
                    nn.BatchNorm2d(dim),
                    nn.GELU(),
                    nn.ConvTranspose2d(dim, dim, 2, stride=2),
                ),
                nn.ConvTranspose2d(dim, dim, 2, stride=2),
                nn.Identity(),
                nn.MaxPool2d(2),
            ]
        )

    def forward(self, maps: list[torch.Tensor]) -> list[torch.Tensor]:
        return [scale(m) for scale, m in zip(self.scales, maps, strict=True)]


class UperHead(nn.Module):
    """Pyramid pooling on the coarsest level + top-down FPN fusion -> per-pixel logits at the finest level."""

    def __init__(
        self,
        in_channels: int,
        channels: int,
        num_classes: int,
        num_levels: int = 4,
        pool_scales: tuple[int, ...] = (1, 2, 3, 6),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.ppm = nn.ModuleList(
            [nn.Sequential(nn.AdaptiveAvgPool2d(s), conv_bn_relu(in_channels, channels, 1)) for s in pool_scales]
        )
        self.ppm_bottleneck = conv_bn_relu(in_channels + len(pool_scales) * channels, channels, 3)
        self.lateral = nn.ModuleList([conv_bn_relu(in_channels, channels, 1) for _ in range(num_levels - 1)])
        self.fpn_convs = nn.ModuleList([conv_bn_relu(channels, channels, 3) for _ in range(num_levels - 1)])
        self.fpn_bottleneck = conv_bn_relu(num_levels * channels, channels, 3)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, levels: list[torch.Tensor]) -> torch.Tensor:
        """Levels finest first -> logits ``(B, K, h0, w0)`` at the finest level's resolution."""
        coarsest = levels[-1]
        pooled = [resize(branch(coarsest), coarsest.shape[-2:]) for branch in self.ppm]
        laterals = [conv(x) for conv, x in zip(self.lateral, levels[:-1], strict=True)]
        laterals.append(self.ppm_bottleneck(torch.cat([coarsest, *pooled], dim=1)))
        for i in range(len(laterals) - 1, 0, -1):  # top-down: add each coarser level into the finer one
            laterals[i - 1] = laterals[i - 1] + resize(laterals[i], laterals[i - 1].shape[-2:])
        outs = [conv(x) for conv, x in zip(self.fpn_convs, laterals[:-1], strict=True)] + [laterals[-1]]
        size = outs[0].shape[-2:]
        fused = self.fpn_bottleneck(torch.cat([outs[0], *(resize(x, size) for x in outs[1:])], dim=1))
        return self.classifier(self.dropout(fused))


class SegmentationModel(BackboneModel):
    """MEM ViT + multi-scale neck + UperNet-style head: ``(B, C, H, W)`` -> logits ``(B, num_classes, H, W)``.

    Args:
        backbone: the ``MEMViT``.
        num_classes: number of semantic classes ``K``.
        indices: the four blocks whose outputs feed the pyramid, finest level first (default: the last four, 8-11
            for ViT-B).
        channels: width of the head (512 in UperNet; small values suit CPU runs).
        pool_scales: output sizes of the pyramid pooling module.
        dropout: dropout before the pixel classifier.
    """

    def __init__(
        self,
        backbone: MEMViT,
        num_classes: int,
        indices: tuple[int, ...] | None = None,
        channels: int = 256,
        pool_scales: tuple[int, ...] = (1, 2, 3, 6),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        depth = len(backbone.blocks)
        wanted = tuple(range(depth - 4, depth)) if indices is None else tuple(indices)
        if len(wanted) != 4 or any(not -depth <= i < depth for i in wanted):
            raise ValueError(f"indices must name 4 blocks of a depth-{depth} ViT, got {wanted}")
        self.indices = tuple(i % depth for i in wanted)
        self.backbone = backbone
        last = max(self.indices)
        # parameters the features never touch get no gradient: freeze them (DDP rejects unused parameters)
        unused = (backbone.mask_token, *backbone.norm.parameters(), *backbone.fc_norm.parameters())
        for parameter in (*unused, *backbone.blocks[last + 1 :].parameters()):
            parameter.requires_grad_(False)
        self.num_classes = num_classes
        self.neck = MultiScaleNeck(backbone.embed_dim)
        self.decode_head = UperHead(backbone.embed_dim, channels, num_classes, 4, pool_scales, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the raw outputs of the four blocks as maps (B, D, h, w); the blocks after the last one do not run
        blocks = sorted(set(self.indices))
        maps = self.backbone.forward_intermediates(x, blocks, stop_early=True, intermediates_only=True)
        by_block = dict(zip(blocks, maps, strict=True))
        levels = self.neck([by_block[i] for i in self.indices])
        return resize(self.decode_head(levels), x.shape[-2:])  # (B, K, H, W)


def confusion_matrix(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int = 255
) -> torch.Tensor:
    """``(K, K)`` int64 counts, row = true class, column = predicted class; ``ignore_index`` pixels are skipped.

    Raises:
        ValueError: shapes differ, or a label / prediction lies outside ``[0, K)`` (and is not ignored).
    """
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape")
    valid = target != ignore_index
    t, p = target[valid].long(), pred[valid].long()
    for name, labels in (("target", t), ("prediction", p)):
        if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(
                f"{name} labels span [{int(labels.min())}, {int(labels.max())}], outside [0, {num_classes}) "
                f"(ignore_index={ignore_index})"
            )
    counts = torch.bincount(t * num_classes + p, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)  # (K true, K predicted)


def segmentation_metrics(confusion: torch.Tensor) -> dict[str, Any]:
    """mIoU, mAcc (mean per-class recall) and aAcc (pixel accuracy), as fractions, from a ``(K, K)`` confusion.

    Classes absent from both target and prediction (IoU) or from the target (Acc) are left out of the means;
    ``iou`` and ``acc`` hold the per-class values (NaN for such classes).
    """
    confusion = confusion.float()
    true_positive = confusion.diagonal()
    per_true = confusion.sum(dim=1)
    per_pred = confusion.sum(dim=0)
    union = per_true + per_pred - true_positive
    nan = confusion.new_tensor(float("nan"))
    iou = torch.where(union > 0, true_positive / union.clamp(min=1), nan)
    acc = torch.where(per_true > 0, true_positive / per_true.clamp(min=1), nan)
    return {
        "miou": float(iou.nanmean()),
        "macc": float(acc.nanmean()),
        "aacc": float(true_positive.sum() / confusion.sum().clamp(min=1)),
        "iou": iou.tolist(),
        "acc": acc.tolist(),
    }
