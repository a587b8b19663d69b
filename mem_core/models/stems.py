"""The ViT's stems besides timm's linear map per patch: each maps a ``(B, C, H, W)`` histogram to the token grid of
``embed_dim`` channels, ``H / p`` x ``W / p`` for patch size ``p``.

Their receptive fields reach past their patch, so ``MEMViT.patch_tokens`` zeroes a masked patch's pixels before the
stem, or its neighbours' tokens would leak them to the pretext task.
"""

from __future__ import annotations

import torch
from timm import create_model
from torch import nn

RESNET_STRIDES = (2, 4, 8, 16, 32)  # ResNet-18's feature strides: after conv1, layer1, layer2, layer3, layer4


class ConvStem(nn.Module):
    """The convolutional stem of Xiao et al. (NeurIPS 2021, "Early convolutions help transformers see better"):
    log2(patch_size) 3 x 3 convolutions of stride 2 (BatchNorm, ReLU), widths doubling up to ``embed_dim``, then a
    1 x 1 projection; ``(B, C, H, W)`` -> ``(B, embed_dim, H / p, W / p)``, the grid of the linear patch stem.

    Its receptive fields overlap the neighbouring patches, so a masked patch's pixels must be hidden from the stem
    (``MEMViT.patch_tokens`` zeroes them) or its neighbours' tokens would leak them to the pretext task.
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int) -> None:
        super().__init__()
        layers = patch_size.bit_length() - 1
        widths = [max(embed_dim >> (layers - i), 8) for i in range(1, layers + 1)]
        blocks: list[nn.Module] = []
        for width in widths:
            blocks += [nn.Conv2d(in_chans, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width)]
            blocks.append(nn.ReLU(inplace=True))
            in_chans = width
        blocks.append(nn.Conv2d(in_chans, embed_dim, 1))
        self.layers = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ResNetStem(nn.Module):
    """A hybrid ViT's stem (Dosovitskiy et al. 2021, section 3.1): ResNet-18 (timm, from scratch) up to the stage
    whose stride is ``patch_size``, then a 1 x 1 projection; ``(B, C, H, W)`` -> ``(B, embed_dim, H / p, W / p)``,
    the linear stem's grid. For p = 8: conv 7 x 7 / 2, max pool, layer1 and layer2, 0.68M parameters.

    Its receptive fields span many patches, so masked pixels must be hidden from it (``MEMViT.patch_tokens``).
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int) -> None:
        super().__init__()
        stage = RESNET_STRIDES.index(patch_size)
        self.body = create_model(
            "resnet18", pretrained=False, features_only=True, out_indices=(stage,), in_chans=in_chans
        )
        self.proj = nn.Conv2d(self.body.feature_info.channels()[-1], embed_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.body(x)[-1])


STEM_CLASSES: dict[str, type[nn.Module]] = {"conv": ConvStem, "resnet": ResNetStem}
STEMS = ("patch", *STEM_CLASSES)  # "patch": timm's own linear map per patch
