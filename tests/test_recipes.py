"""`mem experiment recipes`: experiments that train some arm otherwise, read seed by seed against the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_stages import mem_in_process

from mem_core.configuration import to_dict
from mem_core.train.configs import FinetuneStageConfig, PretrainStageConfig

SEEDS = (0, 1, 2)


def write_run(path: Path, stage: str, config: dict, init: Path | None = None) -> Path:
    """A run directory's config (and the pretraining it started from) as the stages write them."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"stage": stage, "config": config}))
    if init is not None:
        (path / "init.json").write_text(json.dumps({"path": str(init)}))
    return path


def experiment(
    root: Path,
    name: str,
    scores: dict[str, list[tuple[float, float]]],
    *,
    finetune: dict | None = None,
    pretrain_epochs: int = 200,
    linked_from: Path | None = None,
    choose_on: str = "val-apart",
) -> Path:
    """A finished experiment: a pretraining run, then per arm in ``scores`` one finetuning run per seed at 10 %
    labels scored (val-apart, test); ``finetune`` overrides MEM's config; arms missing from ``scores`` are linked
    from ``linked_from``'s runs, as a variant links the base's runs it does not retrain."""
    out = root / name
    out.mkdir()
    pretrain = out / "pretrain"
    if linked_from is not None and pretrain_epochs == 200:
        pretrain.symlink_to(linked_from / "pretrain")  # the variant finetunes the base's pretraining
    else:
        write_run(pretrain, "pretrain", to_dict(PretrainStageConfig(epochs=pretrain_epochs)))
    rows = []
    for arm in ("mem", "scratch"):
        for seed in SEEDS:
            run = out / f"finetune-{arm}-labels0.1-seed{seed}"
            if arm in scores:
                config = to_dict(FinetuneStageConfig(seed=seed))
                if arm == "mem":
                    for key, value in (finetune or {}).items():
                        table, _, field = key.rpartition(".")
                        (config[table] if table else config)[field] = value
                write_run(run, "finetune", config, init=pretrain if arm == "mem" else None)
                val_apart, test = scores[arm][seed]
            else:
                run.symlink_to(linked_from / run.name)
                val_apart, test = 0.5, 0.5  # the base's own run: never compared
            rows.append({"arm": arm, "labels": 0.1, "seed": seed, "run": str(run),
                         "val_apart_top1": val_apart, "test_top1": test})  # fmt: skip
    report = {"dataset": "ncars", "headline": "test_top1", "choose_on": choose_on, "rows": rows}
    (out / "results.json").write_text(json.dumps(report))
    return out


def test_a_recipe_is_taken_on_the_choosing_split_with_what_changed_read_off_the_runs(tmp_path, monkeypatch, capsys):
    base = experiment(tmp_path, "base", {"mem": [(0.80, 0.70), (0.82, 0.72), (0.84, 0.74)],
                                         "scratch": [(0.78, 0.69)] * 3})  # fmt: skip
    # gains on val-apart and loses on test: val-apart chooses, test only checks
    flips = experiment(tmp_path, "flips", {"mem": [(0.82, 0.69), (0.83, 0.70), (0.87, 0.71)]},
                       finetune={"input.scale_jitter": 0.25}, linked_from=base)  # fmt: skip
    # a longer pretraining that loses on val-apart
    longer = experiment(tmp_path, "longer", {"mem": [(0.79, 0.75), (0.80, 0.76), (0.84, 0.77)]},
                        pretrain_epochs=400, linked_from=base)  # fmt: skip
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "recipes", str(base), str(flips), str(longer),
                                 "--out", str(tmp_path / "recipes"))  # fmt: skip
    assert status == 0, err
    result = json.loads((tmp_path / "recipes" / "recipes.json").read_text())
    assert result["choose_on"] == "val-apart"
    (taken,), (refused,) = (v["comparisons"] for v in result["variants"])  # the linked scratch runs are left out
    assert taken["arm"] == "mem" and taken["seeds"] == [0, 1, 2]
    assert taken["changes"] == {"input.scale_jitter": [0.0, 0.25]}  # seeds, paths and defaults are no change
    assert taken["splits"]["val-apart"]["per_seed"] == pytest.approx([0.02, 0.01, 0.03])
    assert taken["splits"]["test"]["gain"]["mean"] == pytest.approx(-0.02)
    assert taken["taken"] is True
    assert refused["changes"] == {"pretrain:epochs": [200, 400]}
    assert refused["splits"]["val-apart"]["gain"]["mean"] == pytest.approx(-0.01)
    assert refused["taken"] is False
    table = (tmp_path / "recipes" / "recipes.md").read_text()
    assert "| flips | MEM pretrained | 10% | 0,1,2 | input.scale_jitter 0.0 -> 0.25 | +2.0 ± 0.8 (84.0) |" in table
    assert "| -2.0 ± 0.8 (70.0) | **taken** |" in table
    assert "| longer | MEM pretrained | 10% | 0,1,2 | pretrain:epochs 200 -> 400 | -1.0 ± 0.8 (81.0) |" in table


def test_an_older_run_without_a_setting_reads_as_its_default(tmp_path, monkeypatch, capsys):
    base = experiment(tmp_path, "base", {"mem": [(0.80, 0.70)] * 3, "scratch": [(0.78, 0.69)] * 3})
    again = experiment(tmp_path, "again", {"mem": [(0.81, 0.71)] * 3}, linked_from=base)
    for seed in SEEDS:  # the base's runs were started before `teacher` existed, with `data.labels`
        path = base / f"finetune-mem-labels0.1-seed{seed}" / "config.json"
        stored = json.loads(path.read_text())
        del stored["config"]["teacher"]
        stored["config"]["data"]["labels"] = stored["config"]["data"].pop("label_fraction")
        path.write_text(json.dumps(stored))
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "recipes", str(base), str(again),
                                 "--out", str(tmp_path / "recipes"))  # fmt: skip
    assert status == 0, err
    (comparison,) = json.loads((tmp_path / "recipes" / "recipes.json").read_text())["variants"][0]["comparisons"]
    assert comparison["changes"] == {}
    assert "| again | MEM pretrained | 10% | 0,1,2 | nothing |" in (tmp_path / "recipes" / "recipes.md").read_text()


def test_experiments_chosen_or_scored_otherwise_or_with_nothing_retrained_are_refused(tmp_path, monkeypatch, capsys):
    base = experiment(tmp_path, "base", {"mem": [(0.80, 0.70)] * 3, "scratch": [(0.78, 0.69)] * 3})
    on_val = experiment(tmp_path, "on-val", {"mem": [(0.81, 0.71)] * 3}, linked_from=base, choose_on="val")
    out = str(tmp_path / "recipes")
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "recipes", str(base), str(on_val), "--out", out)
    assert status == 2
    assert f"{on_val}: its choose_on is 'val', the base's ({base}) 'val-apart'" in err
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "recipes", str(base), str(base), "--out", out)
    assert status == 2 and f"{base}: no run of the same arm, label fraction and seed" in err
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "recipes", str(base), str(tmp_path), "--out", out)
    assert status == 2 and f"{tmp_path}: no results.json" in err
    assert not (tmp_path / "recipes").exists()  # nothing written for a refused comparison
