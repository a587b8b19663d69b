"""MEM models: the event tokenizer (dVAE), block masking, the MEM ViT with its pretraining and task heads."""

from .emae import EMAEPretrainModel, patchify, unpatchify
from .masking import BlockMaskGenerator, RandomMaskGenerator
from .segmentation import SegmentationModel, confusion_matrix, segmentation_metrics
from .tokenizer import DiscreteVAE, TokenizerConfig, codebook_stats
from .transfer import LoadReport, load_pretrained_backbone
from .vit import VIT_PRESETS, BackboneModel, MEMPretrainModel, MEMViT, ViTConfig, vit_base, vit_tiny

__all__ = [
    "VIT_PRESETS",
    "BackboneModel",
    "BlockMaskGenerator",
    "DiscreteVAE",
    "EMAEPretrainModel",
    "LoadReport",
    "MEMPretrainModel",
    "MEMViT",
    "RandomMaskGenerator",
    "SegmentationModel",
    "TokenizerConfig",
    "ViTConfig",
    "codebook_stats",
    "confusion_matrix",
    "load_pretrained_backbone",
    "patchify",
    "segmentation_metrics",
    "unpatchify",
    "vit_base",
    "vit_tiny",
]
