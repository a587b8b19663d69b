"""The event tokenizer: a discrete VAE that turns a histogram into a grid of visual token ids.

A conv encoder gives logits over ``num_tokens`` codebook entries per grid cell; a Gumbel-softmax relaxation
(annealed temperature) mixes the codebook vectors; a conv-transpose decoder reconstructs the histogram.
Training loss: MSE reconstruction + ``kl_weight`` * KL(q || uniform prior) + ``diversity_weight`` * diversity.

The diversity term (wav2vec 2.0's codebook diversity loss) is 1 - entropy / log(num_tokens) of the encoder's
softmax averaged over the batch and the grid: 0 when every entry is used equally often, 1 when one entry takes
everything. Without it the dVAE collapses on event histograms: sparse inputs are mostly empty cells, one entry
learns "empty" and a handful more cover the rest (N-Cars, 512 entries: 2 % used, perplexity 4). The per-cell KL
of the paper cannot prevent this: it only asks each cell's posterior to be flat, not the cells to differ.
"""

# Adapted from the discrete VAE of lucidrains/DALLE-pytorch dalle_pytorch/dalle_pytorch.py (MIT), as used by MEM.

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from mem_core.fields import POSITIVE, Channels, ConfigConflict, Range, Side, Width, check_fields
from mem_core.limits import MAX_DEPTH, MAX_NUM_TOKENS

MAX_LAYERS = 12  # 2**12 = 4096 px per token side: far past any sensor


@dataclass(frozen=True)
class TokenizerConfig:
    """dVAE architecture and relaxation schedule.

    Defaults: the paper's (its released ``eventvae``): 4 stride-2 layers of width 384 (224 -> a 14 x 14 grid), 3
    residual blocks, an 8192 x 32 codebook, soft Gumbel-softmax whose temperature falls from 1 as
    ``exp(-1e-6 * step)`` to at most 0.5 (``temperature_anneal_steps`` = ln 2 / 1e-6), the KL weight 1e-10. One
    deliberate difference: the codebook diversity term (``diversity_weight``, see the module doc); 0 is the paper's.
    """

    in_chans: Channels = 2
    img_size: Side = 224
    num_tokens: Annotated[int, Range(2, MAX_NUM_TOKENS)] = 8192  # the diversity term divides by log(num_tokens)
    codebook_dim: Width = 32
    num_layers: Annotated[int, Range(1, MAX_LAYERS)] = 4  # each halves the resolution: patch size 2**num_layers
    hidden_dim: Width = 384
    num_resnet_blocks: Annotated[int, Range(0, MAX_DEPTH)] = 3
    temperature_start: float = 1.0
    temperature_min: Annotated[float, POSITIVE] = 0.5
    temperature_anneal_steps: int = 693_147  # ln 2 / 1e-6: the paper's exp(-1e-6 * step) reaches 0.5 here
    kl_weight: float = 1e-10
    diversity_weight: float = 0.1  # 0 = the paper's loss (collapses on sparse histograms, see the module doc)
    straight_through: bool = False

    def __post_init__(self) -> None:
        check_fields(self)  # num_layers first: 2**num_layers of a huge value would never finish
        if self.img_size < self.patch_size or self.img_size % self.patch_size:
            raise ConfigConflict(
                f"img_size {self.img_size} must be a positive multiple of 2**num_layers = {self.patch_size} "
                f"(num_layers={self.num_layers})"
            )
        if not self.temperature_min <= self.temperature_start:  # a NaN start too
            raise ConfigConflict(
                f"need temperature_min ({self.temperature_min}) <= temperature_start ({self.temperature_start})"
            )

    @property
    def patch_size(self) -> int:
        """Pixels per token side (the encoder's downsampling)."""
        return 2**self.num_layers

    @property
    def grid_size(self) -> tuple[int, int]:
        side = self.img_size // self.patch_size
        return side, side

    def temperature(self, step: int) -> float:
        """Gumbel-softmax temperature at ``step``: exponential decay from start to min over the anneal steps."""
        progress = min(max(step, 0) / max(self.temperature_anneal_steps, 1), 1.0)
        return self.temperature_start * (self.temperature_min / self.temperature_start) ** progress


class ResBlock(nn.Module):
    """Residual 3x3 -> 3x3 -> 1x1 conv block at constant width."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


def gumbel_softmax(
    logits: torch.Tensor, temperature: float, hard: bool, dim: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Gumbel-softmax sample along ``dim`` (straight-through one-hot when ``hard``), with an optional generator."""
    gumbels = -torch.empty_like(logits).exponential_(generator=generator).log()  # Gumbel(0, 1) noise
    soft = ((logits + gumbels) / temperature).softmax(dim)
    if not hard:
        return soft
    one_hot = torch.zeros_like(soft).scatter_(dim, soft.argmax(dim, keepdim=True), 1.0)
    return one_hot - soft.detach() + soft


