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

from mem_core.models import MEMViT, SegmentationModel, confusion_matrix, load_pretrained_backbone
from mem_core.models import segmentation_metrics as metrics_from_confusion
from mem_core.representation import batch_preprocess
from mem_core.train.common import batch_generator, fit_input, open_split, start_run, train_indices, wrap_model
from mem_core.train.configs import SegmentStageConfig
from mem_core.train.engine import StepResult
from mem_core.train.finetune import adopt_pretrained_architecture
from mem_core.train.fit import build_stage_loaders, fit
from mem_core.train.rundir import RunDir, RunError, load_checkpoint
from mem_core.train.runtime import Runtime, all_reduce_sum


def label_images(masks: torch.Tensor, size: tuple[int, int], device) -> torch.Tensor:
    """(B, H, W) sensor-resolution labels -> (B, h, w) int64 at the model input size (nearest neighbour)."""
    resized = F.interpolate(masks[:, None].float(), size=size, mode="nearest")  # (B, 1, h, w)
    return resized[:, 0].long().to(device)


def run(cfg: SegmentStageConfig, out: Path | str, *, init: Path | str | None = None, resume: bool = False) -> RunDir:
    cfg = dataclasses.replace(cfg, input=dataclasses.replace(cfg.input, hflip_p=0.0, shift_px=0, randaug_ops=0))
    cfg = fit_input(cfg)
    pretrained = None
    if init is not None:
        cfg, pretrained = adopt_pretrained_architecture(cfg, init)
    if cfg.model.depth < 4:
        raise RunError(f"segmentation taps the last four blocks: model.depth must be >= 4, got {cfg.model.depth}")
    runtime, run_dir = start_run("segment", cfg, out, resume=resume)
    train_src, val_src = open_split(cfg, cfg.data.train_split), open_split(cfg, cfg.data.val_split)
    if train_src.mask(0) is None:
        raise RunError(f"dataset {cfg.data.dataset!r} has no label images: segmentation needs dsec-semantic or sim")
    num_classes = len(train_src.mask_classes)
    run_dir.write_json("classes.json", {"classes": train_src.mask_classes})
    loader, sampler, val_loader = build_stage_loaders(cfg, runtime, train_src, val_src, train_indices(cfg, train_src))
    torch.manual_seed(cfg.seed)
    model = SegmentationModel(MEMViT(cfg.model), num_classes, channels=cfg.head_channels)
    if pretrained is not None:
        load_pretrained_backbone(model.backbone, pretrained)
    model.to(runtime.device)
    train_model = wrap_model(model, cfg, runtime)
    from timm.optim import create_optimizer_v2

    optimizer = create_optimizer_v2(
        model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, layer_decay=cfg.layer_decay, betas=cfg.betas
    )

    def step_fn(batch, epoch: int, step: int) -> StepResult:
        events, _, masks = batch
        g = batch_generator(cfg, runtime, epoch, step)
        x = batch_preprocess(events, cfg.input, train=True, generator=g, device=runtime.device)
        target = label_images(masks, x.shape[-2:], runtime.device)
        logits = train_model(x)
        loss = F.cross_entropy(logits.float(), target, ignore_index=cfg.ignore_index)
        valid = target != cfg.ignore_index
        acc = (logits.argmax(1)[valid] == target[valid]).float().mean().item()
        return StepResult(loss, {"pixel_acc": acc}, x.shape[0])

    def evaluate(epoch: int) -> dict[str, float]:
        result = evaluate_segmenter(model, val_loader, cfg.input, runtime, num_classes, cfg.ignore_index)
        return {k: result[k] for k in ("miou", "macc", "aacc")}

    fit(
        run=run_dir,
        cfg=cfg,
        runtime=runtime,
        model=model,
        train_model=train_model,
        optimizer=optimizer,
        loader=loader,
        sampler=sampler,
        step_fn=step_fn,
        evaluate=evaluate,
        select="miou",
        resume=resume,
        description="segment",
    )
    if runtime.distributed:
        torch.distributed.barrier()  # best.pt is written by the main process; every process evaluates it
    best = SegmentationModel(MEMViT(cfg.model), num_classes, channels=cfg.head_channels)
    best.load_state_dict(load_checkpoint(run_dir.best_path)["model"])
    final = evaluate_segmenter(best.to(runtime.device), val_loader, cfg.input, runtime, num_classes, cfg.ignore_index)
    if runtime.is_main:
        run_dir.write_json("result.json", {"split": cfg.data.val_split, "classes": train_src.mask_classes, **final})
    return run_dir


@torch.no_grad()
def evaluate_segmenter(model, loader, spec, runtime: Runtime, num_classes: int, ignore_index: int = 255) -> dict:
    """mIoU / mAcc / aAcc (fractions) and per-class IoU over the whole split, all processes."""
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64)
    n = torch.zeros(1, dtype=torch.float64)
    for events, _, masks in loader:
        x = batch_preprocess(events, spec, train=False, device=runtime.device)
        with runtime.autocast():
            pred = model(x).argmax(1)
        target = label_images(masks, x.shape[-2:], runtime.device)
        confusion += confusion_matrix(pred.cpu(), target.cpu(), num_classes, ignore_index).double()
        n += x.shape[0]
    confusion = all_reduce_sum(confusion, runtime).cpu()
    n = all_reduce_sum(n, runtime).cpu()
    return {**metrics_from_confusion(confusion), "n": int(n.item()), "confusion": confusion.long().tolist()}
