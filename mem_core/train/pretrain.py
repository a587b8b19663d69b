"""Stage 2: masked event pretraining (MEM), or the eMAE pixel-reconstruction baseline.

MEM: a random block-wise mask hides ``mask_ratio`` of the patches; the ViT predicts the frozen tokenizer's token
id of every masked patch (cross-entropy), the tokenizer computing the targets from the same histogram in the same
step. eMAE: the same ViT regresses the histogram values of the patches (loss on masked patches or the whole
histogram). Validation: masked-token accuracy (MEM) or reconstruction MSE (eMAE) with fixed masks.
Picture: ``predictions.png`` (input, masked input, decoded prediction, decoded tokenizer target).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mem_core.configuration import from_dict
from mem_core.export import load_tokenizer
from mem_core.models import BlockMaskGenerator, EMAEPretrainModel, MEMPretrainModel, MEMViT, ViTConfig, unpatchify
from mem_core.representation import batch_preprocess
from mem_core.train.common import batch_generator, fit_input, open_split, start_run, train_indices, wrap_model
from mem_core.train.configs import PretrainStageConfig
from mem_core.train.engine import MetricMeter, StepResult
from mem_core.train.fit import build_stage_loaders, fit
from mem_core.train.rundir import RunDir, RunError
from mem_core.train.runtime import Runtime
from mem_core.visualize import histogram_rgb, save_png, tile, upscale


def build_pretrain_model(cfg: PretrainStageConfig, num_tokens: int) -> torch.nn.Module:
    backbone = MEMViT(cfg.model)
    if cfg.method == "mem":
        return MEMPretrainModel(backbone, num_tokens)
    return EMAEPretrainModel(backbone, loss_on=cfg.emae_loss)


def run(cfg: PretrainStageConfig, out: Path | str, *, tokenizer: Path | str | None, resume: bool = False) -> RunDir:
    cfg = fit_input(cfg)
    runtime, run_dir = start_run("pretrain", cfg, out, resume=resume)
    tok = None
    if cfg.method == "mem":
        if tokenizer is None:
            raise RunError("MEM pretraining needs --tokenizer RUN (a trained tokenizer run directory)")
        tok = load_tokenizer(tokenizer, runtime.device)
        if tok.config.grid_size != cfg.model.grid_size or tok.config.in_chans != cfg.model.in_chans:
            raise RunError(
                f"tokenizer {tokenizer} makes a {tok.config.grid_size} grid from {tok.config.in_chans} channels, "
                f"the ViT has a {cfg.model.grid_size} patch grid and {cfg.model.in_chans} channels: they must match"
            )
        run_dir.write_json("tokenizer.json", {"path": str(Path(tokenizer).resolve())})
    train_src, val_src = open_split(cfg, cfg.data.train_split), open_split(cfg, cfg.data.val_split)
    loader, sampler, val_loader = build_stage_loaders(cfg, runtime, train_src, val_src, train_indices(cfg, train_src))
    torch.manual_seed(cfg.seed)
    model = build_pretrain_model(cfg, tok.config.num_tokens if tok is not None else 0).to(runtime.device)
    train_model = wrap_model(model, cfg, runtime)
    from timm.optim import create_optimizer_v2

    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)
    masks = BlockMaskGenerator(cfg.model.grid_size, cfg.mask_ratio, min_block=cfg.mask_min_block)

    def forward(events, generator: torch.Generator, mask_rng: np.random.Generator, train: bool, net):
        x = batch_preprocess(events, cfg.input, train=train, generator=generator, device=runtime.device)
        mask = masks.batch(x.shape[0], mask_rng).to(runtime.device)
        if tok is None:
            return net(x, mask), x, mask, None
        with torch.no_grad():
            ids = tok.token_ids(x).reshape(x.shape[0], -1)  # (B, N)
        return net(x, mask, ids), x, mask, ids

    def step_fn(batch, epoch: int, step: int) -> StepResult:
        g = batch_generator(cfg, runtime, epoch, step)
        mask_rng = np.random.default_rng([cfg.seed, epoch, step, runtime.rank])
        out, x, _, _ = forward(batch[0], g, mask_rng, True, train_model)
        metrics = {"acc": out["acc"].item()} if "acc" in out else {}
        return StepResult(out["loss"], metrics, x.shape[0])

    @torch.no_grad()
    def evaluate(epoch: int) -> dict[str, float]:
        model.eval()
        meter = MetricMeter()
        for i, (events, _, _) in enumerate(val_loader):
            mask_rng = np.random.default_rng([cfg.seed, 999_999, i, runtime.rank])  # the same masks every epoch
            with runtime.autocast():
                out, x, _, _ = forward(events, None, mask_rng, False, model)
            meter.update({"loss": out["loss"].item(), **({"acc": out["acc"].item()} if "acc" in out else {})}, len(x))
        if runtime.is_main:
            events = next(iter(val_loader))[0]
            save_predictions(model, tok, events, cfg, runtime, run_dir.path / "predictions.png")
        return meter.reduce(runtime)

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
        resume=resume,
        description="pretrain" if cfg.method == "mem" else "emae",
    )
    return run_dir


@torch.no_grad()
def save_predictions(model, tok, events, cfg: PretrainStageConfig, runtime: Runtime, path: Path, n: int = 6) -> None:
    """Rows: input, masked input, decoded prediction (visible patches keep their target), decoded target."""
    model.eval()
    x = batch_preprocess(events, cfg.input, train=False, device=runtime.device)[:n]
    grid = cfg.model.grid_size
    p = cfg.model.patch_size
    mask = (
        BlockMaskGenerator(grid, cfg.mask_ratio, min_block=cfg.mask_min_block)
        .batch(x.shape[0], np.random.default_rng(0))
        .to(x.device)
    )
    pixel_mask = mask.view(-1, 1, *grid).repeat_interleave(p, 2).repeat_interleave(p, 3)  # (B, 1, H, W)
    masked_input = x * ~pixel_mask
    if tok is not None:
        target = tok.token_ids(x).reshape(x.shape[0], -1)  # (B, N)
        logits = model.lm_head(model.backbone.forward_tokens(x, mask))  # (B, N, V)
        predicted = torch.where(mask, logits.argmax(-1), target)
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
    save_png(path, tile(tiles, columns=x.shape[0]))


def load_pretrained_state(run_path: Path | str) -> tuple[dict[str, torch.Tensor], ViTConfig]:
    """The backbone weights and architecture of a pretraining run (for ``finetune --init``)."""
    from mem_core.train.rundir import load_checkpoint

    run_dir = RunDir(run_path)
    info = run_dir.read_config()
    if info.get("stage") != "pretrain":
        raise RunError(f"{run_dir.path} is a {info.get('stage')!r} run, not a pretraining run")
    config = from_dict(ViTConfig, info["config"]["model"])
    return load_checkpoint(run_dir.checkpoint_path)["model"], config
