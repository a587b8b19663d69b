"""Stage 3: finetuning (or linear probing) a classifier, from a pretrained MEM/eMAE backbone or from scratch.

Recipe: mean-pooled patch tokens -> LayerNorm -> Linear; AdamW with layer-wise lr decay (timm), drop path, label
smoothing, optional mixup / CutMix (timm's ``Mixup``) and an optional EMA of the weights. The best epoch is chosen
on the *validation* split (never the test split); evaluation windows are deterministic. Outputs: ``best.pt``,
``result.json``, ``confusion.png`` and the curves.

With a ``teacher`` (a finetuned classifier) the model learns the teacher's class probabilities instead of labels,
on the training split's recordings with their labels ignored and on ``data.unlabeled`` (SimCLRv2's distillation,
Chen et al. 2020: a finetuned model labels the unlabeled recordings for a student, strongest with 1-10 % labels).
Teacher and student see the same augmented input; the student is judged on the labelled validation split.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from timm.utils import ModelEmaV3

from mem_core.models import MEMViT
from mem_core.models.cnn import VIT, build_cnn
from mem_core.runs.rundir import RunDir, RunError
from mem_core.schema import class_names_problem
from mem_core.train.configs import FinetuneStageConfig
from mem_core.train.engine import StepResult, eval_batches
from mem_core.train.runtime import Runtime, all_reduce_sum
from mem_core.train.stage import DISTILLATION_DATA, TaskStage, run_stage

FRESH = ("head.", "fc_norm.", "fc.")  # a classifier's new layers (ViT head and its norm, timm CNN head): no L2-SP


class FinetuneStage(TaskStage):
    """Classification: the best epoch on the validation split is kept (``best.pt``) and reported. ``arch`` other than
    "vit" trains that timm CNN from scratch on the same input instead of the ViT."""

    name = "finetune"
    select = "top1"
    read_unlabeled = DISTILLATION_DATA
    teacher: torch.nn.Module | None = None  # the frozen classifier a distilled model learns from

    @classmethod
    def learns_without_labels(cls, cfg: FinetuneStageConfig) -> bool:
        return bool(cfg.teacher)

    @classmethod
    def configure(cls, cfg: FinetuneStageConfig, init: Path | str | None = None):
        if init is not None and cfg.arch != VIT:
            raise RunError(f"{init}: a pretraining run initialises a ViT; arch={cfg.arch!r} trains from scratch")
        if cfg.teacher:  # the config names the teacher wherever the run is read from
            cfg = dataclasses.replace(cfg, teacher=str(Path(cfg.teacher).resolve()))
        return super().configure(cfg, init=init)

    @property
    def description(self) -> str:
        if self.cfg.arch != VIT:
            return self.cfg.arch
        return "probe" if self.cfg.probe else "distil" if self.cfg.teacher else "finetune"

    def prepare(self, train_src, val_src, indices) -> None:
        cfg = self.cfg
        if cfg.teacher:
            self.classes = self.load_teacher(val_src)
        else:
            if (train_src.labels < 0).any():
                raise RunError(f"{cfg.data.dataset} {cfg.data.train_split}: finetuning needs labels on every sample")
            if (problem := class_names_problem(train_src.classes)) is not None:
                raise RunError(f"{cfg.data.dataset} {cfg.data.train_split}: the dataset's {problem}")
            self.classes = train_src.classes
        self.run.write_json("classes.json", {"classes": self.classes, "train_samples": len(indices)})
        if self.mixup is not None and (cfg.batch_size // self.runtime.world_size) % (2 * cfg.accum_steps):
            raise RunError(
                f"mixup and cutmix pair each sample with another of its batch: batch_size {cfg.batch_size} over "
                f"{self.runtime.world_size} process(es) and accum_steps {cfg.accum_steps} must give even micro-batches"
            )

    def load_teacher(self, val_src) -> list[str]:
        """Load the config's teacher, frozen on the device, once it is shown to classify the validation split's
        classes from the input this run builds; its class names."""
        from mem_core.representation import InputSpec
        from mem_core.runs.export import load_model

        cfg = self.cfg
        teacher, meta = load_model(cfg.teacher, self.runtime.device)
        if meta["task"] != "classification":
            raise RunError(f"{cfg.teacher}: a {meta['task']} model; a teacher classifies")
        differ = cfg.input.input_differences(InputSpec(**meta["input"]))
        if differ:
            raise RunError(
                f"{cfg.teacher}: the teacher's input is built otherwise ({', '.join(differ)}); the student must see "
                "the same input: use the teacher's input settings"
            )
        if meta["classes"] != val_src.classes:
            raise RunError(
                f"{cfg.teacher}: the teacher's classes {meta['classes']} are not the classes of "
                f"{cfg.data.dataset} {cfg.data.val_split} {val_src.classes}"
            )
        self.teacher = teacher.requires_grad_(False)
        return list(meta["classes"])

    @functools.cached_property
    def mixup(self):
        """timm's ``Mixup`` of the config (over ``self.classes``), or None when mixup and CutMix are off."""
        cfg = self.cfg
        if cfg.mixup <= 0 and cfg.cutmix <= 0:
            return None
        from timm.data import Mixup

        return Mixup(
            mixup_alpha=cfg.mixup,
            cutmix_alpha=cfg.cutmix,
            label_smoothing=cfg.label_smoothing,
            num_classes=len(self.classes),
        )

    def build_model(self) -> torch.nn.Module:
        cfg = self.cfg
        if cfg.arch != VIT:
            return build_cnn(cfg.arch, cfg.input.in_chans, len(self.classes), drop_path=cfg.model.drop_path)
        return MEMViT(
            cfg.model,
            len(self.classes),
            dropout=cfg.dropout,
            drop_rate=cfg.head_dropout,
            head_init_scale=cfg.head_init_scale,
        )

    def initialize(self, model: torch.nn.Module) -> None:
        super().initialize(model)
        if self.cfg.probe:
            model.freeze_features()
        elif self.cfg.frozen_layers:
            model.freeze_layers(self.cfg.frozen_layers)
        if self.cfg.l2_sp > 0:  # where finetuning starts, kept on the host until the first step finds the device
            self._start = {
                name: (p, p.detach().clone()) for name, p in model.named_parameters() if not name.startswith(FRESH)
            }

    def l2_sp(self) -> torch.Tensor:
        """The L2-SP penalty: ``l2_sp`` / 2 x the squared distance of the weights from their starting values."""
        for name, (p, start) in self._start.items():
            if start.device != p.device:
                self._start[name] = (p, start.to(p.device))
        distance = sum((p.float() - start).pow(2).sum() for p, start in self._start.values())
        return 0.5 * self.cfg.l2_sp * distance

    @property
    def layer_decay(self) -> float | None:
        # a probe trains only the head, and a CNN has no token blocks to decay over
        return None if self.cfg.probe or self.cfg.arch != VIT else self.cfg.layer_decay

    def build_ema(self, model: torch.nn.Module) -> ModelEmaV3 | None:
        return ModelEmaV3(model, decay=self.cfg.ema_decay) if self.cfg.ema_decay > 0 else None

    def step(self, model: torch.nn.Module, batch, epoch: int, step: int) -> StepResult:
        if self.teacher is not None:
            return self.distil_step(model, batch, epoch, step)
        events, labels, _ = batch
        labels = labels.to(self.runtime.device, non_blocking=True)  # pinned by the loader: no wait for the device
        x, _, g = self.train_inputs(events, epoch, step)
        targets, smoothing = labels, self.cfg.label_smoothing
        if self.mixup is not None:
            # timm's Mixup draws from numpy's global generator: seeded from the step's, a resumed run mixes the same
            np.random.seed(int(torch.randint(2**32, (1,), generator=g)))  # noqa: NPY002 (timm needs the legacy one)
            x, targets = self.mixup(x, labels)
            smoothing = 0.0  # already in Mixup's soft targets
        logits = model(x)
        loss = F.cross_entropy(logits.float(), targets, label_smoothing=smoothing)
        if self.cfg.l2_sp > 0:
            loss = loss + self.l2_sp()
        acc = (logits.argmax(-1) == labels).float().mean()
        return StepResult(loss, {"acc": acc}, x.shape[0])

    def distil_step(self, model: torch.nn.Module, batch, epoch: int, step: int) -> StepResult:
        """The cross-entropy of the student's tempered class probabilities against the teacher's on the same input
        (x T^2, Hinton et al.'s gradient scale); ``agree``: the share of inputs where both pick the same class."""
        x, _, _ = self.train_inputs(batch[0], epoch, step)
        t = self.cfg.distill_temperature
        with torch.no_grad():
            targets = F.softmax(self.teacher(x).float() / t, dim=-1)
        logits = model(x)
        loss = F.cross_entropy(logits.float() / t, targets) * t**2
        agree = (logits.argmax(-1) == targets.argmax(-1)).float().mean()
        return StepResult(loss, {"agree": agree}, x.shape[0])

    def evaluate(self, model: torch.nn.Module, loader) -> dict:
        return evaluate_classifier(model, loader, self.cfg.input, self.runtime, len(self.classes))

    def finish(self, result: dict) -> dict:
        save_confusion(result["confusion"], self.classes, self.run.path / "confusion.png")
        teacher = {"teacher": self.cfg.teacher} if self.cfg.teacher else {}
        return {"init": str(self.init) if self.init else None, "probe": self.cfg.probe, **teacher}


