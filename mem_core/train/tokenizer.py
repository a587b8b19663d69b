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
from mem_core.runs.rundir import RunDir
from mem_core.train.common import device_generator
from mem_core.train.configs import TokenizerStageConfig
from mem_core.train.engine import StepResult
from mem_core.train.runtime import Runtime, all_reduce_sum
from mem_core.train.stage import Stage, run_stage
from mem_core.visualize import histogram_rgb, save_png, tile, upscale


class TokenizerStage(Stage):
    """The dVAE learns to reconstruct histograms through a Gumbel-softmax over its codebook (annealed temperature)."""

    name = "tokenizer"

    def build_model(self) -> DiscreteVAE:
        return DiscreteVAE(self.cfg.model)

    def build_optimizer(self, model: DiscreteVAE) -> torch.optim.Optimizer:
        """Adam (the paper's dVAE table), with layer-wise lr decay when ``layer_decay`` is set."""
        cfg = self.cfg
        groups = layer_groups(model, cfg.layer_decay) if cfg.layer_decay else [{"params": list(model.parameters())}]
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)

    def step(self, model: torch.nn.Module, batch, epoch: int, step: int) -> StepResult:
        x, _, g = self.train_inputs(batch[0], epoch, step)
        temperature = self.cfg.model.temperature(epoch * self.steps_per_epoch + step)
        out = model(x, temperature, generator=device_generator(g, self.runtime.device))  # Gumbel noise
        metrics = {k: out[k].detach() for k in ("recon_loss", "kl", "diversity")}
        return StepResult(out["loss"], {**metrics, "temperature": temperature}, x.shape[0])

    def evaluate(self, model: torch.nn.Module, loader) -> dict[str, float]:
        return evaluate_tokenizer(model, loader, self.cfg.input, self.runtime)

    def after_validation(self, model: torch.nn.Module, batch) -> None:
        save_pictures(model, batch[0], self.cfg.input, self.runtime, self.run.path)


def layer_groups(model: DiscreteVAE, decay: float) -> list[dict]:
    """Parameter groups of the dVAE's layers, input to output (encoder, codebook, decoder), the last with the full lr
    and each one before it ``decay`` times the next one's (``lr_scale``, which timm's schedulers apply)."""
    layers = [m for m in (*model.encoder, model.codebook, *model.decoder) if any(True for _ in m.parameters())]
    return [
        {"params": list(layer.parameters()), "lr_scale": decay ** (len(layers) - 1 - i)}
        for i, layer in enumerate(layers)
    ]


def run(cfg: TokenizerStageConfig, out: Path | str, *, resume: bool = False) -> RunDir:
    """Train the tokenizer into the run directory ``out``."""
    return run_stage(TokenizerStage, cfg, out, resume=resume)


@torch.no_grad()
def evaluate_tokenizer(model: DiscreteVAE, loader, spec, runtime: Runtime) -> dict[str, float]:
    """Reconstruction MSE of the hard (argmax) tokens, codebook usage/perplexity over the whole split, and the
    perplexity over the *active* cells only (a patch with at least one event): event histograms are mostly empty,
    and one "empty" entry taking most cells hides whether the others are used."""
    model.eval()
    num_tokens, patch = model.config.num_tokens, model.config.patch_size
    device = runtime.device  # the sums stay on the device until the end
    counts = torch.zeros(num_tokens, dtype=torch.float64, device=device)
    active_counts = torch.zeros(num_tokens, dtype=torch.float64, device=device)
    sq_err = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of squared errors, number of values)
    one = torch.ones((), dtype=torch.float64, device=device)
    for events, _, _ in loader:
        x = batch_preprocess(events, spec, train=False, device=runtime.device)
        with runtime.autocast():
            ids = model.token_ids(x)
            recon = model.decode_ids(ids)
        sq_err[0] += ((recon.float() - x) ** 2).sum()
        sq_err[1] += x.numel()
        # added up on the device: bincount and boolean indexing would each wait for it to read a size back
        counts.index_add_(0, ids.flatten(), one.expand(ids.numel()))
        active = F.avg_pool2d(x[:, : spec.count_channels].float().sum(1, keepdim=True), patch)[:, 0] > 0  # (B, h, w)
        active_counts.index_add_(0, ids.flatten(), active.flatten().to(counts.dtype))
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
def save_pictures(model: DiscreteVAE, events, spec, runtime: Runtime, folder: Path, n: int = 8) -> None:
    """``reconstructions.png`` (top: input, bottom: decoded token ids of the first ``n`` windows of ``events``) and
    ``codebook.png``."""
    model.eval()
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
