"""Recipes against the recipe: label-efficiency experiments that differ in how some arm was trained (``--set
ARM:key=value``, another pretraining), read seed by seed against a base experiment, each taken or not on the split the
experiments chose on and checked on the others.

``mem experiment recipes BASE VARIANT... --out DIR`` pairs every (arm, label fraction, seed) a variant trained with
the base's run of the same arm, fraction and seed (the same labelled samples: the label seed is the run seed). Runs a
variant linked from the base (the same directory) are the same model and are left out. What changed is read off the
runs' own configs, not off the command line: every finetuning setting that differs, and the pretraining's when the
runs start from different pretraining runs. A recipe is **taken** when its mean paired gain on the choosing split
is above zero; the other splits (``test`` above all) only check what was taken. It writes ``recipes.json`` and
``recipes.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mem_core.configuration import to_dict
from mem_core.errors import MemError
from mem_core.train.experiment import SPLIT_KEYS
from mem_core.train.experiment_curve import load_results
from mem_core.train.experiment_report import arm_label, mean_std

SAME_FOR_EVERY_EXPERIMENT = ("dataset", "choose_on", "headline")


def chosen_on(report: dict[str, Any]) -> str:
    """The split an experiment chose on (results written before the choice was recorded chose on the default)."""
    from mem_core.train.experiment import LabelEfficiencyConfig

    return report.get("choose_on", LabelEfficiencyConfig.choose_on)  # the field's default


def differences(a: Path, b: Path, prefix: str = "") -> dict[str, list[Any]]:
    """``{setting: [a's, b's]}`` for every setting where the configs of the runs ``a`` and ``b`` differ, a setting one
    lacks counted as its stage's default (``RunDir.read_config`` gives every setting its present name)."""
    from mem_core.runs.rundir import RunDir, setting_differences
    from mem_core.train.configs import STAGES

    first, second = RunDir(a).read_config(), RunDir(b).read_config()
    stage = STAGES.get(first.get("stage"))
    defaults = to_dict(stage()) if stage is not None else None
    changed = setting_differences(first["config"], second["config"], defaults)
    return {f"{prefix}{key}": list(values) for key, values in changed.items()}


def changes(base_run: Path, variant_run: Path) -> dict[str, list[Any]]:
    """What a variant's run was trained with other than the base's: ``{setting: [base, variant]}``; the
    pretraining's settings prefixed ``pretrain:`` when the two start from different pretraining runs."""
    from mem_core.runs.lineage import pretraining_run_of

    changed = differences(base_run, variant_run)
    pre_a, pre_b = pretraining_run_of(base_run), pretraining_run_of(variant_run)
    if pre_a and pre_b and pre_a.resolve() != pre_b.resolve():
        pretrained = differences(pre_a, pre_b, "pretrain:")
        changed |= pretrained or {"pretrain:run": [str(pre_a), str(pre_b)]}  # the same settings, pretrained again
    elif bool(pre_a) != bool(pre_b):
        changed["init"] = [str(pre_a or ""), str(pre_b or "")]  # pretrained against from scratch
    return changed