def yardstick_config(cfg: FinetuneStageConfig, arch: str) -> FinetuneStageConfig:
    """``cfg`` for the timm CNN ``arch`` from scratch: the same data, input, label subset, epochs and validations,
    with the optimiser settings a CNN trains well with (AdamW at 2e-3, betas (0.9, 0.999), a 10 % warm-up, then
    cosine; no layer decay)."""
    return dataclasses.replace(cfg, arch=arch, lr=2e-3, betas=(0.9, 0.999), warmup_epochs=cfg.epochs / 10)


# BEiT's layer decay keeps pretrained lower blocks near what pretraining taught them; from random weights it only slows
# them: on N-Cars the ViT from scratch reads 0.6-1.0 higher on val and 1.6-2.2 on test without it (docs/RESULTS.md,
# section 5)
SCRATCH_LAYER_DECAY = 1.0


def scratch_config(cfg: FinetuneStageConfig) -> FinetuneStageConfig:
    """``cfg`` for the same ViT trained from scratch, the comparison MEM is measured against: no layer decay."""
    return dataclasses.replace(cfg, layer_decay=SCRATCH_LAYER_DECAY)


def run(cfg: FinetuneStageConfig, out: Path | str, *, init: Path | str | None = None, resume: bool = False) -> RunDir:
    """Finetune (or probe) a classifier into the run directory ``out``, from the pretraining run ``init`` or scratch."""
    return run_stage(FinetuneStage, cfg, out, resume=resume, init=init)


@torch.no_grad()
def evaluate_classifier(model, loader, spec, runtime: Runtime, num_classes: int) -> dict:
    """Top-1, mean loss and the confusion matrix (rows: true class) over the whole split, all processes."""
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64, device=runtime.device)
    one = torch.ones((), dtype=torch.float64, device=runtime.device)
    loss_sum = torch.zeros(1, dtype=torch.float64, device=runtime.device)  # sums stay on the device until the end
    for logits, labels, _ in eval_batches(model, loader, spec, runtime):
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        pairs = labels * num_classes + logits.argmax(-1)
        confusion.view(-1).index_add_(0, pairs, one.expand(len(pairs)))  # bincount would read its largest index back
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
