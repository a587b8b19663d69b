"""Accuracy against unlabeled recordings: several label-efficiency experiments that differ only in what MEM was
pretrained on (``--unlabeled``, ``--pretrain-budget``) read as one curve, with the arms that see no unlabeled data
(the ViT from scratch, the CNN) as bands, and the students distilled from MEM on the same recordings (``--distill``)
as points of their own.

``mem experiment unlabeled-curve SOURCE...`` reads each experiment's ``results.json``: the recordings its pretraining
read (the pretraining run's training samples: the labelled training split and every unlabeled corpus or folder),
how it was scaled (the same epochs or the same steps), and every kept model's top-1 on the headline split. It writes
``unlabeled_curve.json``, ``unlabeled_curve.md`` and ``unlabeled_curve.png``. The JSON holds every experiment it was
drawn from, rows included, and is itself a source: a curve grows by one experiment without the run directories (and
their checkpoints) of the earlier ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mem_core.errors import MemError
from mem_core.train.experiment_report import COLOURS, MEM, PRETRAINED, YARDSTICK_COLOUR, arm_label, mean_std

RESULTS = "results.json"
CURVE = "unlabeled_curve.json"
# what every experiment of a curve's JSON holds (``read_experiment``'s keys the curve is drawn from)
EXPERIMENT_KEYS = ("out", "recordings", "budget", "pretrain_epochs", "headline", "rows")
ROW_KEYS = ("arm", "labels", "seed")


def load_results(out: Path) -> dict[str, Any]:
    """A finished label-efficiency experiment's ``results.json``; ``MemError`` in one line when it is not one."""
    path = Path(out) / RESULTS
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise MemError(f"{out}: no {RESULTS}: not a finished mem experiment label-efficiency") from None
    except ValueError as e:
        raise MemError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(report, dict) or "rows" not in report:
        raise MemError(f"{path}: not a label-efficiency experiment's results (no rows)")
    return report


def read_experiment(out: Path) -> dict[str, Any]:
    """One experiment's ``results.json`` and the recordings its pretraining read; ``MemError`` in one line when it
    is not a finished label-efficiency experiment."""
    from mem_core.runs.rundir import RunDir
    from mem_core.train.experiment import pretrain_runs_in

    report = load_results(out)
    pretraining = report.get("pretraining") or {}
    # one pretraining run, or one per seed (``--pretrain-per-seed``): the same recordings and epochs in each
    run = next((r for r in pretrain_runs_in(out) if (r / "result.json").is_file()), None)
    if run is None:
        raise MemError(f"{out}: no pretrain/result.json: the pretraining run is missing")
    recordings = json.loads((run / "result.json").read_text())["train_samples"]
    data = pretraining.get("data") or {}
    unlabeled = data.get("unlabeled") or []
    return {
        "out": str(out),
        "recordings": int(recordings),
        "unlabeled": [{k: u.get(k) for k in ("path", "kind", "digest", "recordings", "events")} for u in unlabeled],
        "budget": pretraining.get("budget", "epochs") if unlabeled else "both",
        "pretrain_epochs": (pretraining.get("epochs") or {}).get(run.name)
        or RunDir(run).read_config()["config"]["epochs"],
        "pretrain_per_seed": bool(pretraining.get("per_seed", False)),
        "headline": report["headline"],
        "rows": report["rows"],
        "seconds": report.get("seconds", {}),
    }


