"""Pretraining on unlabeled recordings: ingest (or point at a folder) -> tokenizer and pretraining on those recordings
beside the labelled training split -> finetuning on the labels, each run naming what it learnt from."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from test_cli_stages import TINY, TINY_TOK, TINY_VIT, mem_in_process, sets

from mem_core.datasets.ncars import NCARS_SENSOR
from mem_core.datasets.unlabeled import describe, open_unlabeled
from mem_core.train.experiment import LabelEfficiencyConfig, pretraining_config


@pytest.fixture
def recordings(tmp_path, data_dir) -> dict[str, Path]:
    """Real N-Cars recordings as a camera would leave them (one flat folder, no classes), and the same ingested."""
    folder = tmp_path / "recorded"
    folder.mkdir()
    for cls in ("cars", "background"):
        for path in sorted((data_dir / "ncars-dev" / "val-apart" / cls).iterdir())[:6]:
            shutil.copy(path, folder / f"{cls[0]}-{path.name}")
    labelled = tmp_path / "ncars"  # a few labelled samples of each split: the stages take seconds
    for split, count in (("train", 10), ("val", 4)):
        for cls in ("cars", "background"):
            (labelled / split / cls).mkdir(parents=True)
            for path in sorted((data_dir / "ncars-dev" / split / cls).iterdir())[:count]:
                (labelled / split / cls / path.name).symlink_to(path)
    return {"folder": folder, "ncars": labelled, "fixtures": data_dir / "fixtures", "more": data_dir / "ncars-dev"}


def test_record_or_ingest_then_pretrain_on_the_corpus_then_finetune_names_what_it_learnt_from(
    tmp_path, recordings, monkeypatch, capsys
):
    corpus = tmp_path / "corpus"
    status, err = mem_in_process(monkeypatch, capsys, "ingest", str(recordings["folder"]), "--out", str(corpus))
    assert status == 0, err
    stage = ["--dataset", "ncars", "--data", str(recordings["ncars"]), "--preset", "cpu-tiny"]
    unlabeled = ["--unlabeled", str(corpus), "--unlabeled", str(recordings["folder"])]
    status, err = mem_in_process(
        monkeypatch, capsys, "tokenizer", *stage, "--out", str(tmp_path / "tok"), *unlabeled, *sets(*TINY, *TINY_TOK)
    )
    assert status == 0, err
    # (the pretraining in a process of its own: test_cli_stages)
    status, err = mem_in_process(
        monkeypatch, capsys, "pretrain", *stage, "--out", str(tmp_path / "pre"), "--tokenizer", str(tmp_path / "tok"),
        "--unlabeled", str(corpus), *sets(*TINY, *TINY_VIT),
    )  # fmt: skip
    assert status == 0, err

    tok = json.loads((tmp_path / "tok" / "config.json").read_text())["pretraining_data"]
    assert tok["train_split"] == {
        "dataset": "ncars",
        "path": str(recordings["ncars"]),
        "split": "train",
        "samples": 20,
    }
    assert [(u["kind"], u["recordings"]) for u in tok["unlabeled"]] == [("corpus", 12), ("folder", 12)]
    windows = len(open_unlabeled(corpus, NCARS_SENSOR, 2000))  # a corpus gives a sample per model window (TINY's)
    assert windows > 12 and tok["samples"] == 20 + windows + 12  # a folder, a sample per file
    assert tok["unlabeled"][0]["events"] == tok["unlabeled"][1]["events"] > 0  # the same recordings, counted twice
    pre = json.loads((tmp_path / "pre" / "config.json").read_text())["pretraining_data"]
    manifest_digest = describe(corpus, NCARS_SENSOR)["digest"]
    assert [u["digest"] for u in pre["unlabeled"]] == [manifest_digest] and pre["samples"] == 20 + windows

    status, err = mem_in_process(
        monkeypatch, capsys, "finetune", *stage, "--out", str(tmp_path / "ft"), "--init", str(tmp_path / "pre"),
        *sets(*TINY, *TINY_VIT),
    )  # fmt: skip
    assert status == 0, err
    ft = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert ft["pretrained_on"]["run"] == str((tmp_path / "pre").resolve())
    assert ft["pretrained_on"]["unlabeled"][0]["digest"] == manifest_digest

    # another corpus recorded since: the digest says the data changed
    another = sorted((recordings["more"] / "val-apart" / "cars").iterdir())[6]
    status, err = mem_in_process(monkeypatch, capsys, "ingest", str(another), "--out", str(corpus))
    assert status == 0, err
    assert describe(corpus, NCARS_SENSOR)["digest"] != manifest_digest


def test_unlabeled_recordings_of_another_sensor_or_for_a_stage_that_learns_labels_are_refused_in_one_line(
    tmp_path, recordings, monkeypatch, capsys
):
    other = tmp_path / "other-camera"
    other.mkdir()
    shutil.copy(recordings["fixtures"] / "prophesee_evt2_sample.raw", other / "drive.raw")
    stage = ["--dataset", "ncars", "--data", str(recordings["ncars"]), "--preset", "cpu-tiny"]
    status, err = mem_in_process(monkeypatch, capsys, "tokenizer", *stage, "--out", str(tmp_path / "tok"),
                                 "--unlabeled", str(other), *sets(*TINY, *TINY_TOK))  # fmt: skip
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err
    assert f"{other / 'drive.raw'} is 640 x 480, the labelled data's sensor is 120 x 100" in lines[0]
    assert not (tmp_path / "tok").exists()  # nothing half-made left behind

    status, err = mem_in_process(monkeypatch, capsys, "finetune", *stage, "--out", str(tmp_path / "ft"),
                                 *sets(*TINY, *TINY_VIT, f'data.unlabeled=["{recordings["folder"]}"]'))  # fmt: skip
    assert status == 2 and "data.unlabeled: finetune learns from labels" in err and len(err.strip().splitlines()) == 1

    one_file = next(recordings["folder"].iterdir())
    status, err = mem_in_process(monkeypatch, capsys, "tokenizer", *stage, "--out", str(tmp_path / "tok"),
                                 "--unlabeled", str(one_file), *sets(*TINY, *TINY_TOK))  # fmt: skip
    assert status == 2 and f"{one_file}: unlabeled recordings must be a corpus or a folder of event files" in err


def test_a_finetuned_model_distils_into_a_student_on_unlabeled_recordings_and_the_student_names_its_teacher(
    tmp_path, recordings, monkeypatch, capsys
):
    """``mem finetune --teacher RUN --unlabeled FOLDER``: the student reads the training split without its labels and
    the unlabeled recordings, learns the teacher's predictions, is judged on the labelled validation split, says
    what taught it, and is a classifier like any other; a teacher it cannot learn from is refused in one line."""
    from mem_core.runs.rundir import RunDir

    stage = ["--dataset", "ncars", "--data", str(recordings["ncars"]), "--preset", "cpu-tiny"]
    teacher, student = tmp_path / "teacher", tmp_path / "student"
    status, err = mem_in_process(
        monkeypatch, capsys, "finetune", *stage, "--out", str(teacher), *sets(*TINY, *TINY_VIT)
    )
    assert status == 0, err
    distil = ["--teacher", str(teacher), "--unlabeled", str(recordings["folder"])]
    status, err = mem_in_process(monkeypatch, capsys, "finetune", *stage, "--out", str(student), *distil,
                                 *sets(*TINY, *TINY_VIT, "data.max_samples=0", "epochs=2"))  # fmt: skip
    assert status == 0, err
    info = json.loads((student / "config.json").read_text())
    assert info["config"]["teacher"] == str(teacher.resolve())
    read = info["distillation_data"]
    assert read["samples"] == 20 + 12 and [(u["kind"], u["recordings"]) for u in read["unlabeled"]] == [("folder", 12)]
    result = json.loads((student / "result.json").read_text())
    assert result["teacher"] == str(teacher.resolve()) and result["train_samples"] == 32
    assert result["classes"] == json.loads((teacher / "result.json").read_text())["classes"]
    records = RunDir(student).metrics()
    assert len(records) == 2 and all(0 <= r["train_agree"] <= 1 for r in records)
    out: list[str] = []
    status, err = mem_in_process(monkeypatch, capsys, "evaluate", "--model", str(student), "--dataset", "ncars",
                                 "--data", str(recordings["ncars"]), "--json", stdout=out)  # fmt: skip
    assert status == 0, err
    assert json.loads(out[-1].strip().splitlines()[-1])["top1"] == result["top1"]  # what the run reported on val

    refused = [
        (
            ["--set", "input.size=[40, 40]"],
            f"{teacher.resolve()}: the teacher's input is built otherwise (size=(32, 32))",
        ),
        (["--label-fraction", "0.5"], "data.label_fraction=0.5: a student distilled from a teacher reads every"),
        (["--teacher", str(recordings["folder"])], f"{recordings['folder']}: not a MEM run directory"),
    ]
    for extra, said in refused:
        status, err = mem_in_process(monkeypatch, capsys, "finetune", *stage, "--out", str(tmp_path / "no"), *distil,
                                     *sets(*TINY, *TINY_VIT), *extra)  # fmt: skip
        assert status == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "no").exists()


def test_the_experiment_scales_pretraining_to_the_same_steps_or_the_same_epochs(recordings):
    """``--pretrain-budget steps``: the tokenizer's and the pretraining's epochs shrink by the training split's share
    of what they read; ``epochs`` (the default) keeps the preset's epochs over every recording."""
    cfg = LabelEfficiencyConfig(
        dataset="ncars", data=str(recordings["ncars"]), preset="cpu-small", unlabeled=(str(recordings["folder"]),)
    )
    same_epochs = {stage: pretraining_config(cfg, stage) for stage in ("tokenizer", "pretrain")}
    assert same_epochs["pretrain"].epochs == 200 and same_epochs["pretrain"].data.unlabeled == cfg.unlabeled
    steps = dataclasses.replace(cfg, pretrain_budget="steps", overrides={"pretrain": ["epochs=1000"]})
    assert pretraining_config(steps, "pretrain").epochs == round(1000 * 20 / 32)
    assert pretraining_config(steps, "tokenizer").epochs == round(same_epochs["tokenizer"].epochs * 20 / 32)
    with pytest.raises(ValueError, match="pretrain_budget must be one of epochs, steps, got 'time'"):
        LabelEfficiencyConfig(pretrain_budget="time")


