"""PNG plots of a run: loss and metric curves from metrics.jsonl (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from mem_core.runs.rundir import RunDir


def plot_curves(run: RunDir, name: str = "curves.png") -> Path | None:
    """Loss curves (left) and every validation/accuracy metric (right) against the epoch."""
    records = run.metrics()
    if not records:
        return None
    epochs = [r["epoch"] + 1 for r in records]
    loss_keys = sorted({k for r in records for k in r if k.endswith("loss")})
    other_keys = sorted(
        {k for r in records for k in r if k.startswith("val_") and not k.endswith("loss") and isinstance(r[k], float)}
    )
    fig, axes = plt.subplots(1, 2 if other_keys else 1, figsize=(11 if other_keys else 6, 4), squeeze=False)
    for key in loss_keys:
        xs = [e for e, r in zip(epochs, records, strict=True) if r.get(key) is not None]
        axes[0, 0].plot(xs, [r[key] for r in records if r.get(key) is not None], marker=".", label=key)
    axes[0, 0].set(xlabel="epoch", ylabel="loss", title="loss")
    axes[0, 0].legend()
    axes[0, 0].grid(alpha=0.3)
    if other_keys:
        for key in other_keys:
            pts = [(e, r[key]) for e, r in zip(epochs, records, strict=True) if r.get(key) is not None]
            axes[0, 1].plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=key)
        axes[0, 1].set(xlabel="epoch", title="validation")
        axes[0, 1].legend()
        axes[0, 1].grid(alpha=0.3)
    fig.tight_layout()
    path = run.path / name
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
