"""The label-efficiency experiment's report: per arm and label fraction the mean and spread over seeds, MEM's leads
per seed, the tables of ``results.md`` and the two plots (``mem_core.train.experiment`` runs the experiment)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

MEM, SCRATCH = "mem", "scratch"
DISTILLED = "mem-distilled"  # a student that learnt MEM's predictions on the unlabeled recordings (SimCLRv2)
PRETRAINED = (MEM, DISTILLED)  # the arms that start from the pretraining: they see the unlabeled recordings


def mean_std(values: list[float]) -> dict[str, float]:
    """Mean and population standard deviation of ``values`` (over seeds)."""
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values)}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per label fraction and arm: mean and std over seeds of the kept model's top-1 on every split scored (val,
    val-apart, test), and the kept and the final epoch's top-1 on the choosing split."""
    out = []
    for fraction in sorted({r["labels"] for r in rows}):
        for arm in dict.fromkeys(r["arm"] for r in rows):
            sel = [r for r in rows if r["labels"] == fraction and r["arm"] == arm]
            if not sel:
                continue
            entry = {"arm": arm, "labels": fraction, "seeds": len(sel), "train_samples": sel[0]["train_samples"]}
            for key in ("test_top1", "val_top1", "val_apart_top1", "kept_top1", "final_top1"):
                if sel[0].get(key) is not None:
                    entry[key] = mean_std([r[key] for r in sel])
            out.append(entry)
    return out


