"""The typed configs of the training stages, and ``stage_config``: the one way to build one.

The defaults live in these dataclasses only. A preset (``configs/<name>.toml``) or a ``--config FILE.toml`` states
what differs from them, in tables that apply to every stage (``[input]``, ``[data]``), to the ViT of pretrain,
finetune and segment (``[vit]``, their ``model``), or to one stage (``[tokenizer]``, ``[pretrain]``, ``[finetune]``,
``[segment]``, whose sub-tables or dotted keys reach nested fields: ``input.size``, ``model.num_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from mem_core.configuration import (
    ConfigError,
    apply_overrides,
    load_preset,
    load_toml,
    merge,
)
from mem_core.fields import (
    FRACTION,
    POSITIVE,
    SHARE,
    ConfigConflict,
    Count,
    NonNegative,
    PositiveCount,
    Range,
    Width,
    WindowMs,
    check_fields,
    device_problem,
)
from mem_core.limits import MAX_DEPTH, MAX_WIDTH
from mem_core.models.cnn import VIT, Arch
from mem_core.models.sizes import check_model_sizes
from mem_core.models.tokenizer import TokenizerConfig
from mem_core.models.vit import ViTConfig
from mem_core.representation import InputSpec

# The bounds of the numeric fields: a value outside them is a ConfigError at once, not a traceback (batch_size=0), a
# silent NaN (lr=nan) or a missing checkpoint (epochs=-1). A subclass restating a default keeps its base's bounds.
Fraction = Annotated[float, FRACTION]
LayerDecay = Annotated[float, SHARE]  # lr x decay per layer from the output back to the input


@dataclass
class DataConfig:
    """Which samples a stage trains and validates on."""

    dataset: str = "ncars"
    path: str = ""
    train_split: str = "train"
    val_split: str = "val"
    label_fraction: Annotated[float, SHARE] = 1.0  # of the labelled training samples (stratified, by label_seed)
    label_seed: int = 0
    max_samples: Count = 0  # cap the training set (0 = all), for quick runs
    # samples a training epoch draws (0: one pass over the training samples); more makes several passes, each in its
    # own order and augmentations: a few labels trained with the steps of many (mem experiment's equal steps)
    epoch_samples: Count = 0
    # the time span of the samples where the dataset does not fix one (ms; None: none): labelled captures were live
    # windows of at most this span, and an export serves its model on such windows (``export.training_window``)
    sample_ms: WindowMs | None = None
    # loader processes per training process; -1: one per core it gets, at most 8
    num_workers: Annotated[int, Range(-1)] = -1
    # samples stored one per file (N-Cars, N-MNIST, folders of recordings) are decoded once into memory when those a
    # loader reads take at most this many MiB, not at every epoch (``datasets.preload``); 0: read at every epoch
    preload_mib: Count = 2048
    # False: the splits as the dataset ships them, nothing held out of train: no validation split carved from the
    # training recordings (and no guards around it) where the data has none of its own; what a run that validates
    # on a split recorded apart (N-Cars' val-apart) trains on
    held_out: bool = True
    split_file: str = ""  # ncaltech101: where the fixed split is stored (default: inside the dataset root)
    # recordings without labels (corpora or folders of event files) that the tokenizer and the pretraining read
    # beside the training split, its labels dropped (``datasets.unlabeled``); a stage that learns labels refuses them
    unlabeled: tuple[str, ...] = ()
    verify: bool = False  # corpus: read and check every event before training (every shard is opened anyway)
    skip_bad: bool = False  # corpus: leave out the recordings of damaged shards instead of stopping

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class StageConfig:
    """What every stage shares: optimisation, schedule, data, input pipeline and execution."""

    seed: int = 0
    epochs: PositiveCount = 10
    batch_size: PositiveCount = 64  # global: split over DDP processes
    lr: NonNegative = 1e-3
    min_lr: NonNegative = 1e-6
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    weight_decay: NonNegative = 0.05
    schedule: Literal["cosine", "exponential", "constant"] = "cosine"
    schedule_epochs: Count = 0  # cosine length in epochs when longer than the run (paper: "cosine set for 300")
    lr_gamma: Annotated[float, SHARE] = 0.99  # per-epoch decay of the exponential schedule
    warmup_epochs: NonNegative = 0.0
    warmup_steps: Count = 0  # takes precedence over warmup_epochs when > 0
    grad_clip: NonNegative = 0.0  # max gradient norm (0 = off)
    device: str = "auto"
    accum_steps: PositiveCount = (
        1  # micro-batches per optimizer step: a batch larger than the device holds, same recipe
    )
    amp: bool = True  # bf16 autocast on GPU (ignored on CPU)
    cpu_bf16: bool = False  # bf16 training steps on a CPU with native bf16 (AVX512-BF16, AMX); validation in fp32
    # torch.compile (GPU): true, the whole model; "blocks", each transformer block on its own (a model without any:
    # whole), which leaves the code around them eager
    compile: bool | Literal["blocks"] = False
    eval_every: PositiveCount = 1
    # stop after the epoch that passes this many seconds of training (0: no limit), validated there; the result says
    # the run was cut short (the schedule was set for ``epochs``)
    time_limit_s: NonNegative = 0.0
    # a checkpoint after every epoch (0), or at most one per this many seconds and always after the last epoch: on a
    # GPU an epoch of a few labels lasts milliseconds and a ViT-S checkpoint with its optimizer is a quarter of a GB
    checkpoint_every_s: NonNegative = 0.0
    data: DataConfig = field(default_factory=DataConfig)
    input: InputSpec = field(default_factory=InputSpec)

    def __post_init__(self) -> None:
        check_fields(self)
        if (problem := device_problem(self.device)) is not None:
            raise ConfigError(problem)
        model = getattr(self, "model", None)
        if model is not None:
            check_model_sizes(model)


@dataclass
class TokenizerStageConfig(StageConfig):
    model: TokenizerConfig = field(default_factory=TokenizerConfig)
    lr: float = 2e-4
    schedule: Literal["cosine", "exponential", "constant"] = "exponential"
    weight_decay: float = 0.0
    grad_clip: float = 1e-2
    layer_decay: LayerDecay | None = None  # paper table: 0.98


@dataclass
class PretrainStageConfig(StageConfig):
    model: ViTConfig = field(default_factory=ViTConfig)
    method: Literal["mem", "emae"] = "mem"
    emae_loss: Literal["masked", "all"] = "all"  # eMAE: MSE on the masked patches or on the whole histogram
    emae_decoder: tuple[int, int, int] = (512, 8, 16)  # eMAE decoder width, depth, heads (the paper's MAE)
    mask_ratio: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.5
    # smallest masked block in patches; None: BEiT's 16 of 196, scaled to the grid
    mask_min_block: PositiveCount | None = None
    # true: the mask ratio counts every patch and every masked patch is predicted (BEiT); false (MEM only): only the
    # patches with events count, mask_ratio of them masked and predicted in each window (blocks may hide empty ones)
    mask_empty: bool = True
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 1000
    grad_clip: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.mask_empty and self.method != "mem":
            raise ConfigConflict("mask_empty=false is MEM's: eMAE masks uniformly random patches and predicts pixels")
        width, depth, heads = self.emae_decoder
        if not (1 <= width <= MAX_WIDTH and 1 <= depth <= MAX_DEPTH and 1 <= heads <= width):
            raise ConfigError(
                f"emae_decoder must be (width 1..{MAX_WIDTH}, depth 1..{MAX_DEPTH}, heads 1..width), "
                f"got {self.emae_decoder}"
            )


@dataclass
class FinetuneStageConfig(StageConfig):
    model: ViTConfig = field(default_factory=ViTConfig)
    # "vit": MEM's ViT of ``model``; a timm CNN name: that CNN from scratch on the same input (the yardstick), with
    # ``model.drop_path`` as its drop path and no layer decay
    arch: Arch = VIT
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.95)
    layer_decay: LayerDecay = 0.65
    label_smoothing: Fraction = 0.1
    dropout: Fraction = 0.0  # the paper's "dropout": after the position embedding and in every block (BEiT's drop_rate)
    head_dropout: Fraction = 0.0  # before the classifier head only
    head_init_scale: Annotated[float, POSITIVE] = 0.001  # BEiT's small head init; short CPU runs learn faster with 1.0
    ema_decay: Fraction = 0.0  # 0 = no EMA; the paper reports 0.9999 on large datasets
    mixup: NonNegative = 0.0  # Beta(alpha, alpha) of mixup between a batch and its reverse (0 = off; BEiT: 0.8)
    cutmix: NonNegative = 0.0  # the same for CutMix; with both on, each batch takes one of them (BEiT: 1.0)
    probe: bool = False  # linear probing: only the head's norm and linear layer train
    # layer decay's bottom groups kept as pretraining left them: 1 the stem, 1 + k the stem and the first k blocks
    frozen_layers: Count = 0
    warmup_epochs: float = 5.0
    # L2-SP (Li et al., ICML 2018): l2_sp / 2 x the squared distance of the weights from where finetuning started (the
    # pretrained ones; from scratch, the initial ones), the head aside: what few labels change stays near pretraining
    l2_sp: NonNegative = 0.0
    # distillation (SimCLRv2's second use of the unlabeled recordings): a finetune run or export whose class
    # probabilities on each training input (at ``distill_temperature``) the model learns in place of labels (no label
    # smoothing); it reads the training split with its labels ignored, and ``data.unlabeled`` beside it
    teacher: str = ""
    distill_temperature: Annotated[float, POSITIVE] = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.teacher and (self.mixup > 0 or self.cutmix > 0):
            raise ConfigConflict("mixup and cutmix mix labels; a student distilled from a teacher learns no labels")
        if self.teacher and self.data.label_fraction < 1:
            raise ConfigConflict(
                f"data.label_fraction={self.data.label_fraction}: a student distilled from a teacher reads every "
                "training recording without its label (the fraction is the teacher's finetuning's)"
            )
        if self.probe and self.arch != VIT:
            raise ConfigConflict(
                f"probe: a linear probe reads a pretrained ViT's features, arch={self.arch!r} has none"
            )
        if self.frozen_layers and self.arch != VIT:
            raise ConfigConflict(f"frozen_layers: counts a ViT's stem and blocks, arch={self.arch!r} has none")
        if self.frozen_layers > self.model.depth:
            raise ConfigConflict(
                f"frozen_layers must be at most the depth, {self.model.depth} (the stem and all but one block), "
                f"got {self.frozen_layers}"
            )


@dataclass
class SegmentStageConfig(StageConfig):
    model: ViTConfig = field(default_factory=ViTConfig)
    head_channels: Width = 256
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    layer_decay: LayerDecay = 0.65
    warmup_epochs: float = 2.0
    ignore_index: int = 255


STAGES = {
    "tokenizer": TokenizerStageConfig,
    "pretrain": PretrainStageConfig,
    "finetune": FinetuneStageConfig,
    "segment": SegmentStageConfig,
}

SHARED_TABLES = ("input", "data")  # preset tables that every stage takes as its field of that name
VIT_TABLE = "vit"  # the preset table that is the ``model`` of every stage with a ViT
EXTENDS_KEY = "extends"  # top-level key: the bundled preset a file builds on


def stage_tables(doc: dict[str, Any], stage: str, where: str, _seen: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The tables of a preset or config file that apply to ``stage``, in the order they apply (general first).

    ``extends = "PRESET"`` at the top of a file applies that bundled preset's tables first, so a file states only
    what it changes (``configs/cpu-small.toml`` is cpu-tiny with a ResNet stem and the N-Cars schedule)."""
    tables: list[dict[str, Any]] = []
    if EXTENDS_KEY in doc:
        base = doc[EXTENDS_KEY]
        if not isinstance(base, str):
            raise ConfigError(f"{where}: {EXTENDS_KEY} must be the name of a bundled preset, got {base!r}")
        if base in _seen:
            raise ConfigError(f"{where}: presets extend each other in a loop: {' -> '.join([*_seen, base])}")
        tables += stage_tables(load_preset(base), stage, f"preset {base}", (*_seen, base))
    unknown = sorted(set(doc) - {*STAGES, *SHARED_TABLES, VIT_TABLE, EXTENDS_KEY})
    if unknown:
        known = ", ".join(f"[{t}]" for t in (*SHARED_TABLES, VIT_TABLE, *STAGES))
        raise ConfigError(f"{where}: unknown table(s) {', '.join(f'[{t}]' for t in unknown)}; known: {known}")
    tables += [{key: doc[key]} for key in SHARED_TABLES if key in doc]
    if VIT_TABLE in doc and stage != "tokenizer":
        tables.append({"model": doc[VIT_TABLE]})
    return [*tables, doc.get(stage, {})]


def stage_config(
    stage: str,
    *,
    preset: str | None = None,
    config_file: Path | str | None = None,
    values: dict[str, Any] | None = None,
    overrides: list[str] | tuple[str, ...] = (),
):
    """The config of ``stage``: dataclass defaults < preset < config file < ``values`` (what command options set,
    nested or dotted keys such as ``data.dataset``) < ``--set`` ``overrides``. Unknown keys and wrong types are
    errors that name the key."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    config = STAGES[stage]()
    layers = []
    if preset:
        layers += stage_tables(load_preset(preset), stage, f"preset {preset}", (preset,))
    if config_file:
        layers += stage_tables(load_toml(Path(config_file)), stage, str(config_file))
    for table in [*layers, values or {}]:
        config = merge(config, table)
    return apply_overrides(config, overrides)
