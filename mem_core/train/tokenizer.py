"""Stage 1: train the dVAE event tokenizer on histograms (no labels).

Metrics per epoch: reconstruction MSE, KL, codebook usage and perplexity on the validation split. Pictures:
``reconstructions.png`` (input vs reconstruction from token ids) and ``codebook.png`` (the most used entries,
each decoded alone).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from mem_core.models.tokenizer import DiscreteVAE, counts_perplexity
from mem_core.representation import batch_preprocess
from mem_core.train.common import batch_generator, fit_input, open_split, start_run, train_indices, wrap_model
from mem_core.train.configs import TokenizerStageConfig
from mem_core.train.engine import StepResult
from mem_core.train.fit import build_stage_loaders, fit
from mem_core.train.rundir import RunDir
from mem_core.train.runtime import Runtime, all_reduce_sum
from mem_core.visualize import histogram_rgb, save_png, tile, upscale


def run(cfg: TokenizerStageConfig, out: Path | str, *, resume: bool = False) -> RunDir:
    cfg = fit_input(cfg)
    runtime, run_dir = start_run("tokenizer", cfg, out, resume=resume)
    train_src, val_src = open_split(cfg, cfg.data.train_split), open_split(cfg, cfg.data.val_split)
    loader, sampler, val_loader = build_stage_loaders(cfg, runtime, train_src, val_src, train_indices(cfg, train_src))
    torch.manual_seed(cfg.seed)
    model = DiscreteVAE(cfg.model).to(runtime.device)
    train_model = wrap_model(model, cfg, runtime)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(sampler)

    def step_fn(batch, epoch: int, step: int) -> StepResult:
        events, _, _ = batch
        g = batch_generator(cfg, runtime, epoch, step)
        x = batch_preprocess(events, cfg.input, train=True, generator=g, device=runtime.device)
        temperature = cfg.model.temperature(epoch * steps_per_epoch + step)
        out = train_model(x, temperature, generator=g)
        return StepResult(
            out["loss"],
            {
                "recon_loss": out["recon_loss"].item(),
                "kl": out["kl"].item(),
                "diversity": out["diversity"].item(),
                "temperature": temperature,
            },
            x.shape[0],
        )

    def evaluate(epoch: int) -> dict[str, float]:
        metrics = evaluate_tokenizer(model, val_loader, cfg.input, runtime)
        if runtime.is_main:
            save_pictures(model, val_loader, cfg.input, runtime, run_dir.path)
        return metrics

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
        description="tokenizer",
    )
    return run_dir


@torch.no_grad()
def evaluate_tokenizer(model: DiscreteVAE, loader, spec, runtime: Runtime) -> dict[str, float]:
    """Reconstruction MSE of the hard (argmax) tokens, codebook usage/perplexity over the whole split, and the
    perplexity over the *active* cells only (a patch with at least one event): event histograms are mostly empty,
    and one "empty" entry taking most cells hides whether the others are used."""
    model.eval()
    num_tokens, patch = model.config.num_tokens, model.config.patch_size
    counts = torch.zeros(num_tokens, dtype=torch.float64)
    active_counts = torch.zeros(num_tokens, dtype=torch.float64)
    sq_err = torch.zeros(2, dtype=torch.float64)  # (sum of squared errors, number of values)
    for events, _, _ in loader:
        x = batch_preprocess(events, spec, train=False, device=runtime.device)
        with runtime.autocast():
            ids = model.token_ids(x)
            recon = model.decode_ids(ids)
        sq_err += torch.tensor([((recon.float() - x) ** 2).sum().item(), x.numel()], dtype=torch.float64)
        counts += torch.bincount(ids.flatten().cpu(), minlength=num_tokens).double()
        active = F.avg_pool2d(x[:, : spec.count_channels].float().sum(1, keepdim=True), patch)[:, 0] > 0  # (B, h, w)
        active_counts += torch.bincount(ids[active].cpu(), minlength=num_tokens).double()
    counts = all_reduce_sum(counts, runtime).cpu()
    active_counts = all_reduce_sum(active_counts, runtime).cpu()
    sq_err = all_reduce_sum(sq_err, runtime).cpu()
    return {
        "recon_mse": (sq_err[0] / sq_err[1].clamp_min(1)).item(),
        "codebook_usage": (counts > 0).double().mean().item(),
        "perplexity": counts_perplexity(counts),
        "active_perplexity": counts_perplexity(active_counts),
    }


@torch.no_grad()
def save_pictures(model: DiscreteVAE, loader, spec, runtime: Runtime, folder: Path, n: int = 8) -> None:
    """``reconstructions.png`` (top: input, bottom: decoded token ids) and ``codebook.png``."""
    model.eval()
    events, _, _ = next(iter(loader))
    x = batch_preprocess(events, spec, train=False, device=runtime.device)[:n]
    ids = model.token_ids(x)
    recon = model.decode_ids(ids).clamp(0, 1)
    scale = max(1, 128 // x.shape[-1])
    top = [upscale(histogram_rgb(h[:2].cpu().numpy(), level=1.0), scale) for h in x]
    bottom = [upscale(histogram_rgb(h[:2].cpu().numpy(), level=1.0), scale) for h in recon]
    save_png(folder / "reconstructions.png", tile(top + bottom, columns=len(top)))
    usage = torch.bincount(ids.flatten(), minlength=model.config.num_tokens)
    top_ids = usage.argsort(descending=True)[:32]
    patches = model.decode_ids(top_ids.view(-1, 1, 1)).clamp(0, 1)  # (k, C, p, p)
    level = max(patches[:, :2].max().item(), 1e-6)
    codes = [upscale(histogram_rgb(p[:2].cpu().numpy(), level=level), 4) for p in patches]
    save_png(folder / "codebook.png", tile(codes, columns=8))