def test_each_seed_can_pretrain_its_own_model_and_the_curve_says_so(tmp_path, recordings, monkeypatch, capsys):
    """``--pretrain-per-seed``: seed S's MEM runs start from a tokenizer and a pretraining of their own, seeded by S,
    so the spread over seeds holds the pretraining's; the results and the curve say each seed pretrained."""
    import torch

    from mem_core.train.experiment_curve import markdown_curve, write_curve

    out = tmp_path / "exp"
    stage_sets = [*sets(*(f"all:{s}" for s in TINY)), *sets(*(f"tokenizer:{s}" for s in TINY_TOK))]
    stage_sets += [arg for stage in ("pretrain", "finetune") for arg in sets(*(f"{stage}:{s}" for s in TINY_VIT))]
    status, err = mem_in_process(
        monkeypatch, capsys, "experiment", "label-efficiency", "--dataset", "ncars", "--data", str(recordings["ncars"]),
        "--preset", "cpu-tiny", "--out", str(out), "--fractions", "1.0", "--seeds", "0,1", "--no-baselines",
        "--pretrain-per-seed", "--unlabeled", str(recordings["folder"]), *stage_sets,
    )  # fmt: skip
    assert status == 0, err
    assert not (out / "pretrain").exists() and not (out / "tokenizer").exists()
    weights = {}
    for seed in (0, 1):
        for stage in ("tokenizer", "pretrain"):
            assert json.loads((out / f"{stage}-seed{seed}" / "config.json").read_text())["config"]["seed"] == seed
        checkpoint = torch.load(out / f"pretrain-seed{seed}" / "checkpoint.pt", weights_only=True, map_location="cpu")
        weights[seed] = checkpoint["model"]
        finetuned = json.loads((out / f"finetune-mem-labels1-seed{seed}" / "config.json").read_text())
        assert finetuned["pretrained_on"]["run"] == str((out / f"pretrain-seed{seed}").resolve())
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # two pretrainings, not one twice
    pretraining = json.loads((out / "results.json").read_text())["pretraining"]
    assert pretraining["per_seed"] and set(pretraining["epochs"]) == {
        f"{stage}-seed{seed}" for stage in ("tokenizer", "pretrain") for seed in (0, 1)
    }
    drawn = write_curve([out], tmp_path / "curve")
    (point,) = drawn["points"]
    assert point["pretrain_per_seed"] and point["recordings"] == 24 and point["seeds"] == 2  # TINY: 24 samples at most
    assert "epochs, one per seed)" in markdown_curve(drawn)


