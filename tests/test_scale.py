"""What a CPU can check of training at the paper's scale (GPUs, DDP, torch.compile): steps that never wait for the
device, FlexAttention against timm's attention, the compiled DDP model, SyncBatchNorm, each process's own dropout,
fp32 tokenizer targets and their bf16 switch, compiled pretraining, one writer of the N-Caltech101 split."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from conftest import synthetic_events
from torch.overrides import TorchFunctionMode

from mem_core.configuration import ConfigError
from mem_core.datasets import open_source
from mem_core.datasets.ncaltech101 import ncaltech101_split
from mem_core.errors import MemError
from mem_core.events import SensorSize
from mem_core.io import write_events
from mem_core.models import BlockMaskGenerator, DiscreteVAE, MEMViT, SegmentationModel, ViTConfig, attention
from mem_core.models.vit import compile_blocks
from mem_core.representation import batch_preprocess, collate_events, prepare_events
from mem_core.runs.export import export_tokenizer
from mem_core.runs.rundir import RunDir
from mem_core.train.common import sync_batch_norm, wrap_model
from mem_core.train.configs import stage_config
from mem_core.train.engine import seed_everything
from mem_core.train.finetune import FinetuneStage
from mem_core.train.pretrain import PretrainStage
from mem_core.train.runtime import Runtime
from mem_core.train.segment import SegmentStage
from mem_core.train.tokenizer import TokenizerStage

SENSOR = SensorSize(32, 48)
TINY = [
    "input.size=[32, 32]",
    "input.n_max=2000",
    "model.patch_size=8",
    "model.embed_dim=32",
    "model.depth=4",
    "model.num_heads=2",
]


def tiny_config(stage: str, *extra: str):
    overrides = [*TINY, *extra] if stage != "tokenizer" else [o for o in TINY if o.startswith("input.")]
    if stage == "tokenizer":
        overrides += ["model.num_layers=3", "model.num_tokens=512", "model.hidden_dim=16", "model.codebook_dim=8"]
    return stage_config(stage, preset="cpu-tiny", values={"data.dataset": "sim"}, overrides=overrides)


@pytest.fixture(scope="module")
def tokenizer_export(tmp_path_factory):
    """A random tokenizer of 512 tokens on the tiny input, as an export; its weights spread out so that patches get
    different tokens, as a trained one's do."""
    torch.manual_seed(0)
    model = DiscreteVAE(TokenizerStage.configure(tiny_config("tokenizer")).model)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return export_tokenizer(model, tmp_path_factory.mktemp("tok"))


def windows_batch(cfg, n: int = 4, labels: bool = False):
    """(events, labels, label images) as the loader gives them, for ``cfg``'s input."""
    windows = [prepare_events(synthetic_events(300, SENSOR, seed=i), SENSOR, cfg.input, train=False) for i in range(n)]
    masks = torch.zeros(n, *SENSOR, dtype=torch.long) if labels else None
    return collate_events(windows, SENSOR), torch.zeros(n, dtype=torch.long), masks


# ------------------------------------------------------------------- a training step never waits for the device


