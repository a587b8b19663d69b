"""Convolutional classifiers from timm, trained from scratch on MEM's input: the model a user would reach for first,
run as the yardstick of the label-efficiency experiment through the same finetuning stage, evaluation, export and
live path as MEM's ViT (``FinetuneStageConfig.arch``)."""

from __future__ import annotations

from typing import Literal, get_args

import torch

VIT = "vit"  # ``arch`` of MEM's own ViT (its sizes in a config's ``model``)
Arch = Literal["vit", "resnet10t", "resnet18", "resnet34", "resnet50"]  # what a classification stage trains
CNN_ARCHS: tuple[str, ...] = tuple(a for a in get_args(Arch) if a != VIT)


def build_cnn(arch: str, in_chans: int, num_classes: int, drop_path: float = 0.0) -> torch.nn.Module:
    """An untrained timm CNN ``arch`` taking ``(B, in_chans, H, W)`` and giving ``(B, num_classes)`` logits."""
    import timm  # lazy: configs and the export schema import this module for ``Arch`` without building models

    if arch not in CNN_ARCHS:
        raise ValueError(f"unknown CNN {arch!r}; expected one of {', '.join(CNN_ARCHS)}")
    return timm.create_model(
        arch, pretrained=False, in_chans=in_chans, num_classes=num_classes, drop_path_rate=drop_path
    )