def experiment_out(
    root: Path,
    name: str,
    recordings: int,
    budget: str,
    unlabeled: int,
    mem: list[float],
    distilled: list[float] = (),
    baselines: bool = True,
) -> Path:
    """A finished experiment's files as `mem experiment label-efficiency` leaves them (results.json, the pretraining
    run's config and result), with MEM's, two baselines' (unless ``--no-baselines``) and the distilled MEM's test
    top-1 per seed at 10 %."""
    out = root / name
    (out / "pretrain").mkdir(parents=True)
    (out / "pretrain" / "result.json").write_text(json.dumps({"stage": "pretrain", "train_samples": recordings}))
    (out / "pretrain" / "config.json").write_text(json.dumps({"stage": "pretrain", "config": {"epochs": 200}}))
    rows = [
        {"arm": arm, "labels": 0.1, "seed": seed, "test_top1": value}
        for arm, values in (
            ("mem", mem),
            ("scratch", [0.80, 0.82, 0.84] if baselines else []),
            ("resnet18", [0.85, 0.85, 0.85] if baselines else []),
            ("mem-distilled", distilled),
        )
        for seed, value in enumerate(values)
    ]
    described = (
        [{"path": "/c", "kind": "corpus", "digest": "d", "recordings": unlabeled, "events": 1}] if unlabeled else []
    )
    pretraining = {
        "budget": budget,
        "epochs": {"pretrain": 200 if budget == "epochs" else 67},
        "data": {"unlabeled": described},
    }
    (out / "results.json").write_text(json.dumps({"headline": "test_top1", "rows": rows, "pretraining": pretraining}))
    return out