class BlockingCopies(TorchFunctionMode):
    """Fails a copy from the host to another device that waits for it (``non_blocking`` not set): on a GPU such a
    copy first waits for everything queued there."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and _off_host(kwargs.get("device")):
            raise AssertionError(f"{func.__name__}(..., device={kwargs['device']}) copies host data and waits")
        if func is torch.Tensor.to and args[0].device.type == "cpu":
            targets = [a for a in (*args[1:], kwargs.get("device")) if _off_host(a)]
            waits = not kwargs.get("non_blocking", any(a is True for a in args[1:]))
            if targets and waits:
                raise AssertionError(f"a blocking copy of a {tuple(args[0].shape)} tensor to {targets[0]}")
        return func(*args, **kwargs)


def _off_host(device) -> bool:
    return isinstance(device, str | torch.device) and torch.device(device).type != "cpu"


@pytest.mark.parametrize("stage_cls", [FinetuneStage, PretrainStage, SegmentStage])
def test_a_training_step_reads_nothing_back_from_the_device(tmp_path, tokenizer_export, stage_cls):
    """A step on the meta device (tensors without values) fails wherever it reads a value back from its device
    (``.item()``, ``bool()``, boolean indexing, ``nonzero``, ``bincount``, a copy to the host), each of which waits
    for the GPU to finish the work queued so far; a blocking copy to the device fails too. RandAugment is off: its
    per-op index tensors are built on the device from host lists (mem_core/augment.py)."""
    cfg = stage_cls.configure(tiny_config(stage_cls.name, "input.randaug_ops=0"))
    runtime = Runtime(device=torch.device("meta"))
    inputs = {"tokenizer": tokenizer_export} if stage_cls is PretrainStage else {}
    stage = stage_cls(cfg, runtime, RunDir(tmp_path), **inputs)
    stage.classes = ["a", "b"]
    model = runtime.place(stage.build_model()).train()
    batch = windows_batch(cfg, labels=stage_cls is SegmentStage)
    with BlockingCopies():
        result = stage.step(model, batch, epoch=0, step=0)
        result.loss.backward()
    assert result.loss.device.type == "meta"


def test_the_step_guard_catches_what_it_looks_for():
    on_device = torch.zeros(3, device="meta")
    for read in (lambda: on_device.sum().item(), lambda: bool(on_device.any()), lambda: on_device[on_device > 0]):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()
    with BlockingCopies(), pytest.raises(AssertionError, match="blocking copy"):
        torch.zeros(3).to("meta")
    with BlockingCopies(), pytest.raises(AssertionError, match="waits"):
        torch.tensor([1, 2], device="meta")
    with BlockingCopies():
        torch.zeros(3).to("meta", non_blocking=True)


def test_pretraining_targets_are_the_tokenizers_fp32_ids_in_a_bf16_step(tmp_path, tokenizer_export):
    cfg = PretrainStage.configure(tiny_config("pretrain"))
    stage = PretrainStage(cfg, Runtime(device=torch.device("cpu")), RunDir(tmp_path), tokenizer=tokenizer_export)
    x = torch.rand(16, 2, 32, 32, generator=torch.Generator().manual_seed(0))
    fp32 = stage.tokenizer.token_ids(x).reshape(16, -1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_bf16 = stage.tokenizer.token_ids(x).reshape(16, -1)
        seen = []
        stage.forward(lambda x, mask, ids, masked: seen.append(ids) or {}, x, np.random.default_rng(0))
    assert not torch.equal(in_bf16, fp32)  # bf16 picks other tokens for some patches of this tokenizer
    assert torch.equal(seen[0], fp32)


def test_bf16_targets_keep_the_fp32_token_of_most_cells_of_real_windows(tmp_path, tokenizer_export, data_dir):
    """``MEM_BF16_TARGETS=1`` (the targets in bf16 with channels-last inputs and weights, for a GPU's convolutions)
    changes the token of a few cells. On 64 N-Cars validation windows through this random 512-token tokenizer 98 % of
    the cells keep theirs, of those with events too; through a trained one (the cpu preset's, 512 tokens at 64 x 64)
    95 % (docs/BENCHMARKS.md)."""
    cfg = PretrainStage.configure(tiny_config("pretrain"))
    source = open_source("ncars", data_dir / "ncars-dev", "val")
    picks = np.linspace(0, len(source) - 1, 64).astype(int)
    windows = [
        prepare_events(source.load_window(int(i), cfg.input.n_max, None), source.sensor, cfg.input, train=False)
        for i in picks
    ]
    x = batch_preprocess(collate_events(windows, source.sensor), cfg.input, train=False, device=torch.device("cpu"))

    def targets(bf16: bool) -> torch.Tensor:
        runtime = Runtime(device=torch.device("cpu"))
        return PretrainStage(cfg, runtime, RunDir(tmp_path), tokenizer=tokenizer_export, bf16_targets=bf16).targets(x)

    exact, fast = targets(False), targets(True)
    active = torch.nn.functional.max_pool2d(x.sum(1, keepdim=True), 8).flatten(1) > 0  # (B, N): cells with events
    assert 0.3 < active.float().mean() < 0.9
    assert not torch.equal(fast, exact)  # the switch computes in bf16
    assert (fast == exact).float().mean() >= 0.9
    assert (fast == exact)[active].float().mean() >= 0.9


def test_compile_is_true_false_or_blocks():
    assert tiny_config("pretrain", "compile=blocks").compile == "blocks"
    assert tiny_config("finetune", "compile=true").compile is True
    assert tiny_config("finetune").compile is False
    with pytest.raises(ConfigError, match="compile"):
        tiny_config("pretrain", "compile=model")


@pytest.mark.slow  # dynamo traces the tiny ViT twice
def test_a_compiled_pretraining_model_is_one_graph_given_the_masked_positions(tmp_path, tokenizer_export):
    """Pretraining finds the masked positions on the host and hands them to the model: compiled whole
    (``compile = true``), its forward is one graph and gives eager's loss. A model left to find them itself breaks
    its graph there (``nonzero``: a result whose size depends on the data)."""
    torch.compiler.reset()
    cfg = PretrainStage.configure(tiny_config("pretrain"))
    stage = PretrainStage(cfg, Runtime(device=torch.device("cpu")), RunDir(tmp_path), tokenizer=tokenizer_export)
    torch.manual_seed(0)
    model = stage.build_model().train()
    batch = windows_batch(cfg)
    eager = stage.step(copy.deepcopy(model), batch, epoch=0, step=0).loss
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break is an error
    torch.testing.assert_close(stage.step(compiled, batch, epoch=0, step=0).loss, eager)

    x = torch.rand(4, 2, 32, 32, generator=torch.Generator().manual_seed(0))
    mask = stage.masks.batch(4, np.random.default_rng(0))
    found_inside = torch._dynamo.explain(model)(x, mask, stage.targets(x))
    assert found_inside.graph_break_count > 0 and "nonzero" in str(found_inside.break_reasons)
    torch.compiler.reset()


@pytest.mark.slow  # inductor compiles a block's forward and backward on the CPU (about a minute on 2 busy cores)
def test_compiling_the_blocks_trains_as_eager_does(tmp_path, tokenizer_export):
    """``compile = "blocks"``: the blocks of the trained model itself compiled (no wrapper), the same losses and
    gradients as the eager model, step after step. A CPU run leaves them eager (``wrap_model``), so the blocks are
    compiled here as a GPU run compiles them."""
    torch.compiler.reset()
    cfg = PretrainStage.configure(tiny_config("pretrain", "compile=blocks"))
    runtime = Runtime(device=torch.device("cpu"))
    stage = PretrainStage(cfg, runtime, RunDir(tmp_path), tokenizer=tokenizer_export)
    torch.manual_seed(0)
    model = stage.build_model().train()
    eager = copy.deepcopy(model)
    trained = wrap_model(model, cfg, runtime)
    assert trained is model and all(block._compiled_call_impl is None for block in model.backbone.blocks)
    assert compile_blocks(model) == len(model.backbone.blocks)
    batch = windows_batch(cfg)
    for step in range(2):
        expected = stage.step(eager, batch, epoch=0, step=step).loss
        got = stage.step(trained, batch, epoch=0, step=step).loss
        torch.testing.assert_close(got, expected)
        expected.backward()
        got.backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    torch.compiler.reset()


# ------------------------------------------------------------------------------------------ FlexAttention


@pytest.fixture
def kernel(monkeypatch):
    """``kernel(name)``: every attention call from now on takes that kernel; flex calls are counted in ``.flex``.

    On a CPU ``flex_attention`` refuses a backward only because its compiled CPU kernel has none; its dense
    reference implementation, which runs here, has one."""
    monkeypatch.setattr(flex_module, "_validate_device", lambda *args: None)
    real = attention.flex_attention

    def counted(*args, **kwargs):
        choose.flex += 1
        return real(*args, **kwargs)

    def choose(name: str) -> None:
        monkeypatch.setattr(attention, "attention_kernel", lambda tokens: name)

    choose.flex = 0
    monkeypatch.setattr(attention, "flex_attention", counted)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return choose


def biased_vit(embed_dim: int = 64, num_heads: int = 4) -> MEMViT:
    torch.manual_seed(0)
    config = ViTConfig(img_size=32, patch_size=8, embed_dim=embed_dim, depth=2, num_heads=num_heads, drop_path=0.0)
    vit = MEMViT(config).train()
    for block in vit.blocks:  # a relative position bias that matters (timm starts it at zero)
        torch.nn.init.normal_(block.attn.relative_position_bias_table, std=0.5)
    return vit


def features_and_gradients(vit: MEMViT, device: str = "cpu") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x = torch.rand(3, 2, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
    mask = BlockMaskGenerator((4, 4), 0.5, min_block=2).batch(3, np.random.default_rng(0)).to(device)
    out = vit.forward_features(x, mask)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(device)).sum().backward()
    return out.detach(), {name: p.grad for name, p in vit.named_parameters() if p.grad is not None}


def test_flex_attention_gives_timms_outputs_and_gradients(kernel):
    vit = biased_vit()
    flex = copy.deepcopy(vit)
    kernel("sdpa")
    reference, reference_grads = features_and_gradients(vit)
    kernel("flex")
    out, grads = features_and_gradients(flex)
    assert kernel.flex == 2  # one call per block
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    assert grads.keys() == reference_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    assert reference_grads["blocks.0.attn.relative_position_bias_table"].abs().sum() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_compiled_flex_attention_gives_sdpas_outputs_and_gradients(monkeypatch):
    """In fp32 (IEEE products on both sides: TF32 would round flex's and not SDPA's) and, with ViT-B's heads of 64,
    under the bf16 autocast of a training step, where inductor's default Hopper tiles did not fit shared memory."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(attention, "_flex_failed", False)
    vit = biased_vit().cuda()
    flex = copy.deepcopy(vit)
    monkeypatch.setattr(attention, "GPU_TRAINING_KERNEL", "sdpa")
    reference, reference_grads = features_and_gradients(vit, "cuda")
    monkeypatch.setattr(attention, "GPU_TRAINING_KERNEL", "flex")
    out, grads = features_and_gradients(flex, "cuda")
    assert all(block.attn.kernel == "flex" for block in flex.blocks)
    assert all(block.attn.kernel == "sdpa" for block in vit.blocks)
    torch.testing.assert_close(out, reference, rtol=1e-3, atol=1e-3)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-3, atol=1e-3, msg=name)

    vit = biased_vit(embed_dim=128, num_heads=2).cuda()  # heads of 64
    flex = copy.deepcopy(vit)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        monkeypatch.setattr(attention, "GPU_TRAINING_KERNEL", "sdpa")
        reference, reference_grads = features_and_gradients(vit, "cuda")
        monkeypatch.setattr(attention, "GPU_TRAINING_KERNEL", "flex")
        out, grads = features_and_gradients(flex, "cuda")
    assert not attention._flex_failed and all(block.attn.kernel == "flex" for block in flex.blocks)
    assert out.dtype == reference.dtype

    def relative(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert relative(out, reference) < 2e-2
    for name, grad in grads.items():
        assert relative(grad, reference_grads[name]) < 5e-2, name


def test_flex_attention_runs_in_the_autocast_dtype_with_tiles_of_its_own(monkeypatch):
    """As SDPA's autocast rule does, flex computes in the autocast dtype whatever its inputs' dtype, and it never
    runs on inductor's default tiles (too large for a Hopper block's shared memory at heads of 64)."""
    seen = []
    real = attention.flex_attention

    def spy(q, k, v, **kwargs):
        seen.append(((q.dtype, k.dtype, v.dtype), kwargs["kernel_options"]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attention, "flex_attention", spy)
    q, k, v = (torch.randn(2, 2, 17, 64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    bias = torch.randn(2, 17, 17)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention._sdpa_as_flex(q, k, v, attn_mask=bias)
        reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    [(dtypes, options)] = seen
    assert dtypes == (torch.bfloat16,) * 3 and out.dtype == reference.dtype == torch.bfloat16
    assert options["fwd_BLOCK_M"] * options["fwd_BLOCK_N"] <= 64 * 64
    assert ((out.float() - reference.float()).norm() / reference.float().norm()).item() < 2e-2


def test_a_gpu_where_flex_does_not_compile_trains_on_sdpa(monkeypatch, caplog):
    """A compilation failure of flex (inductor's "No valid triton configs", say) costs the run its speed-up, not the
    run: the call returns SDPA's result, the process warns once, and every later call takes SDPA."""
    from types import SimpleNamespace

    def refuse():
        def compiled(*args, **kwargs):
            inner = RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: shared memory")
            raise torch._dynamo.exc.BackendCompilerFailed(refuse, inner, None)

        return compiled

    monkeypatch.setattr(attention, "_flex_failed", False)
    monkeypatch.setattr(attention, "GPU_TRAINING_KERNEL", "flex")  # MEM_ATTENTION=flex
    monkeypatch.setattr(attention, "_runs_as_traced", lambda device: False)  # as on a GPU, outside a compiled model
    monkeypatch.setattr(attention, "_compiled_flex_attention", refuse)
    on_gpu = SimpleNamespace(device=torch.device("cuda"))
    assert attention.attention_kernel(on_gpu) == "flex"
    q, k, v = (torch.randn(2, 2, 17, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    bias = torch.randn(2, 17, 17)
    with caplog.at_level("WARNING", logger=attention.__name__):
        out = attention._sdpa_as_flex(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    assert "FlexAttention did not compile on this GPU (RuntimeError: No valid triton configs" in caplog.text
    assert attention.attention_kernel(on_gpu) == "sdpa"


def test_gpu_training_steps_take_sdpa_unless_the_user_asks_for_another_kernel(monkeypatch):
    """SDPA by default (faster than flex at the paper's sizes on an H200); MEM_ATTENTION=flex (or the older
    MEM_FLEX_ATTENTION=1) makes a GPU training step take flex, and inference keeps SDPA; TIMM_FUSED_ATTN=0 turns them
    all off; a kernel MEM does not know is an error naming the ones it knows."""
    from types import SimpleNamespace

    import timm.layers.config

    def kernels() -> str:
        x = SimpleNamespace(device=torch.device("cuda"))  # the choice reads the tokens' device only
        with torch.no_grad():
            inference = attention.attention_kernel(x)
        return f"{attention.attention_kernel(x)} {inference}"

    # the variable as a user sets it reaches the module where it is imported (one interpreter: 5 s)
    probe = "from mem_core.models import attention; print(attention.GPU_TRAINING_KERNEL)"
    env = {k: v for k, v in os.environ.items() if k not in ("TIMM_FUSED_ATTN", "MEM_ATTENTION")}
    r = subprocess.run(
        [sys.executable, "-c", probe],
        env=env | {"MEM_FLEX_ATTENTION": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "flex"
    assert attention.training_kernel_from_env({}) == "sdpa"
    assert attention.training_kernel_from_env({"MEM_ATTENTION": "sdpa", "MEM_FLEX_ATTENTION": "1"}) == "sdpa"
    assert attention.training_kernel_from_env({"MEM_ATTENTION": "flex", "MEM_FLEX_ATTENTION": "0"}) == "flex"
    with pytest.raises(MemError, match=r"^MEM_ATTENTION='flash': expected one of sdpa, flex$"):
        attention.training_kernel_from_env({"MEM_ATTENTION": "flash"})

    monkeypatch.setattr(attention, "GPU_TRAINING_KERNEL", "sdpa")  # the variables unset
    assert kernels() == "sdpa sdpa"
    attention.use_gpu_training_kernel("flex")  # what a benchmark comparing kernels does
    assert kernels() == "flex sdpa"
    with pytest.raises(MemError, match=r"^unknown GPU training kernel 'flash': expected one of sdpa, flex$"):
        attention.use_gpu_training_kernel("flash")
    monkeypatch.setattr(timm.layers.config, "_USE_FUSED_ATTN", 0)  # what TIMM_FUSED_ATTN=0 sets when timm is imported
    assert kernels() == "plain plain"


@pytest.mark.slow  # torch.compile traces the whole ViT
def test_a_compiled_vit_takes_flex_attention_without_graph_breaks(kernel):
    vit = biased_vit()
    kernel("sdpa")
    reference, reference_grads = features_and_gradients(copy.deepcopy(vit))
    kernel("flex")
    compiled = torch.compile(vit, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break is an error
    out, grads = features_and_gradients(compiled)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name.removeprefix("_orig_mod.")], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------- DDP and compile


@pytest.mark.slow  # torch.compile with inductor
def test_training_compiles_the_ddp_model_so_its_all_reduce_overlaps_the_backward(tmp_path):
    import torch.distributed as dist
    from torch._dynamo.eval_frame import OptimizedModule

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        plain = copy.deepcopy(model)
        cfg = dataclasses.replace(tiny_config("finetune"), compile=True)
        trained = wrap_model(model, cfg, Runtime(device=torch.device("cpu"), world_size=2))
        assert isinstance(trained, OptimizedModule)
        assert isinstance(trained._orig_mod, torch.nn.parallel.DistributedDataParallel)
        assert trained._orig_mod.module is model  # the saved model is the one trained
        assert callable(trained.no_sync)  # the micro-batches of accum_steps find it
        x = torch.randn(5, 6)
        trained(x).square().sum().backward()
        plain(x).square().sum().backward()
        for p, q in zip(model.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    finally:
        dist.destroy_process_group()


def test_batch_norm_is_synchronised_under_ddp_on_gpus_and_saved_as_batch_norm():
    def segmenter() -> SegmentationModel:
        torch.manual_seed(0)
        return SegmentationModel(
            MEMViT(ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, stem="conv")),
            3,
            channels=16,
        )

    def kinds(model) -> set[type]:
        return {type(m) for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}

    for runtime in (Runtime(torch.device("cpu"), world_size=2), Runtime(torch.device("cuda"), world_size=1)):
        model = segmenter()
        sync_batch_norm(model, runtime)
        assert kinds(model) == {torch.nn.BatchNorm2d}  # gloo on CPUs has none; one process needs none
    model = segmenter()
    weights = model.state_dict()
    sync_batch_norm(model, Runtime(torch.device("cuda"), world_size=2))
    assert kinds(model) == {torch.nn.SyncBatchNorm}  # head, neck and the convolutional stem
    saved = model.state_dict()
    assert saved.keys() == weights.keys()
    segmenter().load_state_dict(saved)  # a checkpoint loads into plain BatchNorm


def test_each_process_draws_its_own_dropout_and_drop_path():
    def draws(rank: int | None) -> torch.Tensor:
        seed_everything(3, 1, rank)
        return torch.rand(8)

    assert torch.equal(draws(0), draws(None))  # one process: rank 0
    assert torch.equal(draws(1), draws(1))
    assert not torch.equal(draws(0), draws(1))
    assert not torch.equal(draws(1), draws(2))


def test_torchrun_processes_draw_different_dropout(tmp_path):
    script = tmp_path / "draw.py"
    script.write_text(
        "import os, sys, torch\n"
        "from mem_core.train.engine import seed_everything\n"
        "from mem_core.train.runtime import setup_runtime, teardown_runtime\n"
        "runtime = setup_runtime('cpu')\n"
        "seed_everything(0, 0)\n"
        "mask = torch.nn.functional.dropout(torch.ones(64), 0.5)\n"
        f"open(os.path.join({str(tmp_path)!r}, f'rank{{runtime.rank}}.json'), 'w').write(str((mask > 0).tolist()))\n"
        "teardown_runtime()\n"
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    result = subprocess.run(
        torchrun, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [(tmp_path / f"rank{r}.json").read_text() for r in (0, 1)]
    assert ranks[0] != ranks[1]


# ----------------------------------------------------------------------------------- the N-Caltech101 split


def ncaltech_root(root):
    for name in ("Faces_easy", "ant"):
        (root / name).mkdir(parents=True)
        for i in range(10):
            write_events(root / name / f"image_{i:04d}.bin", synthetic_events(20, seed=i), SensorSize(180, 240))
    return root


def test_only_the_first_process_writes_the_split_file_and_all_make_the_same(tmp_path, monkeypatch):
    root = ncaltech_root(tmp_path / "data")
    monkeypatch.setenv("RANK", "1")
    other = ncaltech101_split(root)
    assert not (root / "mem-split.json").exists()
    monkeypatch.setenv("RANK", "0")
    first = ncaltech101_split(root)
    assert first == other == json.loads((root / "mem-split.json").read_text())
    assert sorted(p.name for p in root.iterdir() if p.is_file()) == ["mem-split.json"]  # no temporary file left


def test_a_split_file_that_cannot_be_written_whole_is_not_written_at_all(tmp_path, monkeypatch):
    from mem_core.datasets import DatasetError

    root = ncaltech_root(tmp_path / "data")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", lambda obj, f, **kw: (f.write('{"train": ['), full_disk()))
    with pytest.raises(DatasetError, match=r"mem-split\.json: No space left on device"):
        ncaltech101_split(root)
    assert [p.name for p in root.iterdir() if p.is_file()] == []  # neither half a split nor a temporary file
