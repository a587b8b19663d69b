"""Stage 2: masked event pretraining (MEM), or the eMAE pixel-reconstruction baseline.

MEM: a random block-wise mask hides ``mask_ratio`` of the patches; the ViT predicts the frozen tokenizer's token
id of every masked patch (cross-entropy), the tokenizer computing the targets from the same histogram in the same
step. eMAE: the same ViT regresses the histogram values of the patches (loss on masked patches or the whole
histogram). Validation: masked-token accuracy (MEM) or reconstruction MSE (eMAE) with fixed masks.
Picture: ``predictions.png`` (input, masked input, decoded prediction, decoded tokenizer target).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mem_core.models import (
    BlockMaskGenerator,
    EMAEPretrainModel,
    MEMPretrainModel,
    MEMViT,
    RandomMaskGenerator,
    unpatchify,
)
from mem_core.models.vit import masked_positions, to_device
from mem_core.representation import batch_preprocess
from mem_core.runs.export import load_tokenizer
from mem_core.runs.lineage import TOKENIZER_LINK
from mem_core.runs.rundir import RunDir, RunError
from mem_core.train.configs import PretrainStageConfig
from mem_core.train.engine import MetricMeter, StepResult
from mem_core.train.stage import Stage, run_stage
from mem_core.visualize import histogram_rgb, save_labelled_png, tile, upscale

NEEDS_TOKENIZER = "MEM pretraining needs --tokenizer RUN (a trained tokenizer run directory)"
# MEM_BF16_TARGETS=1: the tokenizer's targets in bf16 with channels-last inputs and weights (PretrainStage.targets)
BF16_TARGETS = os.environ.get("MEM_BF16_TARGETS", "0") == "1"


class PretrainStage(Stage):
    """MEM: predict the frozen tokenizer's ids of masked patches; eMAE (``method = "emae"``): their histogram values."""

    name = "pretrain"

    def __init__(
        self,
        cfg: PretrainStageConfig,
        runtime,
        run: RunDir,
        tokenizer: Path | str | None = None,
        bf16_targets: bool = BF16_TARGETS,
    ) -> None:
        super().__init__(cfg, runtime, run)
        self.tokenizer = None
        self.bf16_targets = bf16_targets
        if cfg.method == "mem":
            if tokenizer is None:
                raise RunError(NEEDS_TOKENIZER)
            self.tokenizer = runtime.place(load_tokenizer(tokenizer, runtime.device))
            if bf16_targets:
                self.tokenizer.to(memory_format=torch.channels_last)
            tok = self.tokenizer.config
            if tok.grid_size != cfg.model.grid_size or tok.in_chans != cfg.model.in_chans:
                raise RunError(
                    f"tokenizer {tokenizer} makes a {tok.grid_size} grid from {tok.in_chans} channels, the ViT has "
                    f"a {cfg.model.grid_size} patch grid and {cfg.model.in_chans} channels: they must match"
                )
            run.write_json(TOKENIZER_LINK, {"path": str(Path(tokenizer).resolve())})
        if cfg.method == "mem":  # BEiT's blocks for MEM, MAE's uniformly random patches for eMAE (as the paper)
            self.masks = BlockMaskGenerator(cfg.model.grid_size, cfg.mask_ratio, min_block=cfg.mask_min_block)
        else:
            self.masks = RandomMaskGenerator(cfg.model.grid_size, cfg.mask_ratio)

    @classmethod
    def configure(cls, cfg: PretrainStageConfig, **inputs) -> PretrainStageConfig:
        cfg = super().configure(cfg)
        if cfg.method == "emae" and (cfg.model.rel_pos_bias or not cfg.model.abs_pos_emb):
            raise RunError(
                "eMAE encodes the visible patches only (MAE), which needs absolute position embeddings and no "
                "relative position bias: set model.abs_pos_emb=true and model.rel_pos_bias=false (in the [vit] table "
                "of a config file, so that finetuning from it builds the same ViT)"
            )
        return cfg

    @property
    def description(self) -> str:
        return "pretrain" if self.cfg.method == "mem" else "emae"

    def build_model(self) -> torch.nn.Module:
        backbone = MEMViT(self.cfg.model)
        if self.tokenizer is not None:
            return MEMPretrainModel(backbone, self.tokenizer.config.num_tokens)
        width, depth, heads = self.cfg.emae_decoder
        return EMAEPretrainModel(
            backbone, self.cfg.emae_loss, decoder_dim=width, decoder_depth=depth, decoder_heads=heads
        )

    def forward(self, model, x: torch.Tensor, mask_rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """The model's outputs (loss, acc) on inputs ``x`` (B, C, H, W) with masks drawn from ``mask_rng``.

        The masks are made on the CPU, and so are MEM's masked positions: no step waits for the GPU to count them,
        and a compiled model gets them as an input instead of searching for them in its graph."""
        mask, predicted = self.draw_masks(x, mask_rng)
        if self.tokenizer is None:  # eMAE finds its visible patches on the CPU
            return model(x, mask.pin_memory() if x.device.type == "cuda" else mask)
        masked = masked_positions(predicted)  # (M,) the patches predicted
        targets = self.targets(x)
        return model(x, to_device(mask, x.device), targets, to_device(masked, x.device))

    def draw_masks(self, x: torch.Tensor, mask_rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The masks of inputs ``x`` (B, C, H, W) drawn from ``mask_rng`` and the masked patches MEM predicts, both
        ``(B, N)`` bool on the CPU: every masked patch, or with ``mask_empty`` false the masked patches with events
        (every masked patch where no window of the batch has a masked patch with events)."""
        occupied = None if self.cfg.mask_empty else patch_occupancy(x, self.masks.grid)
        if occupied is not None:
            mask = self.masks.batch(x.shape[0], mask_rng, occupied)
            predicted = mask & occupied
            if predicted.any():
                return mask, predicted
        mask = self.masks.batch(x.shape[0], mask_rng)  # every patch counts (also where too few have events)
        return mask, mask

    def targets(self, x: torch.Tensor) -> torch.Tensor:
        """The tokenizer's ids of ``x`` (B, N), computed in fp32 inside a bf16 training step too: in bf16 the argmax
        over the codebook's logits picks another token for some patches, so the targets would depend on the
        precision the step runs in. With ``bf16_targets`` (``MEM_BF16_TARGETS=1``) they are computed in bf16 with
        channels-last inputs and weights, cuDNN's fast layout, which changes the token of a few cells
        (tests/test_scale.py measures how many)."""
        device = x.device.type
        with torch.no_grad():
            if self.bf16_targets:
                with torch.autocast(device, dtype=torch.bfloat16):
                    ids = self.tokenizer.token_ids(x.contiguous(memory_format=torch.channels_last))
            else:
                exact = torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device) else None
                with exact or nullcontext():
                    ids = self.tokenizer.token_ids(x.float())
        return ids.reshape(x.shape[0], -1)

    def step(self, model: torch.nn.Module, batch, epoch: int, step: int) -> StepResult:
        x, _, _ = self.train_inputs(batch[0], epoch, step)
        out = self.forward(model, x, np.random.default_rng([self.cfg.seed, epoch, step, self.runtime.rank]))
        return StepResult(out["loss"], {"acc": out["acc"]} if "acc" in out else {}, x.shape[0])

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, loader) -> dict[str, float]:
        model.eval()
        meter = MetricMeter()
        for i, (events, _, _) in enumerate(loader):
            mask_rng = np.random.default_rng([self.cfg.seed, 999_999, i, self.runtime.rank])  # the same every epoch
            x = batch_preprocess(events, self.cfg.input, train=False, device=self.runtime.device)
            with self.runtime.autocast():
                out = self.forward(model, x, mask_rng)
            meter.update({k: out[k] for k in ("loss", "acc") if k in out}, x.shape[0])
        return meter.reduce(self.runtime)

    def after_validation(self, model: torch.nn.Module, batch) -> None:
        save_predictions(self, model, batch[0], self.run.path / "predictions.png")


def patch_occupancy(x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``(B, h * w)`` bool on the CPU: the patches of the grid ``grid`` over ``x`` (B, C, H, W) where any channel is
    nonzero (a window's events). On a GPU the step waits for it: ``mask_empty=false`` pays that."""
    cells = F.adaptive_max_pool2d(x.detach().abs().amax(1, keepdim=True).float(), grid) > 0  # (B, 1, h, w)
    return cells.reshape(x.shape[0], -1).cpu()


def run(cfg: PretrainStageConfig, out: Path | str, *, tokenizer: Path | str | None, resume: bool = False) -> RunDir:
    """Pretrain into the run directory ``out``; MEM needs a ``tokenizer`` run for its targets."""
    if cfg.method == "mem" and tokenizer is None:  # before the run directory exists
        raise RunError(NEEDS_TOKENIZER)
    return run_stage(PretrainStage, cfg, out, resume=resume, tokenizer=tokenizer)


@torch.no_grad()
def save_predictions(stage: PretrainStage, model, events, path: Path, n: int = 6) -> None:
    """Rows: input, masked input, decoded prediction (the patches not predicted keep their target), decoded target;
    the masks drawn as the stage draws them."""
    model.eval()
    cfg, tok = stage.cfg, stage.tokenizer
    x = batch_preprocess(events, cfg.input, train=False, device=stage.runtime.device)[:n]
    grid = cfg.model.grid_size
    p = cfg.model.patch_size
    mask, shown = (m.to(x.device) for m in stage.draw_masks(x, np.random.default_rng(0)))
    pixel_mask = mask.view(-1, 1, *grid).repeat_interleave(p, 2).repeat_interleave(p, 3)  # (B, 1, H, W)
    masked_input = x * ~pixel_mask
    if tok is not None:
        target = tok.token_ids(x).reshape(x.shape[0], -1)  # (B, N)
        logits = model.lm_head(model.backbone.forward_tokens(x, mask))  # (B, N, V)
        predicted = torch.where(shown, logits.argmax(-1), target)
        pred_img = tok.decode_ids(predicted.view(-1, *grid)).clamp(0, 1)
        target_img = tok.decode_ids(target.view(-1, *grid)).clamp(0, 1)
    else:
        out = model(x, mask)
        pred_img = unpatchify(out["pred"], p, grid).clamp(0, 1)
        pred_img = torch.where(pixel_mask, pred_img, x)
        target_img = x
    scale = max(1, 128 // x.shape[-1])
    rows = [x, masked_input, pred_img, target_img]
    tiles = [upscale(histogram_rgb(img[:2].cpu().numpy(), level=1.0), scale) for row in rows for img in row]
    names = ["input", "masked input", "prediction" if tok is None else "predicted tokens", "target"]
    decoded = ", decoded by the tokenizer" if tok is not None else ""
    caption = f"the model sees row 2 and predicts its masked patches (row 3{decoded}); row 4 is what it should predict"
    save_labelled_png(path, tile(tiles, columns=x.shape[0]), names, caption)
