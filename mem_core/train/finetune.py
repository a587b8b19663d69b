"""Stage 3: finetuning (or linear probing) a classifier, from a pretrained MEM/eMAE backbone or from scratch.

Recipe: mean-pooled patch tokens -> LayerNorm -> Linear; AdamW with layer-wise lr decay (timm), drop path, label
smoothing and an optional EMA of the weights. The best epoch is chosen on the *validation* split
(never the test split); evaluation windows are deterministic. Outputs: ``best.pt``, ``result.json``,
``confusion.png`` and the curves.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mem_core.models import MEMViT, load_pretrained_backbone
from mem_core.representation import batch_preprocess
from mem_core.train.common import batch_generator, fit_input, open_split, start_run, train_indices, wrap_model
from mem_core.train.configs import FinetuneStageConfig
from mem_core.train.engine import StepResult
from mem_core.train.fit import build_stage_loaders, fit
from mem_core.train.rundir import RunDir, RunError, load_checkpoint
from mem_core.train.runtime import Runtime, all_reduce_sum

ARCH_FIELDS = (
    "img_size",
    "patch_size",
    "in_chans",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "rel_pos_bias",
    "abs_pos_emb",
    "layer_scale_init",
)


def adopt_pretrained_architecture(cfg, init: Path | str):
    """Take the architecture of the pretraining run (keeping this stage's drop path) and its weights."""
    from mem_core.train.pretrain import load_pretrained_state

    state, pre_model = load_pretrained_state(init)
    model = dataclasses.replace(cfg.model, **{f: getattr(pre_model, f) for f in ARCH_FIELDS})
    if (model.img_size, model.in_chans) != (cfg.input.size[0], cfg.input.in_chans):
        raise RunError(
            f"{init} was pretrained on {model.in_chans}-channel {model.img_size}px inputs, but input gives "
            f"{cfg.input.in_chans} channels at {cfg.input.size}: use the same input settings"
        )
    return dataclasses.replace(cfg, model=model), state


def run(cfg: FinetuneStageConfig, out: Path | str, *, init: Path | str | None = None, resume: bool = False) -> RunDir:
    cfg = fit_input(cfg)
    pretrained = None
    if init is not None:
        cfg, pretrained = adopt_pretrained_architecture(cfg, init)
    runtime, run_dir = start_run("finetune", cfg, out, resume=resume)
    if init is not None:
        run_dir.write_json("init.json", {"path": str(Path(init).resolve())})
    train_src, val_src = open_split(cfg, cfg.data.train_split), open_split(cfg, cfg.data.val_split)
    if (train_src.labels < 0).any():
        raise RunError(f"{cfg.data.dataset} {cfg.data.train_split}: finetuning needs labels on every sample")
    indices = train_indices(cfg, train_src)
    run_dir.write_json("classes.json", {"classes": train_src.classes, "train_samples": len(indices)})
    loader, sampler, val_loader = build_stage_loaders(cfg, runtime, train_src, val_src, indices)
    num_classes = len(train_src.classes)
    torch.manual_seed(cfg.seed)
    model = MEMViT(cfg.model, num_classes, drop_rate=cfg.head_dropout, head_init_scale=cfg.head_init_scale)
    if pretrained is not None:
        report = load_pretrained_backbone(model, pretrained)
        if report.missing:
            raise RunError(f"{init}: pretrained weights lack {', '.join(report.missing)}")
    if cfg.probe:
        model.freeze_features()
    model.to(runtime.device)
    train_model = wrap_model(model, cfg, runtime)
    from timm.optim import create_optimizer_v2
    from timm.utils import ModelEmaV3

    optimizer = create_optimizer_v2(
        model,
        "adamw",
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        layer_decay=None if cfg.probe else cfg.layer_decay,
        betas=cfg.betas,
    )
    ema = ModelEmaV3(model, decay=cfg.ema_decay) if cfg.ema_decay > 0 else None
    def step_fn(batch, epoch: int, step: int) -> StepResult:
        events, labels, _ = batch
        labels = labels.to(runtime.device)
        g = batch_generator(cfg, runtime, epoch, step)
        x = batch_preprocess(events, cfg.input, train=True, generator=g, device=runtime.device)
        logits = train_model(x)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=cfg.label_smoothing)
        acc = (logits.argmax(-1) == labels).float().mean().item()
        return StepResult(loss, {"acc": acc}, x.shape[0])

    def evaluate(epoch: int) -> dict[str, float]:
        net = ema.module if ema is not None else model
        result = evaluate_classifier(net, val_loader, cfg.input, runtime, num_classes)
        return {"top1": result["top1"], "loss": result["loss"]}

    fit_result = fit(
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
        select="top1",
        ema=ema,
        resume=resume,
        description="probe" if cfg.probe else "finetune",
    )
    if runtime.distributed:
        torch.distributed.barrier()  # best.pt is written by the main process; every process evaluates it
    best_model = MEMViT(cfg.model, num_classes)
    best_model.load_state_dict(load_checkpoint(run_dir.best_path)["model"])
    final = evaluate_classifier(best_model.to(runtime.device), val_loader, cfg.input, runtime, num_classes)
    if runtime.is_main:
        summary = {
            "split": cfg.data.val_split,
            "best_epoch": fit_result.best["epoch"] if fit_result.best else None,
            "top1": final["top1"],
            "n": final["n"],
            "classes": train_src.classes,
            "confusion": final["confusion"],
            "train_samples": len(indices),
            "init": str(init) if init else None,
            "probe": cfg.probe,
        }
        run_dir.write_json("result.json", summary)
        save_confusion(summary["confusion"], train_src.classes, run_dir.path / "confusion.png")
    return run_dir


@torch.no_grad()
def evaluate_classifier(model, loader, spec, runtime: Runtime, num_classes: int) -> dict:
    """Top-1, mean loss and the confusion matrix (rows: true class) over the whole split, all processes."""
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64)
    loss_sum = torch.zeros(1, dtype=torch.float64)
    for events, labels, _ in loader:
        x = batch_preprocess(events, spec, train=False, device=runtime.device)
        with runtime.autocast():
            logits = model(x)
        labels = labels.to(runtime.device)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum").item()
        pairs = labels * num_classes + logits.argmax(-1)
        confusion += torch.bincount(pairs.cpu(), minlength=num_classes**2).view(num_classes, num_classes).double()
    confusion = all_reduce_sum(confusion, runtime).cpu()
    loss_sum = all_reduce_sum(loss_sum, runtime).cpu()
    n = confusion.sum().item()
    return {
        "top1": confusion.diag().sum().item() / max(n, 1),
        "loss": loss_sum.item() / max(n, 1),
        "n": int(n),
        "confusion": confusion.long().tolist(),
    }


def save_confusion(confusion: list[list[int]], classes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = np.asarray(confusion, dtype=np.float64)
    k = len(classes)
    size = min(4 + 0.35 * k, 20)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(matrix / np.maximum(matrix.sum(1, keepdims=True), 1), cmap="Blues", vmin=0, vmax=1)
    if k <= 30:
        ax.set_xticks(range(k), classes, rotation=90)
        ax.set_yticks(range(k), classes)
        for i in range(k):
            for j in range(k):
                ax.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=8)
    ax.set(xlabel="predicted", ylabel="true", title=f"confusion (top-1 {np.trace(matrix) / max(matrix.sum(), 1):.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