def leads(rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """The lead in ``metric`` per label fraction of MEM over every arm without pretraining, and of the distilled MEM
    (where there is one) over every other arm: per seed (the same labelled samples in both runs), mean and std."""
    out = []
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    for fraction in sorted({r["labels"] for r in rows}):
        for ours in PRETRAINED:
            mine = {r["seed"]: r[metric] for r in rows if r["labels"] == fraction and r["arm"] == ours}
            for arm in (a for a in arms if a not in (ours, DISTILLED)):
                theirs = {r["seed"]: r[metric] for r in rows if r["labels"] == fraction and r["arm"] == arm}
                seeds = sorted(mine.keys() & theirs.keys())
                if seeds:
                    per_seed = [mine[s] - theirs[s] for s in seeds]
                    entry = {"labels": fraction, "of": ours, "over": arm, "per_seed": per_seed}
                    out.append(entry | mean_std(per_seed))
    return out


def _pct(stats: dict[str, float] | None) -> str:
    return "" if stats is None else f"{100 * stats['mean']:.1f} ± {100 * stats['std']:.1f}"


def _keys(report: dict[str, Any]) -> set[str]:
    """The per-split fields scored in every row of ``report``."""
    return {k for k in ("val_top1", "val_apart_top1", "test_top1") if all(r.get(k) is not None for r in report["rows"])}


def markdown_report(report: dict[str, Any]) -> str:
    """The experiment's tables: top-1 per fraction and arm (the headline first, each seed's headline figure),
    MEM's leads, and what each arm's model costs."""
    headline, rows = report["headline"], report["rows"]
    on_test = headline == "test_top1"
    chosen = report.get("choose_on", "val")
    first = "test top-1 (kept model)" if on_test else f"{chosen} top-1 (final epoch)"
    splits = [
        (key, split) for key, split in (("val_top1", "val"), ("val_apart_top1", "val-apart")) if key in _keys(report)
    ]
    columns = [f"{split} top-1 (kept model{', chose it' if split == chosen else ''})" for _, split in splits]
    lines = [
        f"| labels | train samples | arm | **{first}** | {' | '.join(columns)} | {chosen} top-1 (final epoch) | "
        f"{'test' if on_test else 'final'} per seed |",
        "|---|---|---|---|" + "---|" * len(columns) + "---|---|",
    ]
    for s in report["summary"]:
        seeds = [r for r in rows if r["labels"] == s["labels"] and r["arm"] == s["arm"]]
        per_seed = " / ".join(f"{100 * r[headline]:.1f}" for r in seeds)
        cells = "".join(f"{_pct(s.get(key))} | " for key, _ in splits)
        lines.append(
            f"| {s['labels']:.0%} | {s['train_samples']} | {s['arm']} | **{_pct(s.get(headline))}** | {cells}"
            f"{_pct(s['final_top1'])} | {per_seed} |"
        )
    where = f"the test split ({report['test_samples']} samples)" if on_test else f"{chosen}, final epoch"
    lines += ["", f"Leads in top-1 points on {where}, per seed:", "", "| labels | of | over | lead | per seed |"]
    lines.append("|---|---|---|---|---|")
    for lead in report["leads"]:
        per_seed = " / ".join(f"{100 * d:+.1f}" for d in lead["per_seed"])
        lines.append(
            f"| {lead['labels']:.0%} | {lead['of']} | {lead['over']} | "
            f"{100 * lead['mean']:+.1f} ± {100 * lead['std']:.1f} | {per_seed} |"
        )
    lines += ["", "| arm | parameters | CPU ms per live window, median / p95 |", "|---|---|---|"]
    for arm, info in report["arms"].items():
        lines.append(
            f"| {arm} | {info['parameters'] / 1e6:.2f}M | {info['cpu_ms_p50']:.1f} / {info['cpu_ms_p95']:.1f} "
            f"({info['cpu_threads']} thread(s)) |"
        )
    if any(r["cut_short"] for r in rows):
        cut = ", ".join(Path(r["run"]).name for r in rows if r["cut_short"])
        lines += ["", f"Cut short by their time limit: {cut}."]
    return "\n".join(lines)


COLOURS = {MEM: "tab:red", SCRATCH: "tab:blue", DISTILLED: "tab:purple"}
YARDSTICK_COLOUR = "tab:green"


def arm_label(arm: str) -> str:
    labels = {MEM: "MEM pretrained", SCRATCH: "same ViT from scratch", DISTILLED: "MEM, distilled on the unlabeled"}
    return labels.get(arm, f"{arm} from scratch")


def plot(report: dict[str, Any], path: Path) -> None:
    """The headline top-1 against the label fraction per arm (mean ± std over seeds); with a test split, the kept
    models' top-1 on the choosing split beside it, dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    headline, summary = report["headline"], report["summary"]
    on_test = headline == "test_top1"
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for arm in dict.fromkeys(s["arm"] for s in summary):
        pts = [s for s in summary if s["arm"] == arm]
        xs = [100 * s["labels"] for s in pts]
        colour = COLOURS.get(arm, YARDSTICK_COLOUR)
        ax.errorbar(
            xs,
            [100 * s[headline]["mean"] for s in pts],
            yerr=[100 * s[headline]["std"] for s in pts],
            marker="o",
            capsize=4,
            color=colour,
            label=arm_label(arm) + (", test" if on_test else ""),
        )
        if on_test:
            ys = [100 * s["kept_top1"]["mean"] for s in pts]
            chosen = report.get("choose_on", "val")
            ax.plot(xs, ys, linestyle="--", marker=".", color=colour, alpha=0.5, label=f"{arm_label(arm)}, {chosen}")
    ax.set_xscale("log")
    what = "test top-1 of the kept model" if on_test else f"{report.get('choose_on', 'val')} top-1 at the final epoch"
    ax.set(
        xlabel="labelled training samples (%)",
        ylabel=f"{what} (%)",
        title=f"Label efficiency on {report['dataset']} (mean ± std over seeds)",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(rows: list[dict[str, Any]], path: Path, dataset: str) -> None:
    """Every run's validation top-1 against the share of its training budget, one panel per label fraction: a colour
    per arm, a line style per seed, one legend entry for each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colours = {arm: COLOURS.get(arm, YARDSTICK_COLOUR) for arm in dict.fromkeys(r["arm"] for r in rows)}
    seeds = sorted({r["seed"] for r in rows})
    styles = {seed: ("-", "--", ":", "-.")[i % 4] for i, seed in enumerate(seeds)}
    fractions = sorted({r["labels"] for r in rows})
    fig, axes = plt.subplots(1, len(fractions), figsize=(5 * len(fractions), 3.6), squeeze=False, sharey=True)
    for ax, fraction in zip(axes[0], fractions, strict=True):
        for r in (r for r in rows if r["labels"] == fraction):
            epochs, top1 = zip(*r["val_curve"], strict=True)
            ax.plot(
                [100 * (e + 1) / r["epochs"] for e in epochs],
                [100 * t for t in top1],
                color=colours.get(r["arm"], "tab:gray"),
                linestyle=styles[r["seed"]],
                alpha=0.8,
            )
        ax.set(title=f"{fraction:.0%} of the labels", xlabel="training budget (%)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation top-1 (%)")
    arms = [a for a in colours if any(r["arm"] == a for r in rows)]
    handles = [Line2D([], [], color=colours[a], label=arm_label(a)) for a in arms]
    handles += [Line2D([], [], color="0.35", linestyle=styles[s], label=f"seed {s}") for s in seeds]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="lower right")
    fig.suptitle(f"Validation curves on {dataset}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