def test_experiments_on_more_unlabeled_recordings_read_as_one_curve_beside_the_baselines(tmp_path, monkeypatch, capsys):
    outs = [
        experiment_out(tmp_path, "u3000", 3000, "epochs", 0, [0.86, 0.86, 0.86]),
        experiment_out(tmp_path, "u9000e", 9000, "epochs", 6000, [0.88, 0.90, 0.92]),
        experiment_out(tmp_path, "u9000s", 9000, "steps", 6000, [0.87, 0.87, 0.87], [0.88, 0.89, 0.90]),
    ]
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "unlabeled-curve", *map(str, outs), "--out",
                                 str(tmp_path / "curve"))  # fmt: skip
    assert status == 0, err
    result = json.loads((tmp_path / "curve" / "unlabeled_curve.json").read_text())
    points = {(p["arm"], p["recordings"], p["budget"]): p for p in result["points"]}
    assert set(points) == {  # the recipe belongs to both lines
        ("mem", 3000, "both"),
        ("mem", 9000, "epochs"),
        ("mem", 9000, "steps"),
        ("mem-distilled", 9000, "steps"),
    }
    assert points["mem", 9000, "epochs"]["mean"] == pytest.approx(0.90)
    assert points["mem", 9000, "steps"]["pretrain_epochs"] == 67
    assert points["mem-distilled", 9000, "steps"]["mean"] == pytest.approx(0.89)
    bands = {b["arm"]: b for b in result["bands"]}  # the distilled MEM saw unlabeled recordings: no band
    assert set(bands) == {"scratch", "resnet18"}
    assert bands["scratch"]["mean"] == pytest.approx(0.82) and bands["scratch"]["seeds"] == 3  # each seed once
    table = (tmp_path / "curve" / "unlabeled_curve.md").read_text()
    assert "| 10% | 9,000 | same epochs (200 epochs) | MEM pretrained | 90.0 ± 1.6 | 88.0 / 90.0 / 92.0 |" in table
    assert "| 10% | 9,000 | same steps (67 epochs) | MEM, distilled on the unlabeled | 89.0 ± 0.8 |" in table
    assert (tmp_path / "curve" / "unlabeled_curve.png").stat().st_size > 10_000

    status, err = mem_in_process(monkeypatch, capsys, "experiment", "unlabeled-curve", str(tmp_path), "--out",
                                 str(tmp_path / "curve"))  # fmt: skip
    assert status == 2 and f"{tmp_path}: no results.json" in err


