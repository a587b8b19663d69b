"""BEiT block-wise masking: rectangles of patches are masked until exactly ``round(ratio * h * w)`` are."""

# Adapted from microsoft/unilm beit/masking_generator.py (MIT): the block sampling rule, rewritten for numba.

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

ATTEMPTS_PER_BLOCK = 10


def as_numpy_generator(generator: torch.Generator | np.random.Generator) -> np.random.Generator:
    """A numpy generator: itself, or one seeded by drawing from a ``torch.Generator`` (which advances it)."""
    if isinstance(generator, np.random.Generator):
        return generator
    if isinstance(generator, torch.Generator):
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device))
        return np.random.default_rng(seed)
    raise TypeError(f"expected a torch.Generator or np.random.Generator, got {type(generator).__name__}")


class BlockMaskGenerator:
    """Samples BEiT block-wise masks over a patch grid.

    Args:
        grid: patch grid (h, w), e.g. (14, 14) for 224 / 16.
        mask_ratio: fraction of patches to mask; exactly ``round(mask_ratio * h * w)`` are masked.
        min_block: smallest block area in patches (default: BEiT's 16 patches of a 14 x 14 grid, scaled to this
            grid; 16 on an 8 x 8 grid would mask a quarter of the image in one block).
        max_block: largest block area (default: the number of patches to mask).
        aspect: range of block aspect ratios (height / width), sampled log-uniformly.
    """

    def __init__(
        self,
        grid: tuple[int, int] = (14, 14),
        mask_ratio: float = 0.5,
        min_block: int | None = None,
        max_block: int | None = None,
        aspect: tuple[float, float] = (0.3, 1 / 0.3),
    ) -> None:
        if not 0.0 <= mask_ratio <= 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1], got {mask_ratio}")
        if len(grid) != 2 or min(grid) < 1:
            raise ValueError(f"grid must be (h, w) with positive sides, got {grid}")
        if not 0 < aspect[0] <= aspect[1]:
            raise ValueError(f"aspect must be (low, high) with 0 < low <= high, got {aspect}")
        self.grid = (int(grid[0]), int(grid[1]))
        self.mask_ratio = mask_ratio
        self.num_masked = round(mask_ratio * self.grid[0] * self.grid[1])
        area = self.grid[0] * self.grid[1]
        if min_block is not None and min_block < 1:
            raise ValueError(f"min_block must be at least 1 patch, got {min_block}")
        self.min_block = max(1, round(16 * area / 196)) if min_block is None else min_block
        self.max_block = self.num_masked if max_block is None else max_block
        self.log_aspect = (math.log(aspect[0]), math.log(aspect[1]))

    def __call__(self, generator: torch.Generator | np.random.Generator) -> torch.Tensor:
        """One mask: bool tensor ``(h, w)``, True = masked, with exactly ``num_masked`` True entries."""
        return self.batch(1, generator).view(self.grid)

    def batch(
        self,
        batch_size: int,
        generator: torch.Generator | np.random.Generator,
        occupied: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``batch_size`` independent masks flattened to ``(B, h * w)`` bool.

        ``occupied`` (``(B, h * w)`` bool, on the CPU): only these patches count. Each mask then holds
        ``round(mask_ratio * occupied)`` of its sample's occupied patches (its blocks may cover empty ones too), drawn
        by the same rule with the free occupied patches in place of the free patches; all occupied is the plain rule.

        One compiled call (``_block_masks``) makes the whole batch on the training process: about 1 ms for 512 masks,
        where a loop over them in Python takes 50-90 ms of every pretraining step.
        """
        rng = as_numpy_generator(generator)
        masks = np.zeros((batch_size, *self.grid), dtype=bool)
        if occupied is None:
            counts = np.full(batch_size, self.num_masked, dtype=np.int64)
            cells = np.ones_like(masks)
        else:
            cells = occupied.numpy().reshape(masks.shape)
            counts = np.round(self.mask_ratio * cells.sum((1, 2))).astype(np.int64)
        _block_masks(rng, masks, cells, counts, self.min_block, self.max_block, *self.log_aspect)
        return torch.from_numpy(masks.reshape(batch_size, -1))


@njit(cache=True, nogil=True)
def _block_masks(rng, masks, cells, counts, min_block, max_block, log_aspect_low, log_aspect_high):
    """Fill each of ``masks`` (B, h, w), one after the other, with blocks until ``counts[b]`` of the patches where
    ``cells`` (B, h, w) is True are masked; when no block fits what is left, with that many random single patches."""
    for b in range(masks.shape[0]):
        mask, cell = masks[b], cells[b]
        count = 0
        while count < counts[b]:
            added = _add_block(
                rng, mask, cell, min(counts[b] - count, max_block), min_block, log_aspect_low, log_aspect_high
            )
            if added == 0:
                break
            count += added
        if count < counts[b]:
            _top_up(rng, mask, cell, counts[b] - count)


@njit(cache=True, nogil=True)
def _add_block(rng, mask, cell, budget, min_block, log_aspect_low, log_aspect_high):
    """Mask one random rectangle adding between 1 and ``budget`` new patches of ``cell``; returns how many it added
    (0: none fit in ``ATTEMPTS_PER_BLOCK`` draws)."""
    height, width = mask.shape
    for _ in range(ATTEMPTS_PER_BLOCK):
        area = rng.uniform(min(min_block, budget), max(min_block, budget))
        aspect = math.exp(rng.uniform(log_aspect_low, log_aspect_high))
        h = round(math.sqrt(area * aspect))
        w = round(math.sqrt(area / aspect))
        if not (1 <= h <= height and 1 <= w <= width):
            continue
        top = rng.integers(0, height - h + 1)
        left = rng.integers(0, width - w + 1)
        added = 0
        for i in range(top, top + h):
            for j in range(left, left + w):
                added += cell[i, j] and not mask[i, j]
        if 0 < added <= budget:
            for i in range(top, top + h):
                for j in range(left, left + w):
                    mask[i, j] = True
            return added
    return 0


@njit(cache=True, nogil=True)
def _top_up(rng, mask, cell, count):
    """Mask ``count`` free patches of ``cell`` drawn uniformly, with the draws of numpy's ``Generator.choice(free,
    count, replace=False)`` (Floyd's algorithm, then a shuffle of the picks), so the generator stays where it was."""
    width = mask.shape[1]
    free = np.flatnonzero(cell & ~mask)
    taken = np.zeros(len(free), dtype=np.bool_)
    for j in range(len(free) - count, len(free)):
        pick = rng.integers(0, j + 1)
        if taken[pick]:
            pick = j
        taken[pick] = True
        mask[free[pick] // width, free[pick] % width] = True
    for i in range(count - 1, 0, -1):  # the shuffle moves picks already made: only its draws matter
        rng.integers(0, i + 1)


class RandomMaskGenerator:
    """MAE's masking: ``round(mask_ratio * h * w)`` patches drawn uniformly at random, the same count per sample."""

    def __init__(self, grid: tuple[int, int] = (14, 14), mask_ratio: float = 0.5) -> None:
        if not 0.0 <= mask_ratio <= 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1], got {mask_ratio}")
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_masked = round(mask_ratio * self.grid[0] * self.grid[1])

    def batch(self, batch_size: int, generator: torch.Generator | np.random.Generator) -> torch.Tensor:
        """``batch_size`` masks ``(B, h * w)`` bool, True = masked."""
        rng = as_numpy_generator(generator)
        n = self.grid[0] * self.grid[1]
        ranks = rng.random((batch_size, n)).argsort(1)  # a random permutation per sample
        return torch.from_numpy(ranks < self.num_masked)