def compare(base_out: Path, variant_out: Path) -> dict[str, Any]:
    """One variant against the base: per arm and label fraction it retrained, the paired per-seed differences on
    every split both scored, and whether the choosing split takes it."""
    base, variant = load_results(base_out), load_results(variant_out)
    for key in SAME_FOR_EVERY_EXPERIMENT:
        a, b = (chosen_on(r) if key == "choose_on" else r.get(key) for r in (base, variant))
        if a != b:
            raise MemError(
                f"{variant_out}: its {key} is {b!r}, the base's ({base_out}) {a!r}: "
                "recipes are compared on the same data, chosen and scored alike"
            )
    base_rows = {(r["arm"], r["labels"], r["seed"]): r for r in base["rows"]}
    pairs: dict[tuple[str, float], list[tuple[dict, dict]]] = {}
    for r in variant["rows"]:
        b = base_rows.get((r["arm"], r["labels"], r["seed"]))
        if b is not None and Path(r["run"]).resolve() != Path(b["run"]).resolve():
            pairs.setdefault((r["arm"], r["labels"]), []).append((b, r))
    if not pairs:
        raise MemError(
            f"{variant_out}: no run of the same arm, label fraction and seed as one of {base_out} that is not the "
            "base's own run: nothing to compare"
        )
    comparisons = []
    for (arm, fraction), matched in sorted(pairs.items(), key=lambda kv: kv[0][1]):  # the arms in the rows' order
        matched.sort(key=lambda pair: pair[0]["seed"])
        splits = {}
        for split, key in SPLIT_KEYS.items():
            if all(key in b and key in v for b, v in matched):
                diffs = [v[key] - b[key] for b, v in matched]
                splits[split] = {
                    "variant": mean_std([v[key] for _, v in matched]),
                    "base": mean_std([b[key] for b, _ in matched]),
                    "gain": mean_std(diffs),
                    "per_seed": diffs,
                }
        if chosen_on(base) not in splits:
            raise MemError(f"{variant_out}: {arm} at {fraction:.0%} has no {chosen_on(base)} score to choose on")
        comparisons.append(
            {
                "arm": arm,
                "labels": fraction,
                "seeds": [b["seed"] for b, _ in matched],
                # read off the first seed's pair: the seeds of one arm differ in their seed alone
                "changes": changes(Path(matched[0][0]["run"]), Path(matched[0][1]["run"])),
                "splits": splits,
                "taken": splits[chosen_on(base)]["gain"]["mean"] > 0,
            }
        )
    return {"variant": str(variant_out), "comparisons": comparisons}


def recipes(base_out: Path, variant_outs: list[Path]) -> dict[str, Any]:
    """Every variant against ``base_out`` (``compare``), with the split that chooses and the headline split."""
    base = load_results(base_out)
    return {
        "base": str(base_out),
        "choose_on": chosen_on(base),
        "headline": base["headline"],
        "variants": [compare(base_out, v) for v in variant_outs],
    }


def shown(value: Any) -> str:
    return "(none)" if value in (None, "", ()) else str(value)


def markdown_recipes(result: dict[str, Any]) -> str:
    """One row per variant, arm and label fraction: what changed, the gain on each split (mean ± std of the paired
    per-seed differences, and the variant's mean), taken or not on the choosing split."""
    chooser = result["choose_on"]
    order = [chooser, *(s for s in SPLIT_KEYS if s != chooser)]
    present = [s for s in order if any(s in c["splits"] for v in result["variants"] for c in v["comparisons"])]
    head = " | ".join(f"{s}{' (chooses)' if s == chooser else ''}" for s in present)
    lines = [
        f"Against {result['base']}: gain in top-1 points, mean ± std of the per-seed differences (the variant's mean).",
        "",
        f"| variant | arm | labels | seeds | changed (base -> variant) | {head} | |",
        "|---|---|---|---|---|" + "---|" * len(present) + "---|",
    ]
    for v in result["variants"]:
        for c in v["comparisons"]:
            changed = "; ".join(f"{k} {shown(a)} -> {shown(b)}" for k, (a, b) in c["changes"].items()) or "nothing"
            cells = []
            for s in present:
                x = c["splits"].get(s)
                cells.append(
                    f"{100 * x['gain']['mean']:+.1f} ± {100 * x['gain']['std']:.1f} ({100 * x['variant']['mean']:.1f})"
                    if x
                    else ""
                )
            lines.append(
                f"| {Path(v['variant']).name} | {arm_label(c['arm'])} | {c['labels']:.0%} | "
                f"{','.join(map(str, c['seeds']))} | {changed} | {' | '.join(cells)} | "
                f"{'**taken**' if c['taken'] else 'not taken'} |"
            )
    return "\n".join(lines)


def write_recipes(base_out: Path, variant_outs: list[Path], dest: Path) -> dict[str, Any]:
    """``recipes(...)`` written into ``dest``: ``recipes.json`` and ``recipes.md``."""
    result = recipes(base_out, variant_outs)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "recipes.json").write_text(json.dumps(result, indent=2) + "\n")
    (dest / "recipes.md").write_text(markdown_recipes(result) + "\n")
    return result
