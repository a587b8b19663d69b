"""The library internals MEM relies on still work as it relies on them: the attention kernel switch of timm's
Attention, and stopping a DataLoader's persistent workers at once."""

from __future__ import annotations

import os
import time

import pytest
import torch
from timm.models.beit import Attention
from torch.utils.data import DataLoader, TensorDataset

from mem_core.adapters import loader_worker_pids, set_fused_attention, shutdown_loader_workers
from mem_core.errors import MemError


def test_the_attention_switch_changes_the_kernel_not_the_result(monkeypatch):
    attn = Attention(32, num_heads=4, window_size=(4, 4)).eval()
    x = torch.randn(2, 17, 32)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    set_fused_attention(attn, True)
    fused = attn(x, shared_rel_pos_bias=None)
    set_fused_attention(attn, False)
    plain = attn(x, shared_rel_pos_bias=None)
    assert calls == [1]  # SDPA ran for the fused call only
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)


def test_an_attention_without_the_switch_is_a_clear_error():
    with pytest.raises(MemError, match=r"timm .*: Linear has no 'fused_attn' switch"):
        set_fused_attention(torch.nn.Linear(2, 2), True)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow  # loader worker processes
def test_persistent_loader_workers_stop_when_shut_down():
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=2, num_workers=2, persistent_workers=True)
    assert loader_worker_pids(loader) == []
    next(iter(loader))
    pids = loader_worker_pids(loader)
    assert len(pids) == 2 and all(alive(p) for p in pids) and os.getpid() not in pids
    start = time.perf_counter()
    shutdown_loader_workers(loader)
    assert not any(alive(p) for p in pids)
    assert time.perf_counter() - start < 4  # not torch's 5 s join timeout
    assert loader_worker_pids(loader) == []
    shutdown_loader_workers(loader)  # a second call has nothing to stop
