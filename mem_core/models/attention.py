"""The attention kernel of each call of a ViT block: timm's plain product, SDPA, or FlexAttention.

timm's BEiT attention adds its relative position bias to the scores as SDPA's float ``attn_mask``. With a float mask
SDPA cannot take its flash kernel: on a GPU it takes the memory-efficient one, whose backward writes the bias
gradient of every sample, (B, heads, N, N), before it is summed. FlexAttention adds the bias inside its fused kernel
(a ``score_mod`` reading the bias) and sums the bias gradient there, with atomic adds of every sample into the one
(heads, N, N) bias. On an H200 that makes it the slower of the two at the paper's sizes (ViT-B/16, 224 x 224, bf16):
pretraining 1,289 against 1,472 img/s, finetuning 1,640 against 1,922 (docs/BENCHMARKS.md): flex's backward alone
takes 12.6 ms a block at batch 1024. So GPU training steps take SDPA, and ``MEM_ATTENTION=flex`` (or
``MEM_FLEX_ATTENTION=1``) takes flex, to compare the two, or on a GPU where it wins. timm's forward is kept whole:
within it, ``BeitAttention`` hands the SDPA call to ``flex_attention`` (a torch function mode), so the projections, the
bias and the dropout stay timm's.

Flex's tiles are chosen here, not left to inductor's defaults: on Hopper its default forward tile for a head of 64
(128 x 128, 3 stages) asks for 240 KiB of shared memory, more than the 227 KiB a block may have, and the compilation
fails ("No valid triton configs"). ViT tokens (197 at 224 x 224) fill 64 x 64 tiles with no more padding than
128 x 128 ones. Should flex still fail to compile, the process warns once and keeps SDPA, which computes the same
function, rather than stopping a training run. timm's ``TIMM_FUSED_ATTN=0`` turns SDPA and flex off.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Literal, get_args

import timm
import torch
import torch.nn.functional as F
from timm.layers import use_fused_attn
from timm.models.beit import Attention
from torch.nn.attention.flex_attention import flex_attention
from torch.overrides import TorchFunctionMode

from mem_core.adapters import set_fused_attention
from mem_core.errors import MemError

Kernel = Literal["plain", "sdpa", "flex"]
TrainingKernel = Literal["sdpa", "flex"]  # what MEM_ATTENTION may name for a GPU's training steps
# flex's tiles (forward; backward's two passes): within a Hopper block's shared memory at heads of 64 in bf16
FLEX_KERNEL_OPTIONS = {
    "fwd_BLOCK_M": 64,
    "fwd_BLOCK_N": 64,
    "bwd_BLOCK_M1": 64,
    "bwd_BLOCK_N1": 64,
    "bwd_BLOCK_M2": 64,
    "bwd_BLOCK_N2": 64,
    "bwd_num_stages": 2,
}
log = logging.getLogger(__name__)


def training_kernel_from_env(env: dict[str, str] | None = None) -> TrainingKernel:
    """The kernel of a GPU's training steps that the environment asks for: ``MEM_ATTENTION`` (``sdpa`` or ``flex``),
    or ``flex`` for ``MEM_FLEX_ATTENTION=1``; ``sdpa`` when neither is set."""
    env = os.environ if env is None else env
    name = env.get("MEM_ATTENTION", "") or ("flex" if env.get("MEM_FLEX_ATTENTION", "0") == "1" else "sdpa")
    if name not in get_args(TrainingKernel):
        raise MemError(f"MEM_ATTENTION={name!r}: expected one of {', '.join(get_args(TrainingKernel))}")
    return name


GPU_TRAINING_KERNEL: TrainingKernel = training_kernel_from_env()


def use_gpu_training_kernel(name: TrainingKernel) -> None:
    """Make a GPU's training steps take kernel ``name`` from now on, as ``MEM_ATTENTION=name`` does at start-up (a
    benchmark comparing kernels in one process; a compiled model recompiles for the change)."""
    global GPU_TRAINING_KERNEL
    if name not in get_args(TrainingKernel):
        raise MemError(f"unknown GPU training kernel {name!r}: expected one of {', '.join(get_args(TrainingKernel))}")
    GPU_TRAINING_KERNEL = name


def attention_kernel(x: torch.Tensor) -> Kernel:
    """The kernel of an attention call on tokens ``x``.

    - ``plain``, timm's softmax(q k^T + bias) v: a training step on a CPU (autograd recording, or bf16 autocast).
      There SDPA with an additive mask takes a path twice as slow as the plain product, forward and backward, and
      its bf16 backward without one is 6 times slower: a cpu-small finetuning epoch on one core takes 16.5 s
      instead of 19.1 s.
    - ``flex``: a training step on a GPU (autograd recording) with ``MEM_ATTENTION=flex``, see the module docstring.
    - ``sdpa`` everywhere else: a GPU's training steps and inference, fp32 inference on a CPU (validation, ``mem evaluate``, the live
      server: on 2 threads one window of ViT-B takes 1.0-1.1 ms a block against 1.1-2.1 ms), docs/BENCHMARKS.md.
    """
    if not use_fused_attn():
        return "plain"
    if x.device.type == "cpu":
        return "plain" if torch.is_grad_enabled() or torch.is_autocast_enabled("cpu") else "sdpa"
    if x.device.type == "cuda" and torch.is_grad_enabled() and GPU_TRAINING_KERNEL == "flex" and not _flex_failed:
        return "flex"
    return "sdpa"


class BeitAttention(Attention):
    """timm's BEiT attention, whose SDPA call runs as ``flex_attention`` while ``kernel`` says so."""

    kernel: Kernel = "sdpa"

    def forward(self, x: torch.Tensor, shared_rel_pos_bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.kernel != "flex":
            return super().forward(x, shared_rel_pos_bias)
        with _SdpaAsFlex():
            return super().forward(x, shared_rel_pos_bias)


def choose_kernel_per_call(attn: Attention) -> None:
    """Make ``attn``, one of the attentions timm's ``Beit`` builds, a ``BeitAttention`` (the same module and weights)
    that picks its kernel (``attention_kernel``) before each call."""
    if type(attn) is not Attention:
        raise MemError(
            f"timm {timm.__version__}: a BEiT block's attention is a {type(attn).__qualname__}, not "
            "timm.models.beit.Attention, whose forward MEM wraps to choose the attention kernel per call"
        )
    attn.__class__ = BeitAttention  # Beit builds its blocks' attention itself: there is no layer to pass in
    attn.register_forward_pre_hook(_pick_kernel)


def _pick_kernel(attn: BeitAttention, args: tuple) -> None:
    """Before each attention call (a forward pre-hook): the kernel for its tokens ``args[0]``."""
    kernel = attention_kernel(args[0])
    set_fused_attention(attn, kernel != "plain")
    if attn.kernel != kernel:  # written only on a change: a compiled model sees a constant
        attn.kernel = kernel


class _SdpaAsFlex(TorchFunctionMode):
    """Within timm's attention forward: SDPA with an additive float bias runs as ``flex_attention`` adding the bias in
    its ``score_mod``; every other call (and SDPA in any other form) runs as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _sdpa_as_flex(*args, **kwargs)
        return func(*args, **kwargs)


def _sdpa_as_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    **options,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` of (B, heads, N, d) ``q, k, v`` with an additive ``attn_mask``, computed by
    ``flex_attention``; SDPA itself where flex has no equivalent (no or a boolean mask, dropout, causal, options)."""
    if attn_mask is None or attn_mask.dtype == torch.bool or dropout_p > 0 or is_causal or options:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **options
        )
    if torch.is_autocast_enabled(q.device.type):  # as SDPA's autocast rule casts its inputs
        dtype = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    bias = attn_mask.view((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))  # (B or 1, heads or 1, N, N)
    per_sample, per_head = bias.shape[0] > 1, bias.shape[1] > 1

    # the bias is read as it is (not expanded to the batch), so its gradient is summed inside the kernel
    def add_bias(score, b, h, q_idx, kv_idx):
        return score + bias[b if per_sample else 0, h if per_head else 0, q_idx, kv_idx]

    options = {"score_mod": add_bias, "scale": scale, "kernel_options": FLEX_KERNEL_OPTIONS}
    if _runs_as_traced(q.device):
        return flex_attention(q, k, v, **options)
    try:  # on its own on a GPU: compiled (uncompiled it computes the whole score matrix)
        return _compiled_flex_attention()(q, k, v, **options)
    except torch._dynamo.exc.BackendCompilerFailed as e:  # inductor's errors included
        _give_up_flex(e)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


def _runs_as_traced(device: torch.device) -> bool:
    """``flex_attention`` runs as it is: traced into the graph of a compiled model, or on a CPU (the tests)."""
    return torch.compiler.is_compiling() or device.type == "cpu"


_flex_failed = False


def _give_up_flex(error: Exception) -> None:
    """Flex did not compile on this GPU: every later attention call of the process takes SDPA (warned once)."""
    global _flex_failed
    _flex_failed = True
    cause = getattr(error, "inner_exception", error)
    message = str(cause).strip().splitlines()
    log.warning(
        "FlexAttention did not compile on this GPU (%s: %s); training keeps SDPA",
        type(cause).__name__,
        message[0] if message else "no message",
    )


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)