class DiscreteVAE(nn.Module):
    """Histogram ``(B, C, H, W)`` <-> token ids ``(B, H / p, W / p)`` with ``p = 2**num_layers``."""

    def __init__(self, config: TokenizerConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_dim
        encoder: list[nn.Module] = []
        for i in range(config.num_layers):
            encoder += [nn.Conv2d(config.in_chans if i == 0 else hidden, hidden, 4, stride=2, padding=1), nn.ReLU()]
        encoder += [ResBlock(hidden) for _ in range(config.num_resnet_blocks)]
        encoder.append(nn.Conv2d(hidden, config.num_tokens, 1))
        self.encoder = nn.Sequential(*encoder)

        self.codebook = nn.Embedding(config.num_tokens, config.codebook_dim)

        decoder: list[nn.Module] = [nn.Conv2d(config.codebook_dim, hidden, 1)]
        decoder += [ResBlock(hidden) for _ in range(config.num_resnet_blocks)]
        for _ in range(config.num_layers):
            decoder += [nn.ConvTranspose2d(hidden, hidden, 4, stride=2, padding=1), nn.ReLU()]
        decoder.append(nn.Conv2d(hidden, config.in_chans, 1))
        self.decoder = nn.Sequential(*decoder)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``x`` is ``(B, C, H, W)`` of this dVAE's channels and input size."""
        c = self.config
        expected = (c.in_chans, c.img_size, c.img_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"DiscreteVAE expects input (B, {', '.join(map(str, expected))}), got {tuple(x.shape)}")

    def forward(
        self, x: torch.Tensor, temperature: float, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Relaxed encode -> decode of ``x`` ``(B, C, H, W)``.

        Returns ``loss`` (to minimize), ``recon_loss`` (MSE), ``kl`` (to the uniform prior, per grid cell),
        ``diversity`` (in [0, 1], see the module doc), ``recon`` ``(B, C, H, W)`` and ``logits``
        ``(B, num_tokens, h, w)``.
        """
        self.check_input(x)
        logits = self.encoder(x)  # (B, V, h, w)
        soft_one_hot = gumbel_softmax(logits, temperature, self.config.straight_through, dim=1, generator=generator)
        z = torch.einsum("bvhw,vd->bdhw", soft_one_hot, self.codebook.weight.to(soft_one_hot.dtype))  # (B, d, h, w)
        recon = self.decoder(z)
        recon_loss = F.mse_loss(recon.float(), x.float())
        log_q = F.log_softmax(logits.float(), dim=1)  # (B, V, h, w)
        q = log_q.exp()
        kl = (q * (log_q + math.log(self.config.num_tokens))).sum(1).mean()
        mean_q = q.mean((0, 2, 3))  # (V,): how often each entry is chosen, softly, over the batch and grid
        diversity = 1 + (mean_q * mean_q.clamp_min(1e-12).log()).sum() / math.log(self.config.num_tokens)
        loss = recon_loss + self.config.kl_weight * kl + self.config.diversity_weight * diversity
        return {
            "loss": loss,
            "recon_loss": recon_loss,
            "kl": kl,
            "diversity": diversity,
            "recon": recon,
            "logits": logits,
        }

    @torch.no_grad()
    def token_ids(self, x: torch.Tensor) -> torch.Tensor:
        """The most likely token of every grid cell: ``(B, h, w)`` int64."""
        self.check_input(x)
        return self.encoder(x).argmax(dim=1)

    @torch.no_grad()
    def decode_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Reconstruct histograms ``(B, C, H, W)`` from token ids ``(B, h, w)``."""
        if ids.ndim != 3:
            raise ValueError(f"token ids must be (B, h, w), got shape {tuple(ids.shape)}")
        z = self.codebook(ids).permute(0, 3, 1, 2)  # (B, h, w, d) -> (B, d, h, w)
        return self.decoder(z)


def codebook_stats(ids: torch.Tensor, num_tokens: int) -> dict[str, float]:
    """How well token ids use the codebook.

    Returns ``usage`` (fraction of the ``num_tokens`` entries that occur) and ``perplexity`` (exp of the entropy
    of the empirical token distribution: 1 = one token only, ``num_tokens`` = all equally often).
    """
    counts = torch.bincount(ids.flatten().long(), minlength=num_tokens)
    if counts.numel() > num_tokens:
        raise ValueError(f"token id {int(ids.max())} is out of range for a codebook of {num_tokens}")
    return {"usage": float((counts > 0).sum()) / num_tokens, "perplexity": counts_perplexity(counts)}


def counts_perplexity(counts: torch.Tensor) -> float:
    """exp(entropy) of the distribution given by per-entry ``counts`` (1 for an empty or one-entry one)."""
    probs = counts.double() / counts.sum().double().clamp_min(1)
    probs = probs[probs > 0]
    return float((-(probs * probs.log()).sum()).exp())
