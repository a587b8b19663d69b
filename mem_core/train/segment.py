"""Semantic segmentation: features of the last four blocks -> multi-scale neck -> FPN/UperNet head.

Data: any source with per-sample label images (``dsec-semantic``, ``sim``). Geometric augmentations (flip, shift,
RandAugment) would move the events away from their labels, so this stage turns them off; polarity flip stays.
Metrics: mIoU, mAcc, aAcc on the validation split; the best epoch by mIoU is kept in ``best.pt``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from mem_core.models import MEMViT, SegmentationModel, confusion_matrix
from mem_core.models import segmentation_metrics as metrics_from_confusion
from mem_core.runs.rundir import RunDir, RunError
from mem_core.train.configs import SegmentStageConfig
from mem_core.train.engine import StepResult, eval_batches
from mem_core.train.runtime import Runtime, all_reduce_sum
from mem_core.train.stage import TaskStage, run_stage


class SegmentStage(TaskStage):
    """Per-pixel classes; the best epoch by validation mIoU is kept (``best.pt``) and reported."""

    name = "segment"
    select = "miou"

    @classmethod
    def configure(cls, cfg, init: Path | str | None = None):
        # geometric augmentations would move the events away from their label image
        cfg = dataclasses.replace(cfg, input=dataclasses.replace(cfg.input, hflip_p=0.0, shift_px=0, randaug_ops=0))
        cfg = super().configure(cfg, init)
        if cfg.model.depth < 4:
            raise RunError(f"segmentation taps the last four blocks: model.depth must be >= 4, got {cfg.model.depth}")
        if cfg.input.crop != "sensor":
            raise RunError(
                f'input.crop = "{cfg.input.crop}" resizes each window by its own scale, away from its label image: '
                'segmentation needs input.crop = "sensor"'
            )
        return cfg

    def prepare(self, train_src, val_src, indices) -> None:
        if train_src.mask(0) is None:
            raise RunError(
                f"dataset {self.cfg.data.dataset!r} has no label images: segmentation needs dsec-semantic or sim"
            )
        self.classes = train_src.mask_classes
        self.run.write_json("classes.json", {"classes": self.classes})

    def build_model(self) -> SegmentationModel:
        return SegmentationModel(MEMViT(self.cfg.model), len(self.classes), channels=self.cfg.head_channels)

    def vit(self, model: SegmentationModel) -> MEMViT:
        return model.backbone

    def step(self, model: torch.nn.Module, batch, epoch: int, step: int) -> StepResult:
        events, _, masks = batch
        x, target, _ = self.train_inputs(events, epoch, step, masks)
        logits = model(x)
        loss = F.cross_entropy(logits.float(), target, ignore_index=self.cfg.ignore_index)
        valid = target != self.cfg.ignore_index
        acc = ((logits.argmax(1) == target) & valid).sum() / valid.sum().clamp(min=1)  # no boolean indexing: no sync
        return StepResult(loss, {"pixel_acc": acc}, x.shape[0])

    def evaluate(self, model: torch.nn.Module, loader) -> dict:
        return evaluate_segmenter(model, loader, self.cfg.input, self.runtime, len(self.classes), self.cfg.ignore_index)


def run(cfg: SegmentStageConfig, out: Path | str, *, init: Path | str | None = None, resume: bool = False) -> RunDir:
    """Train a segmenter into the run directory ``out``, from the pretraining run ``init`` or from scratch."""
    return run_stage(SegmentStage, cfg, out, resume=resume, init=init)


@torch.no_grad()
def evaluate_segmenter(model, loader, spec, runtime: Runtime, num_classes: int, ignore_index: int = 255) -> dict:
    """mIoU / mAcc / aAcc (fractions) and per-class IoU over the whole split, all processes."""
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64)
    n = torch.zeros(1, dtype=torch.float64)
    for logits, _, target in eval_batches(model, loader, spec, runtime):
        pred = logits.argmax(1)  # (B, H, W), the label images went through the same resize and crop
        confusion += confusion_matrix(pred.cpu(), target.cpu(), num_classes, ignore_index).double()
        n += pred.shape[0]
    confusion = all_reduce_sum(confusion, runtime).cpu()
    n = all_reduce_sum(n, runtime).cpu()
    return {**metrics_from_confusion(confusion), "n": int(n.item()), "confusion": confusion.long().tolist()}