def test_a_curve_grows_by_one_experiment_without_the_run_directories_of_the_earlier_ones(tmp_path, monkeypatch, capsys):
    """The curve's JSON is a source: a point pretrained on 4,500 recordings, MEM alone (--no-baselines), joins the
    points and bands of experiments whose directories are gone."""
    outs = [
        experiment_out(tmp_path, "u3000", 3000, "epochs", 0, [0.86, 0.86, 0.86]),
        experiment_out(tmp_path, "u9000s", 9000, "steps", 6000, [0.87, 0.87, 0.87], [0.88, 0.89, 0.90]),
    ]
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "unlabeled-curve", *map(str, outs), "--out",
                                 str(tmp_path / "first"))  # fmt: skip
    assert status == 0, err
    earlier = tmp_path / "first" / "unlabeled_curve.json"
    for out in outs:
        shutil.rmtree(out)
    u4500 = experiment_out(tmp_path, "u4500s", 4500, "steps", 1500, [0.83, 0.86, 0.89], baselines=False)
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "unlabeled-curve", str(earlier), str(u4500),
                                 "--out", str(tmp_path / "grown"))  # fmt: skip
    assert status == 0, err
    result = json.loads((tmp_path / "grown" / "unlabeled_curve.json").read_text())
    points = {(p["arm"], p["recordings"]): p["mean"] for p in result["points"]}
    assert points == pytest.approx({("mem", 3000): 0.86, ("mem", 4500): 0.86, ("mem", 9000): 0.87,
                                    ("mem-distilled", 9000): 0.89})  # fmt: skip
    bands = {b["arm"]: b for b in result["bands"]}  # from the earlier experiments: u4500s trained none
    assert set(bands) == {"scratch", "resnet18"} and bands["scratch"]["seeds"] == 3
    assert (bands["scratch"]["mean"], bands["resnet18"]["mean"]) == pytest.approx((0.82, 0.85))
    table = (tmp_path / "grown" / "unlabeled_curve.md").read_text()
    assert "| 10% | 4,500 | same steps (67 epochs) | MEM pretrained | 86.0 ± 2.4 |" in table

    # the same experiment read again takes the place of its copy in the earlier curve
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "unlabeled-curve",
                                 str(tmp_path / "grown" / "unlabeled_curve.json"), str(u4500),
                                 "--out", str(tmp_path / "again"))  # fmt: skip
    assert status == 0, err
    again = json.loads((tmp_path / "again" / "unlabeled_curve.json").read_text())
    assert [e["recordings"] for e in again["experiments"]] == [3000, 4500, 9000]

    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    status, err = mem_in_process(monkeypatch, capsys, "experiment", "unlabeled-curve", str(tmp_path / "other.json"),
                                 "--out", str(tmp_path / "bad"))  # fmt: skip
    assert status == 2 and f"{tmp_path / 'other.json'}: not an unlabeled curve" in err and err.count("\n") <= 1
