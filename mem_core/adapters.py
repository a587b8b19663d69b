"""The places MEM relies on a library's internals, each behind one function that checks, where it is used, that
the library still works the way MEM relies on, and says why MEM reaches in. A library upgrade that changes one of
them is then an error naming the library and version at first use, not a silent change of behaviour."""

from __future__ import annotations

import timm
import torch
from torch.utils.data import DataLoader

from mem_core.errors import MemError


def set_fused_attention(attn: torch.nn.Module, fused: bool) -> None:
    """Make timm's ``Attention`` use SDPA (``fused``) or its plain softmax(q k^T + bias) v product from its next
    forward on. timm chooses once, at construction (``use_fused_attn()``), and reads the ``fused_attn`` attribute in
    every forward (timm 0.9 to 1.0.x); MEM needs the choice per call because the faster kernel differs between a CPU
    training step and inference (``models.attention._pick_kernel``)."""
    if not hasattr(attn, "fused_attn"):
        raise MemError(
            f"timm {timm.__version__}: {type(attn).__qualname__} has no 'fused_attn' switch, which MEM sets per call "
            "to pick the attention kernel; use a timm release from 0.9 to 1.0.x"
        )
    if attn.fused_attn != fused:  # written only on a change: a compiled model sees a constant
        attn.fused_attn = fused


def shutdown_loader_workers(loader: DataLoader) -> None:
    """Stop ``loader``'s persistent worker processes now. torch has no public call for it: they stop when the
    iterator that ``loader`` keeps (``_iterator``) is collected, and in a reference cycle the collector may tear down
    their queues first, after which torch waits its 5 s join timeout per worker. torch 2.x's iterator stops them in
    ``_shutdown_workers``; without it (another torch) the iterator is dropped and left to the collector, as before."""
    iterator = loader.__dict__.get("_iterator")
    loader.__dict__["_iterator"] = None
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


def loader_worker_pids(loader: DataLoader) -> list[int]:
    """Process ids of ``loader``'s running workers (empty without workers or before the first batch); torch keeps
    them in its iterator's ``_workers`` (torch 2.x)."""
    iterator = loader.__dict__.get("_iterator")
    return [w.pid for w in getattr(iterator, "_workers", [])]
