"""What ``mem demo`` reports: every arm's top-1 on each held-out set per label seed, the spread over seeds, MEM's lead
over each other arm, and where MEM stands in words."""

from __future__ import annotations

from pathlib import Path

from app.config import DEMO_HELD_OUT, DemoConfig
from mem_core.train.experiment_report import MEM, SCRATCH, mean_std

YARDSTICK = "resnet18"  # the CNN a user would reach for first (mem_core.models.cnn), trained from scratch
ARMS = (MEM, SCRATCH, YARDSTICK)
ARM_NAMES = {MEM: "MEM (pretrained ViT)", SCRATCH: "ViT from scratch", YARDSTICK: "ResNet-18 from scratch"}


def say(message: str) -> None:
    from rich.console import Console

    # soft wrap: a line's words are never broken onto the next line, so what scripts and tests read does not depend
    # on the terminal's width or the length of a path
    Console(stderr=True, soft_wrap=True).print(f"[bold cyan]mem demo[/] {message}")


def spread(values: list[float]) -> dict:
    """Mean, standard deviation, least and largest of ``values`` (top-1 points over label seeds), to 0.1."""
    stats = mean_std(values) | {"min": min(values), "max": max(values)}
    return {key: round(value, 1) for key, value in stats.items()}


def evaluate_all(cfg: DemoConfig, runs: dict[tuple[str, int], Path]) -> dict:
    """Top-1 (%) of every finetuning run on each held-out set, per label seed; per arm the mean and spread over
    seeds, and MEM's lead over each other arm (per seed, mean, spread, worst and best seed)."""
    from mem_core.train.evaluate import evaluate_runs

    held_out = {}
    for split in cfg.held_out:
        scores = evaluate_runs(list(runs.values()), "sim", None, split, num_workers=0)
        top1 = {key: round(100 * score["top1"], 1) for key, score in zip(runs, scores, strict=True)}
        per_arm = {arm: [top1[arm, seed] for seed in cfg.label_seeds] for arm in ARMS}
        leads = {
            arm: [round(mine - theirs, 1) for mine, theirs in zip(per_arm[MEM], per_arm[arm], strict=True)]
            for arm in ARMS[1:]
        }
        held_out[split] = {
            "conditions": DEMO_HELD_OUT[split],
            "samples": scores[0]["n"],
            "seeds": [{"label_seed": seed} | {arm: top1[arm, seed] for arm in ARMS} for seed in cfg.label_seeds],
            "arms": {arm: spread(values) for arm, values in per_arm.items()},
            "mem_lead": {arm: {"per_seed": values, **spread(values)} for arm, values in leads.items()},
        }
    return {"labels_per_class": cfg.labels_per_class, "arms": ARM_NAMES, "held_out": held_out}


def standing(lead: dict, name: str) -> str:
    """Where MEM stands against the arm ``name`` over label seeds, from MEM's lead over it (``evaluate_all``)."""
    n = len(lead["per_seed"])
    ahead, behind = sum(d > 0 for d in lead["per_seed"]), sum(d < 0 for d in lead["per_seed"])
    mean = f"{lead['mean']:+.1f} points on average"
    if ahead == n:
        return f"ahead of the {name} on every label seed ({mean}, {lead['min']:+.1f} at the least)"
    if behind == n:
        return f"behind the {name} on every label seed ({mean}, {lead['max']:+.1f} at the closest)"
    if not ahead and not behind:
        return f"level with the {name} on every label seed"
    return (
        f"ahead of the {name} on {ahead} and behind it on {behind} of {n} label seeds ({mean}, {lead['min']:+.1f} to "
        f"{lead['max']:+.1f})"
    )


def summary(held: dict) -> str:
    """One held-out set's result in a sentence: where MEM stands against every other arm."""
    against = " and ".join(standing(held["mem_lead"][arm], ARM_NAMES[arm]) for arm in (YARDSTICK, SCRATCH))
    return f"On {held['conditions']}, MEM is {against}."


def print_tables(results: dict) -> str:
    """Print, per held-out set, every arm's top-1 per label seed with MEM's leads, the means ± std over seeds, and
    where MEM stands; returns the same as Markdown."""
    from rich.console import Console
    from rich.table import Table

    columns = ["label seed", *(ARM_NAMES[arm] for arm in ARMS), *(f"MEM - {ARM_NAMES[arm]}" for arm in ARMS[1:])]
    markdown = []
    for held in results["held_out"].values():
        rows = [
            [
                str(row["label_seed"]),
                *(f"{row[arm]:.1f}" for arm in ARMS),
                *(f"{row[MEM] - row[arm]:+.1f}" for arm in ARMS[1:]),
            ]
            for row in held["seeds"]
        ]
        arms, leads = held["arms"], held["mem_lead"]
        rows.append(
            [
                "mean ± std",
                *(f"{arms[arm]['mean']:.1f} ± {arms[arm]['std']:.1f}" for arm in ARMS),
                *(f"{leads[arm]['mean']:+.1f} ± {leads[arm]['std']:.1f}" for arm in ARMS[1:]),
            ]
        )
        title = (
            f"{results['labels_per_class']} labels per class; top-1 (%) on {held['samples']} held-out windows: "
            f"{held['conditions']}"
        )
        # on the terminal one row per arm and lead, one column per label seed: it fits 80 characters
        table = Table(title=title)
        table.add_column("")
        for column in [f"seed {row['label_seed']}" for row in held["seeds"]] + ["mean ± std"]:
            table.add_column(column, justify="right")
        for i, name in enumerate(columns[1:], 1):
            table.add_row(name, *(row[i] for row in rows), end_section=i == len(ARMS))
        Console().print(table)
        say(summary(held))
        markdown += [f"**{title}**", "", f"| {' | '.join(columns)} |", "|---" * len(columns) + "|"]
        markdown += [f"| {' | '.join(row)} |" for row in rows]
        markdown += ["", summary(held), ""]
    return "\n".join(markdown)