def read_curve(path: Path) -> list[dict[str, Any]]:
    """The experiments an earlier curve (its ``unlabeled_curve.json``) was drawn from; ``MemError`` in one line when
    the file is not such a curve."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as e:
        raise MemError(f"{path}: not valid JSON ({e})") from None
    experiments = data.get("experiments") if isinstance(data, dict) else None
    if not isinstance(experiments, list) or not all(map(_is_experiment, experiments)):
        raise MemError(f"{path}: not an unlabeled curve ({CURVE} of mem experiment unlabeled-curve)")
    return experiments


def _is_experiment(e: Any) -> bool:
    """Whether ``e`` holds what the curve is drawn from: ``EXPERIMENT_KEYS``, and rows with ``ROW_KEYS`` and the
    headline figure."""
    if not isinstance(e, dict) or not all(k in e for k in EXPERIMENT_KEYS) or not isinstance(e["rows"], list):
        return False
    return all(isinstance(r, dict) and all(k in r for k in (*ROW_KEYS, e["headline"])) for r in e["rows"])


def read_sources(sources: list[Path]) -> list[dict[str, Any]]:
    """The experiments of ``sources`` (finished experiments' directories, earlier curves' JSON files), each once: an
    experiment read again (the same ``out``) takes the place of its earlier copy."""
    experiments = {
        e["out"]: e
        for source in sources
        for e in (read_curve(source) if Path(source).is_file() else [read_experiment(source)])
    }
    return list(experiments.values())


def curve(sources: list[Path]) -> dict[str, Any]:
    """The experiments of ``sources`` as points: per pretraining budget and label fraction, MEM's and the distilled
    MEM's headline top-1 (mean and std over seeds) at each count of recordings; per label fraction, every arm that
    sees no unlabeled recordings (pooled over the experiments that trained it on the same runs, each seed once)."""
    experiments = sorted(read_sources(sources), key=lambda e: e["recordings"])
    headlines = {e["headline"] for e in experiments}
    if len(headlines) != 1:
        raise MemError(f"the experiments are scored on different splits ({', '.join(sorted(headlines))})")
    metric = headlines.pop()
    points = []
    for e in experiments:
        for fraction, arm in ((f, a) for f in sorted({r["labels"] for r in e["rows"]}) for a in PRETRAINED):
            values = [r[metric] for r in e["rows"] if r["arm"] == arm and r["labels"] == fraction]
            if values:
                points.append(
                    {
                        "arm": arm,
                        "recordings": e["recordings"],
                        "budget": e["budget"],
                        "pretrain_epochs": e["pretrain_epochs"],
                        "pretrain_per_seed": e.get("pretrain_per_seed", False),
                        "labels": fraction,
                        "seeds": len(values),
                        "per_seed": values,
                        **mean_std(values),
                        "out": e["out"],
                    }
                )
    baselines: dict[tuple[str, float], dict[int, float]] = {}
    for e in experiments:
        for r in e["rows"]:
            if r["arm"] not in PRETRAINED:  # the arms that see no unlabeled recordings
                baselines.setdefault((r["arm"], r["labels"]), {})[r["seed"]] = r[metric]
    bands = [
        {"arm": arm, "labels": fraction, "seeds": len(v), **mean_std(list(v.values()))}
        for (arm, fraction), v in sorted(baselines.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]
    return {"metric": metric, "experiments": experiments, "points": points, "bands": bands}


def markdown_curve(result: dict[str, Any]) -> str:
    """The curve as a table: one row per label fraction and pretraining (recordings, budget), the bands below."""
    lines = [
        f"| labels | unlabeled recordings pretrained on | pretraining | arm | {result['metric']} | per seed |",
        "|---|---|---|---|---|---|",
    ]
    for p in sorted(
        result["points"],
        key=lambda p: (p["labels"], p["recordings"], p["budget"], _per_seed(p), PRETRAINED.index(p["arm"])),
    ):
        budget = {"both": "the recipe", "epochs": "same epochs", "steps": "same steps"}[p["budget"]]
        each = ", one per seed" if _per_seed(p) else ""
        lines.append(
            f"| {p['labels']:.0%} | {p['recordings']:,} | {budget} ({p['pretrain_epochs']} epochs{each}) | "
            f"{arm_label(p['arm'])} | {100 * p['mean']:.1f} ± {100 * p['std']:.1f} | "
            f"{' / '.join(f'{100 * v:.1f}' for v in p['per_seed'])} |"
        )
    for b in result["bands"]:
        lines.append(
            f"| {b['labels']:.0%} | none | | {arm_label(b['arm'])} | {100 * b['mean']:.1f} ± {100 * b['std']:.1f} | |"
        )
    return "\n".join(lines)


def _per_seed(point: dict[str, Any]) -> bool:
    """Whether each seed of ``point`` pretrained its own model (a point without the key: no)."""
    return bool(point.get("pretrain_per_seed", False))


def plot_curve(result: dict[str, Any], path: Path) -> None:
    """One panel per label fraction: MEM's top-1 against the recordings it was pretrained on (log x), a line per
    pretraining budget (mean ± std over seeds), hollow where each seed pretrained its own, the distilled MEM likewise,
    the arms without pretraining as bands (mean ± std)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = sorted({p["labels"] for p in result["points"]})
    fig, axes = plt.subplots(1, len(fractions), figsize=(5.2 * len(fractions), 4.8), squeeze=False, sharey=False)
    xs_all = sorted({p["recordings"] for p in result["points"]})
    for ax, fraction in zip(axes[0], fractions, strict=True):
        lines = ((a, b, s, e) for e in (False, True) for a in PRETRAINED for b, s in (("epochs", "-"), ("steps", "--")))
        for arm, budget, style, each in lines:
            mine = [p for p in result["points"] if p["arm"] == arm and p["labels"] == fraction and _per_seed(p) == each]
            scaled = {p["budget"] for p in mine} - {"both"}  # the budgets with points of their own
            if (scaled and budget not in scaled) or (not scaled and budget == "steps"):
                continue  # the recipe's point alone is drawn once, in the epochs line
            pts = sorted((p for p in mine if p["budget"] in (budget, "both")), key=lambda p: p["recordings"])
            if not pts:
                continue
            name = ("MEM" if arm == MEM else "MEM distilled") + (" (a pretraining per seed)" if each else "")
            # beside MEM's point at the same recordings, not on it
            shift = (1.0 if arm == MEM else 1.04) * (0.96 if each else 1.0)
            ax.errorbar(
                [p["recordings"] * shift for p in pts],
                [100 * p["mean"] for p in pts],
                yerr=[100 * p["std"] for p in pts],
                marker="o" if arm == MEM else "D",
                markerfacecolor="white" if each else COLOURS[arm],
                capsize=4,
                linestyle=style,
                color=COLOURS[arm],
                alpha=1.0 if budget == "epochs" else 0.6,
                label=f"{name}, pretrained the same {budget}" if scaled else name,
            )
        for band in (b for b in result["bands"] if b["labels"] == fraction):
            colour = COLOURS.get(band["arm"], YARDSTICK_COLOUR)
            lo, hi = 100 * (band["mean"] - band["std"]), 100 * (band["mean"] + band["std"])
            ax.axhspan(lo, hi, color=colour, alpha=0.15)
            ax.axhline(100 * band["mean"], color=colour, linewidth=1, label=f"{arm_label(band['arm'])} (no unlabeled)")
        ax.set_xscale("log")
        ax.set_xticks(xs_all, [f"{x:,}" for x in xs_all])
        ax.minorticks_off()
        ax.set(
            title=f"{fraction:.0%} of the labels",
            xlabel="recordings MEM was pretrained on (unlabeled)",
            ylabel=f"{result['metric'].removesuffix('_top1').replace('_', '-')} top-1 (%)",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17))  # below: off the points
    fig.suptitle("More unlabeled recordings: mean ± std over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_curve(sources: list[Path], dest: Path) -> dict[str, Any]:
    """``curve(sources)`` written into ``dest``: JSON, markdown table and plot."""
    result = curve(sources)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / CURVE).write_text(json.dumps(result, indent=2) + "\n")
    (dest / "unlabeled_curve.md").write_text(markdown_curve(result) + "\n")
    plot_curve(result, dest / "unlabeled_curve.png")
    return result
