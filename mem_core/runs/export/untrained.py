"""``export_random``: an export of a randomly initialised model (and tokenizer), for benchmarks, tests and trying
the live path without training."""

from __future__ import annotations

from pathlib import Path

import torch

from mem_core.configuration import to_dict
from mem_core.models import DiscreteVAE, TokenizerConfig, ViTConfig
from mem_core.representation import InputSpec
from mem_core.runs.export.meta import build_task_model
from mem_core.runs.export.write import export_model


def export_random(
    out: Path | str,
    *,
    task: str = "classification",
    classes: tuple[str, ...] = ("background", "car"),
    architecture: ViTConfig | None = None,
    input_spec: InputSpec | None = None,
    tokenizer: TokenizerConfig | None = None,
    head_channels: int = 32,
    seed: int = 0,
    window_ms: float | None = None,
) -> Path:
    """Export a randomly initialised model (and tokenizer), for benchmarks, tests and trying the live path without
    training. ``architecture`` defaults to a ViT-B/16 and ``input_spec`` to 224 x 224 inputs of that model;
    ``window_ms`` is recorded as the training samples' time span."""
    arch = architecture or ViTConfig(drop_path=0.0)
    spec = input_spec or InputSpec(size=(arch.img_size, arch.img_size))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        meta = {"task": task, "architecture": to_dict(arch), "classes": list(classes), "head_channels": head_channels}
        model = build_task_model(meta)
        tok = DiscreteVAE(tokenizer) if tokenizer is not None else None
    return export_model(
        model,
        out,
        task=task,
        architecture=to_dict(arch),
        classes=list(classes),
        input_spec=spec,
        head_channels=head_channels if task == "segmentation" else None,
        tokenizer=tok,
        window_ms=window_ms,
    )
