"""The three MEM stages and the baselines, end to end on tiny models (simulated camera data, CPU)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from mem_core.configuration import ConfigError
from mem_core.events import SensorSize
from mem_core.runs.export import export_run, load_model, load_tokenizer
from mem_core.runs.lineage import pretraining_run_of, source_run, tokenizer_of
from mem_core.runs.rundir import RunDir, RunError, load_checkpoint
from mem_core.train import finetune, pretrain, segment, tokenizer
from mem_core.train.configs import stage_config
from mem_core.train.engine import NonFiniteLossError
from mem_core.train.evaluate import evaluate_run

TINY_INPUT = ["input.size=[32, 32]", "input.n_max=3000", "input.shift_px=2", "data.num_workers=0"]
TINY_VIT = ["model.patch_size=8", "model.embed_dim=32", "model.depth=2", "model.num_heads=2"]


def config(stage: str, *extra: str, dataset: str = "sim", max_samples: int = 40):
    overrides = [*TINY_INPUT, "epochs=1", "batch_size=8", f"data.max_samples={max_samples}"]
    if stage != "tokenizer":
        overrides += TINY_VIT
    else:
        overrides += ["model.num_layers=3", "model.num_tokens=64", "model.hidden_dim=16", "model.codebook_dim=8"]
    overrides += extra
    return stage_config(stage, preset="cpu-tiny", values={"data.dataset": dataset}, overrides=overrides)


@pytest.fixture(scope="module")
def tokenizer_run(tmp_path_factory):
    return tokenizer.run(config("tokenizer", "epochs=2"), tmp_path_factory.mktemp("runs") / "tok").path


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory, tokenizer_run):
    out = tmp_path_factory.mktemp("runs") / "pre"
    return pretrain.run(config("pretrain", "epochs=2"), out, tokenizer=tokenizer_run).path


def test_tokenizer_run_writes_metrics_and_pictures(tokenizer_run):
    records = RunDir(tokenizer_run).metrics()
    assert [r["epoch"] for r in records] == [0, 1]
    last = records[-1]
    assert 0 < last["val_codebook_usage"] <= 1 and last["val_perplexity"] >= 1 and last["val_recon_mse"] >= 0
    for name in ("reconstructions.png", "codebook.png", "curves.png", "checkpoint.pt", "config.json"):
        assert (tokenizer_run / name).is_file(), name


def test_pretrain_predicts_masked_tokens(pretrain_run):
    records = RunDir(pretrain_run).metrics()
    assert len(records) == 2
    assert 0 <= records[-1]["val_acc"] <= 1
    # the loss is a cross-entropy over a 64-token codebook: it starts near log(64) and must fall
    assert records[-1]["train_loss"] < np.log(64)
    assert (pretrain_run / "predictions.png").is_file()
    state = load_checkpoint(pretrain_run / "checkpoint.pt")["model"]
    assert "lm_head.weight" in state and state["lm_head.weight"].shape[0] == 64


def test_pretraining_on_the_patches_with_events_predicts_those_only(tmp_path, tokenizer_run, monkeypatch, data_dir):
    """``mask_empty=false``: in every step and validation, the predicted patches are the masked patches with events,
    ``mask_ratio`` of each window's patches with events; the run says so in its config. On N-Cars windows, where
    most patches are empty (the simulated camera's noise reaches nearly every patch)."""
    from mem_core.models.vit import MEMPretrainModel

    ncars = f"data.path={data_dir / 'ncars-dev'}"
    cfg = config("pretrain", "mask_empty=false", "mask_ratio=0.5", ncars, dataset="ncars")
    calls, forward = [], MEMPretrainModel.forward

    def spy(model, x, mask, targets, masked=None):
        calls.append((x.detach(), mask.cpu(), masked.cpu()))
        return forward(model, x, mask, targets, masked)

    monkeypatch.setattr(MEMPretrainModel, "forward", spy)
    run = pretrain.run(cfg, tmp_path / "pre", tokenizer=tokenizer_run)
    assert len(calls) > 5 and all(np.isfinite(r["train_loss"]) for r in RunDir(run.path).metrics())
    grid = pretrain.PretrainStage.configure(cfg).model.grid_size  # the ViT's grid, made to fit the input
    empty = []
    for x, mask, masked in calls:
        occupied = pretrain.patch_occupancy(x, grid)
        assert torch.equal(masked, (mask & occupied).flatten().nonzero()[:, 0])
        assert torch.equal((mask & occupied).sum(1), (0.5 * occupied.sum(1)).round().long())
        empty.append(float((~occupied).float().mean()))
    assert 0.1 < np.mean(empty) < 0.9, empty  # N-Cars windows leave many patches empty
    assert json.loads((run.path / "config.json").read_text())["config"]["mask_empty"] is False
    with pytest.raises(ConfigError, match="mask_empty=false is MEM's"):
        config("pretrain", "method=emae", "mask_empty=false")


def test_finetune_from_pretraining_starts_from_its_weights(tmp_path, pretrain_run):
    pre = load_checkpoint(pretrain_run / "checkpoint.pt")["model"]
    run = finetune.run(config("finetune", "lr=0", "min_lr=0", "warmup_epochs=0"), tmp_path / "ft0", init=pretrain_run)
    model, meta = load_model(run.path)
    block = model.blocks[0].attn.qkv.weight
    assert torch.equal(block, pre["backbone.blocks.0.attn.qkv.weight"])
    assert meta["classes"] == ["disc", "square", "triangle", "cross", "ring"]


def test_finetune_evaluate_export_roundtrip(tmp_path, pretrain_run, tokenizer_run):
    run = finetune.run(config("finetune", "epochs=2"), tmp_path / "ft", init=pretrain_run)
    result = json.loads((run.path / "result.json").read_text())
    assert result["split"] == "val" and result["n"] == 200 and 0 <= result["top1"] <= 1
    assert (run.path / "confusion.png").is_file() and (run.path / "best.pt").is_file()
    evaluated = evaluate_run(run.path, "sim", None, "val", batch_size=16)
    assert evaluated["top1"] == pytest.approx(result["top1"])  # deterministic evaluation, same model
    assert evaluated["n"] == 200
    export_dir = export_run(run.path, tmp_path / "export")
    model, meta = load_model(export_dir)
    assert meta["task"] == "classification" and meta["classes"] == result["classes"]
    assert tokenizer_of(export_dir) == export_dir  # the MEM tokenizer travels with the export for the token overlay
    # the lineage `mem serve` follows to finetune a served model on labelled windows
    assert source_run(export_dir) == run.path.resolve()
    assert pretraining_run_of(export_dir) == pretraining_run_of(run.path) == pretrain_run.resolve()
    assert tokenizer_of(run.path) == tokenizer_of(pretrain_run) == tokenizer_run.resolve()
    assert load_tokenizer(export_dir).config.num_tokens == 64
    x = torch.rand(2, 2, 32, 32)
    reference, _ = load_model(run.path)
    assert torch.allclose(model(x), reference(x))


def test_a_cnn_run_evaluates_exports_and_serves_like_the_vit(tmp_path, pretrain_run):
    """The yardstick CNN (``arch``) trains through the finetuning stage into a run that `mem evaluate`, `mem export`
    and the live path's Predictor take like any other; it cannot start from a pretraining run or be probed."""
    from mem_core.inference import Predictor

    run = finetune.run(config("finetune", "arch=resnet10t"), tmp_path / "cnn")
    result = json.loads((run.path / "result.json").read_text())
    assert evaluate_run(run.path, "sim", None, "val")["top1"] == pytest.approx(result["top1"])
    export_dir = export_run(run.path, tmp_path / "export")
    model, meta = load_model(export_dir)
    assert meta["arch"] == "resnet10t" and tokenizer_of(export_dir) is None
    x = torch.rand(2, 2, 32, 32)
    reference, _ = load_model(run.path)
    assert torch.allclose(model(x), reference(x))
    predictor = Predictor(export_dir)
    out = predictor(predictor_window(), SensorSize(128, 128))
    assert out.probs.shape == (5,) and out.tokens is None and out.stages_ms["model"] > 0
    with pytest.raises(RunError, match="a pretraining run initialises a ViT; arch='resnet10t'"):
        finetune.run(config("finetune", "arch=resnet10t"), tmp_path / "cnn-init", init=pretrain_run)
    with pytest.raises(ConfigError, match="probe: a linear probe reads a pretrained ViT"):
        config("finetune", "arch=resnet10t", "probe=true")


def predictor_window() -> np.ndarray:
    from mem_core.events import make_events

    rng = np.random.default_rng(0)
    n = 2000
    return make_events(np.arange(n), rng.integers(0, 128, n), rng.integers(0, 128, n), rng.integers(0, 2, n))


def test_each_arm_of_the_experiment_takes_its_own_overrides_after_the_shared_ones():
    from mem_core.train.experiment import LabelEfficiencyConfig, finetune_config

    overrides = {"finetune": ["lr=0.01", "epochs=7"], "mem": ["layer_decay=0.5"], "yardstick": ["lr=0.02"]}
    cfg = LabelEfficiencyConfig(dataset="sim", preset="cpu-tiny", overrides=overrides)
    mem, scratch, cnn = (finetune_config(cfg, arm, 1.0, 0) for arm in ("mem", "scratch", "resnet18"))
    assert (mem.layer_decay, mem.lr, mem.epochs) == (0.5, 0.01, 7)
    assert (scratch.layer_decay, scratch.lr, scratch.epochs) == (1.0, 0.01, 7)  # no layer decay from scratch
    assert (cnn.arch, cnn.lr, cnn.epochs, cnn.betas) == ("resnet18", 0.02, 7, (0.9, 0.999))
    decayed = LabelEfficiencyConfig(dataset="sim", preset="cpu-tiny", overrides={"scratch": ["layer_decay=0.75"]})
    assert finetune_config(decayed, "scratch", 1.0, 0).layer_decay == 0.75  # an earlier recipe, asked for


def test_the_distilled_arm_learns_from_the_mem_run_of_its_labels_on_every_recording_with_the_same_steps(tmp_path):
    """``--distill``: the student of (fraction, seed) is taught by MEM's run of the same fraction and seed, reads the
    training split without labels and the unlabeled recordings, takes MEM's recipe then its own overrides, and draws
    as many samples an epoch as the training split holds, so it takes the other arms' steps."""
    from mem_core.train.experiment import LabelEfficiencyConfig, finetune_config, training_split

    overrides = {"finetune": ["epochs=7"], "mem": ["layer_decay=0.5", "lr=0.01"], "mem-distilled": ["lr=0.02"]}
    cfg = LabelEfficiencyConfig(
        dataset="sim", preset="cpu-tiny", out=str(tmp_path), overrides=overrides, distill=True, unlabeled=("rec",)
    )
    assert cfg.arms == ("mem", "scratch", "resnet18", "mem-distilled")
    student = finetune_config(cfg, "mem-distilled", 0.1, 2)
    assert student.teacher == str((tmp_path / "finetune-mem-labels0.1-seed2").resolve())
    assert (student.layer_decay, student.lr, student.epochs, student.seed) == (0.5, 0.02, 7, 2)
    assert student.data.label_fraction == 1.0 and student.data.unlabeled == ("rec",)
    mem = finetune_config(cfg, "mem", 0.1, 2)
    assert student.data.epoch_samples == mem.data.epoch_samples == len(training_split(mem)) > 0


def test_a_label_fraction_trains_the_steps_and_validations_of_all_labels():
    """A run on a fraction of the labels takes the epochs, steps and validations of the run on all of them: an epoch
    of 300 or 30 labelled samples draws 3,000 (46 steps of 64, as all labels make), in passes over the labelled
    samples that each draw their own order and augmentations."""
    from mem_core.datasets import EventSource
    from mem_core.train.data import EpochBatchSampler
    from mem_core.train.experiment import equal_steps

    class Labels(EventSource):
        name, classes, labels = "labels", ["a", "b"], np.repeat([0, 1], 1500)

        def load(self, index):
            raise AssertionError("counting steps reads no events")

    base = stage_config("finetune", overrides=["epochs=20", "eval_every=4", "warmup_epochs=2", "batch_size=64"])
    for fraction, labelled in ((1.0, 3000), (0.1, 300), (0.01, 30)):
        cfg = equal_steps(
            dataclasses.replace(base, data=dataclasses.replace(base.data, label_fraction=fraction)), Labels()
        )
        assert (cfg.epochs, cfg.eval_every, cfg.warmup_epochs) == (20, 4, 2)
        sampler = EpochBatchSampler(
            labelled, 64, seed=0, shuffle=True, drop_last=True, epoch_samples=cfg.data.epoch_samples
        )
        sampler.set_epoch(3)
        batches = list(sampler)
        assert len(sampler) == len(batches) == 46
        pairs = [pair for batch in batches for pair in batch]
        passes = -(-3000 // labelled)
        keys = {key for _, key in pairs}  # a key per pass, none shared with another epoch's
        assert keys <= set(range(3 * passes, 4 * passes)) and len(keys) >= passes - 1
        counts = np.bincount([i for i, _ in pairs], minlength=labelled)
        assert counts.min() >= passes - 2 and counts.max() <= passes  # every labelled sample in (almost) every pass


@pytest.mark.slow  # loader worker processes
def test_a_training_stream_draws_each_epoch_s_batches_while_the_last_epoch_ends():
    """The training loader is read on from one iterator across epochs (its workers build the next epoch's first
    batches before it is asked for): every epoch's batches are those of a loader started for that epoch alone, and
    an epoch out of turn (a resumed run) starts afresh."""
    from mem_core.datasets import open_source
    from mem_core.representation import InputSpec
    from mem_core.train.data import EpochStream, build_loader
    from mem_core.train.runtime import Runtime

    source = open_source("sim", None, "val")
    spec = InputSpec(n_max=400, size=(32, 32), event_drop_p=0.5, hflip_p=0.5, shift_px=4)

    def loader(workers):
        return build_loader(
            source, spec, train=True, seed=1, batch_size=8, runtime=Runtime(torch.device("cpu")), num_workers=workers
        )

    def drawn(batches):
        return [(b.x.clone(), b.y.clone(), b.lengths.clone(), labels.clone()) for b, labels, _ in batches]

    alone, alone_sampler = loader(0)
    expected = {}
    for epoch in (0, 1, 2, 6):
        alone_sampler.set_epoch(epoch)
        expected[epoch] = drawn(alone)
    streamed, sampler = loader(2)
    stream = EpochStream(streamed, sampler)
    try:
        for epoch in (0, 1, 2, 6):
            stream.set_epoch(epoch)
            got = drawn(stream)
            assert len(got) == len(stream) == len(expected[epoch]) > 1
            for a, b in zip(got, expected[epoch], strict=True):
                assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True)), epoch
    finally:
        streamed.close()


def test_a_time_limit_stops_a_run_after_the_epoch_that_passes_it(tmp_path):
    """``time_limit_s`` ends a run at the first epoch boundary past the limit, validated and kept there, and the
    result says the run was cut short (a budgeted GPU call reports what its caps cut)."""
    run = finetune.run(config("finetune", "epochs=4", "eval_every=4", "time_limit_s=0.001"), tmp_path / "cut")
    result = json.loads((run.path / "result.json").read_text())
    assert result["cut_short"] and result["epochs_run"] == 1 and result["best_epoch"] == 0
    assert [r["epoch"] for r in RunDir(run.path).metrics()] == [0] and "val_top1" in RunDir(run.path).metrics()[0]
    whole = finetune.run(config("finetune", "epochs=2"), tmp_path / "whole")
    assert not json.loads((whole.path / "result.json").read_text())["cut_short"]


def test_l2_sp_keeps_finetuned_weights_near_the_pretrained_ones(tmp_path, pretrain_run):
    """``l2_sp`` pulls every weight but the new head towards where finetuning started: the same run moves the
    pretrained blocks less with it than without."""
    pre = load_checkpoint(pretrain_run / "checkpoint.pt")["model"]["backbone.blocks.0.mlp.fc1.weight"]
    moved = {}
    for weight in (0.0, 200.0):
        cfg = config("finetune", "epochs=2", "lr=0.01", "weight_decay=0", f"l2_sp={weight}")
        model, _ = load_model(finetune.run(cfg, tmp_path / f"ft-{weight}", init=pretrain_run).path)
        moved[weight] = (model.blocks[0].mlp.fc1.weight - pre).norm().item()
    assert moved[200.0] < 0.5 * moved[0.0]


def test_frozen_layers_keep_the_stem_and_lower_blocks_as_pretrained_and_the_rest_moves(tmp_path, pretrain_run):
    """``frozen_layers=2``: the stem and the first block stay as pretraining left them, the blocks above and the
    head learn."""
    pre = load_checkpoint(pretrain_run / "checkpoint.pt")["model"]
    cfg = config("finetune", "epochs=2", "lr=0.01", "frozen_layers=2")
    model, _ = load_model(finetune.run(cfg, tmp_path / "ft", init=pretrain_run).path)
    tuned = model.state_dict()
    stem = [k for k in tuned if k.startswith(("patch_embed.", "blocks.0.", "cls_token", "pos_embed"))]
    assert stem and all(torch.equal(tuned[k], pre[f"backbone.{k}"]) for k in stem)
    assert not torch.equal(tuned["blocks.1.mlp.fc1.weight"], pre["backbone.blocks.1.mlp.fc1.weight"])
    with pytest.raises(ConfigError, match="frozen_layers must be at most the depth"):
        config("finetune", "frozen_layers=99")


def test_a_malformed_lineage_link_is_an_error_naming_it(tmp_path):
    run = tmp_path / "ft"
    run.mkdir()
    assert pretraining_run_of(run) is None and tokenizer_of(run) is None  # trained from scratch: no link, no error
    (run / "init.json").write_text('{"path": 3}')
    with pytest.raises(RunError, match=r"ft/init\.json: no 'path'"):
        pretraining_run_of(run)
    (run / "init.json").write_text("{truncated")
    with pytest.raises(RunError, match=r"ft/init\.json: not valid JSON"):
        tokenizer_of(run)


def test_distillation_leaves_a_student_that_matches_its_teacher_alone_and_pulls_another_toward_it(tmp_path):
    """A distillation step's loss is the student's tempered cross-entropy against the teacher's probabilities on the
    same input: a student that predicts what the teacher does gets no gradient and agrees everywhere, and a step
    down the gradient of another student brings its predictions nearer the teacher's."""
    import copy

    import torch.nn.functional as F

    from mem_core.datasets import WindowDataset, collate_windows, open_source
    from mem_core.train.finetune import FinetuneStage
    from mem_core.train.runtime import Runtime

    t = 2.0
    cfg = FinetuneStage.configure(
        config("finetune", "teacher=teacher", f"distill_temperature={t}", "model.drop_path=0")
    )
    source = open_source("sim", None, "train")
    windows = WindowDataset(source, cfg.input, train=True, seed=0)
    events, _, _ = collate_windows([windows[(i, 0)] for i in range(8)], source.sensor)
    stage = FinetuneStage(cfg, Runtime(torch.device("cpu")), RunDir(tmp_path / "run"))
    stage.classes = source.classes
    torch.manual_seed(0)
    stage.teacher = stage.build_model().eval().requires_grad_(False)
    x = stage.train_inputs(events, 0, 0)[0]  # what the step builds from the batch, the teacher and student alike

    def distance(student) -> float:  # KL(teacher || student) at the temperature, over the batch
        with torch.no_grad():
            p, q = (F.log_softmax(m(x) / t, -1) for m in (stage.teacher, student))
        return F.kl_div(q, p, log_target=True, reduction="batchmean").item()

    same = copy.deepcopy(stage.teacher).requires_grad_(True)
    result = stage.distil_step(same, (events, None, None), 0, 0)
    result.loss.backward()
    assert result.metrics["agree"].item() == 1.0
    grads = [p.grad for p in same.parameters() if p.grad is not None]
    assert len(grads) > 10 and max(g.abs().max().item() for g in grads) < 1e-6

    torch.manual_seed(1)
    other = stage.build_model().eval()
    before = distance(other)
    result = stage.distil_step(other, (events, None, None), 0, 0)
    result.loss.backward()
    with torch.no_grad():
        for p in other.parameters():
            if p.grad is not None:
                p -= 1e-2 * p.grad
    assert before > 1e-3 and distance(other) < before


def test_linear_probe_trains_only_the_head(tmp_path, pretrain_run):
    cfg = config("finetune", "probe=true", "lr=0.01")
    run = finetune.run(cfg, tmp_path / "probe", init=pretrain_run)
    pre = load_checkpoint(pretrain_run / "checkpoint.pt")["model"]
    model, _ = load_model(run.path)
    assert torch.equal(model.blocks[1].mlp.fc1.weight, pre["backbone.blocks.1.mlp.fc1.weight"])
    assert model.head.weight.abs().sum() > 0


@pytest.mark.parametrize("loss_on", ["masked", "all"])
def test_emae_baseline_pretrains_and_finetunes(tmp_path, loss_on):
    absolute = ["model.abs_pos_emb=true", "model.rel_pos_bias=false"]  # MAE: the encoder sees the visible patches
    cfg = config("pretrain", "method=emae", f"emae_loss={loss_on}", "emae_decoder=[32, 1, 2]", *absolute)
    run = pretrain.run(cfg, tmp_path / "emae", tokenizer=None)
    records = RunDir(run.path).metrics()
    assert records[-1]["val_loss"] >= 0 and (run.path / "predictions.png").is_file()
    ft = finetune.run(
        config("finetune", "lr=0", "min_lr=0", "warmup_epochs=0", *absolute), tmp_path / "ft", init=run.path
    )
    pre = load_checkpoint(run.path / "checkpoint.pt")["model"]
    model, _ = load_model(ft.path)
    assert torch.equal(model.blocks[0].attn.qkv.weight, pre["backbone.blocks.0.attn.qkv.weight"])
    assert torch.equal(model.pos_embed, pre["backbone.pos_embed"])  # the sine-cosine positions, learnable from here


def test_emae_with_a_relative_position_bias_is_a_clear_error(tmp_path):
    with pytest.raises(RunError, match=r"abs_pos_emb=true and model\.rel_pos_bias=false"):
        pretrain.run(config("pretrain", "method=emae"), tmp_path / "emae", tokenizer=None)


@pytest.mark.parametrize(("channels", "in_chans"), [("temporal", 8), ("timestamp", 3)])
def test_input_variants_train_from_scratch(tmp_path, channels, in_chans):
    run = finetune.run(config("finetune", f"input.channels={channels}"), tmp_path / channels)
    model, _ = load_model(run.path)
    assert model.patch_embed.proj.in_channels == in_chans


def test_segmentation_on_simulated_labels(tmp_path):
    cfg = config("segment", "model.depth=4", "head_channels=16")
    run = segment.run(cfg, tmp_path / "seg")
    result = json.loads((run.path / "result.json").read_text())
    assert result["classes"][0] == "background" and len(result["classes"]) == 6
    for key in ("miou", "macc", "aacc"):
        assert 0 <= result[key] <= 1
    evaluated = evaluate_run(run.path, "sim", None, "val")
    assert evaluated["miou"] == pytest.approx(result["miou"])


def test_segmentation_refuses_the_extent_crop_before_it_trains(tmp_path):
    with pytest.raises(RunError, match=r'segmentation needs input\.crop = "sensor"'):
        segment.run(config("segment", "model.depth=4", "input.crop=extent"), tmp_path / "seg")
    assert not (tmp_path / "seg" / "checkpoint.pt").exists()


class Interrupted(Exception):
    pass


def interrupted_after_first_epoch(monkeypatch, train) -> None:
    """Call ``train()`` as a process that dies right after epoch 0's checkpoint was written."""
    from mem_core.runs import rundir

    save_checkpoint = rundir.RunDir.save_checkpoint

    def crash_after_first_epoch(self, state, best=False):
        save_checkpoint(self, state, best=best)
        if not best:
            assert state["epoch"] == 0  # (the test's run has more epochs)
            raise Interrupted

    monkeypatch.setattr(rundir.RunDir, "save_checkpoint", crash_after_first_epoch)
    with pytest.raises(Interrupted):
        train()
    monkeypatch.undo()


def assert_same_weights(a: RunDir, b: RunDir) -> None:
    """The two runs' last checkpoints hold the same weights, bit for bit."""
    wa = load_checkpoint(a.path / "checkpoint.pt")["model"]
    wb = load_checkpoint(b.path / "checkpoint.pt")["model"]
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


@pytest.mark.parametrize(
    "augmentations", [(), ("mixup=0.8", "cutmix=1.0", "input.event_drop_p=0.5")], ids=["plain", "mixup-cutmix-drop"]
)
def test_resume_reproduces_the_uninterrupted_run(tmp_path, monkeypatch, augmentations):
    """Bit-exact with the default loader workers (persistent worker processes started in a later epoch), with every
    random augmentation of finetuning too."""
    settings = ("epochs=2", "data.num_workers=2", *augmentations)
    full = finetune.run(config("finetune", *settings), tmp_path / "full")
    interrupted_after_first_epoch(
        monkeypatch, lambda: finetune.run(config("finetune", *settings), tmp_path / "interrupted")
    )
    resumed = finetune.run(config("finetune", *settings), tmp_path / "interrupted", resume=True)
    assert_same_weights(full, resumed)
    assert [r["epoch"] for r in RunDir(resumed.path).metrics()] == [0, 1]
    assert json.loads((full.path / "result.json").read_text())["top1"] == pytest.approx(
        json.loads((resumed.path / "result.json").read_text())["top1"]
    )


def test_resume_of_pretraining_reproduces_the_uninterrupted_run(tmp_path, monkeypatch, tokenizer_run):
    """What ``mem demo`` and ``--resume`` rely on after a Ctrl-C: MEM pretraining (block masks, augmentations,
    loader workers) continued from an epoch checkpoint ends with the same weights bit for bit."""

    def train(out: Path, resume: bool = False):
        cfg = config("pretrain", "epochs=2", "data.num_workers=2")
        return pretrain.run(cfg, out, tokenizer=tokenizer_run, resume=resume)

    full = train(tmp_path / "full")
    interrupted_after_first_epoch(monkeypatch, lambda: train(tmp_path / "interrupted"))
    resumed = train(tmp_path / "interrupted", resume=True)
    assert_same_weights(full, resumed)
    assert [r["epoch"] for r in RunDir(resumed.path).metrics()] == [0, 1]


def test_a_run_resumes_on_a_cpu_with_or_without_bf16(tmp_path, monkeypatch):
    """``cpu_bf16`` is how fast a CPU steps, as the device is: a run (``mem demo``'s, which turns it on where the CPU
    has native bf16) started without it goes on with it and finishes, where another setting would be refused."""
    interrupted_after_first_epoch(
        monkeypatch, lambda: finetune.run(config("finetune", "epochs=2", "cpu_bf16=false"), tmp_path / "ft")
    )
    with pytest.raises(RunError, match="differs in"):
        finetune.run(config("finetune", "epochs=2", "lr=0.5"), tmp_path / "ft", resume=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CPU without native bf16 says it trains in fp32
        run = finetune.run(config("finetune", "epochs=2", "cpu_bf16=true"), tmp_path / "ft", resume=True)
    assert [r["epoch"] for r in run.metrics()] == [0, 1] and run.finished


def test_mixup_needs_an_even_batch_per_process(tmp_path):
    with pytest.raises(RunError, match="batch_size 7 over 1 process"):
        finetune.run(config("finetune", "batch_size=7", "cutmix=1.0"), tmp_path / "odd")


def test_existing_run_needs_resume(tmp_path):
    finetune.run(config("finetune"), tmp_path / "ft")
    with pytest.raises(RunError, match="already holds a finetune run"):
        finetune.run(config("finetune"), tmp_path / "ft")


def test_checkpoints_at_most_once_per_interval_and_always_after_the_last_epoch(tmp_path, monkeypatch):
    saved = []
    real = RunDir.save_checkpoint
    monkeypatch.setattr(
        RunDir,
        "save_checkpoint",
        lambda self, state, best=False: (best or saved.append(state["epoch"]), real(self, state, best)),
    )
    finetune.run(config("finetune", "epochs=4", "checkpoint_every_s=3600"), tmp_path / "ft")
    assert saved == [0, 3]  # the first epoch (none before it), then the interval holds them back until the last
    assert load_checkpoint(tmp_path / "ft" / "checkpoint.pt")["epoch"] == 3


def test_a_run_started_before_a_setting_existed_resumes_with_its_default(tmp_path):
    """A run directory written before a setting existed lacks it in config.json: --resume takes it as the default it
    ran with, and refuses another value; its data folder named relative or absolute is the same folder."""
    cfg = config("finetune", "epochs=2")
    run = finetune.run(dataclasses.replace(cfg, epochs=1), tmp_path / "ft")
    (run.path / "result.json").unlink()
    stored = json.loads(run.config_path.read_text())
    stored["config"]["epochs"] = 2  # the run was started for 2 epochs and stopped after its first
    del stored["config"]["data"]["epoch_samples"], stored["config"]["time_limit_s"]
    stored["config"]["data"]["labels"] = stored["config"]["data"].pop("label_fraction")  # its former name
    run.config_path.write_text(json.dumps(stored))
    with pytest.raises(RunError, match=r"differs in data.epoch_samples \(0 -> 7\)"):
        finetune.run(
            dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, epoch_samples=7)), run.path, resume=True
        )
    elsewhere = tmp_path / "data"
    elsewhere.mkdir()
    relative = os.path.relpath(elsewhere)  # the same folder named from here, as it was named when the run started
    stored["config"]["data"]["path"] = relative
    run.config_path.write_text(json.dumps(stored))
    moved = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(elsewhere.resolve())))
    with pytest.raises(RunError, match=r"differs in data.path"):  # the sim dataset takes no path: a real difference
        finetune.run(
            dataclasses.replace(moved, data=dataclasses.replace(moved.data, path=str(tmp_path))), run.path, resume=True
        )
    finetune.run(moved, run.path, resume=True)
    assert [r["epoch"] for r in RunDir(run.path).metrics()] == [0, 1]


def test_non_finite_loss_stops_with_a_clear_error(tmp_path):
    with pytest.raises(NonFiniteLossError, match=r"loss is (nan|inf) at epoch 0"):
        finetune.run(config("finetune", "lr=1e30", "warmup_epochs=0", "grad_clip=0"), tmp_path / "nan")


def test_evaluating_a_corpus_sees_the_samples_training_validated_on(tmp_path):
    """``mem evaluate`` on a labelled corpus reads it in model windows, as the run's own validation did."""
    from conftest import synthetic_events

    from mem_core.corpus import CorpusWriter
    from mem_core.events import SensorSize

    sensor = SensorSize(32, 32)
    corpus = tmp_path / "corpus"
    with CorpusWriter(corpus) as writer:
        for k, label in enumerate(["cars", "background"] * 2):
            writer.add_recording(f"r{k}", synthetic_events(60_000, sensor, seed=k), sensor, label=label)
    run = finetune.run(config("finetune", f"data.path={corpus}", dataset="corpus", max_samples=16), tmp_path / "ft")
    validated = RunDir(run.path).metrics()[-1]
    result = evaluate_run(run.path, "corpus", corpus, "val")
    assert result["n"] == 2 * 60_000 // 3000  # the last recording of each class, in 3000-event windows, not one
    assert result["top1"] == pytest.approx(validated["val_top1"])


def test_every_stage_writes_its_result_last(tokenizer_run, pretrain_run):
    for run, stage in ((tokenizer_run, "tokenizer"), (pretrain_run, "pretrain")):
        result = json.loads((run / "result.json").read_text())
        assert result["stage"] == stage and result["epoch"] == 1 and RunDir(run).finished
        assert result == {**result, **{k[4:]: v for k, v in RunDir(run).metrics()[-1].items() if k.startswith("val_")}}


def test_finetuning_never_silently_replaces_the_architecture(tmp_path, pretrain_run):
    with pytest.raises(RunError, match=r"pretrained with depth=2, this finetune run would build depth=3"):
        finetune.run(config("finetune", "model.depth=3"), tmp_path / "ft", init=pretrain_run)
    assert not (tmp_path / "ft").exists()  # refused before anything was written


def test_the_steps_generator_drives_cpu_draws_whatever_the_device():
    # A CUDA generator cannot drive torch.randint on the CPU (RandAugment's plan, the random crop): every paper
    # preset failed at its first batch on a GPU. The step's generator lives on the CPU whatever the model's device.
    from mem_core.train.common import batch_generator
    from mem_core.train.runtime import Runtime

    cfg = config("finetune")
    for device in ("cpu", "cuda"):
        g = batch_generator(cfg, Runtime(device=torch.device(device)), epoch=1, step=2)
        assert g.device.type == "cpu"
        assert (
            torch.randint(3, (2,), generator=g).tolist()
            == torch.randint(
                3, (2,), generator=batch_generator(cfg, Runtime(device=torch.device("cpu")), 1, 2)
            ).tolist()
        )


def test_accumulated_micro_batches_step_like_the_whole_batch():
    # accum_steps keeps a recipe whose batch does not fit the device (paper-ncars finetunes 1024 ViT-B/16 windows:
    # 84 GiB, over an 80 GB H100): the micro-batches' gradients, weighted by their share, are the whole batch's
    from mem_core.train.engine import StepResult, train_one_epoch
    from mem_core.train.runtime import Runtime

    data, labels = torch.randn(8, 5, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 3
    seen: dict[int, list[tuple[int, int]]] = {}

    def train(accum: int) -> torch.Tensor:
        torch.manual_seed(1)
        model = torch.nn.Linear(5, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

        def step_fn(batch, draw):
            seen.setdefault(accum, []).append((len(batch[0]), draw))
            return StepResult(torch.nn.functional.cross_entropy(model(batch[0]), batch[1]), {}, len(batch[0]))

        stats = train_one_epoch(
            model=model,
            loader=[(data, labels, None)] * 2,
            step_fn=step_fn,
            optimizer=optimizer,
            runtime=Runtime(torch.device("cpu")),
            epoch=0,
            epochs=1,
            steps_per_epoch=2,
            accum_steps=accum,
        )
        assert np.isfinite(stats["loss"])
        return model.weight.detach()

    whole = train(1)
    for accum in (2, 3):
        torch.testing.assert_close(train(accum), whole, rtol=1e-5, atol=1e-6)
    assert seen[3] == [(3, 0), (3, 1), (2, 2), (3, 3), (3, 4), (2, 5)]  # as even as 8 allows; a draw each


def test_a_finetuning_run_accumulates_micro_batches(tmp_path):
    run = finetune.run(config("finetune", "accum_steps=3"), tmp_path / "ft")  # batch 8: micro-batches 3, 3, 2
    assert RunDir(run.path).finished
    assert json.loads((run.path / "config.json").read_text())["config"]["accum_steps"] == 3


def test_cpu_bf16_trains_in_bf16_where_the_cpu_has_it_and_validates_in_fp32(monkeypatch):
    from mem_core.train import runtime as rt

    layer, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    monkeypatch.setattr(rt, "cpu_has_native_bf16", lambda: True)
    runtime = rt.setup_runtime("cpu", cpu_bf16=True)
    with runtime.train_autocast():
        assert layer(x).dtype == torch.bfloat16
    with runtime.autocast():  # validation, mem evaluate, exports and the live server compute in fp32
        assert layer(x).dtype == torch.float32
    with rt.setup_runtime("cpu").train_autocast():  # off unless asked for
        assert layer(x).dtype == torch.float32
    monkeypatch.setattr(rt, "cpu_has_native_bf16", lambda: False)  # emulated bf16 is slower than fp32: not used
    with pytest.warns(UserWarning, match="no native bf16"):
        runtime = rt.setup_runtime("cpu", cpu_bf16=True)
    with runtime.train_autocast():
        assert layer(x).dtype == torch.float32


def test_a_bf16_trained_run_reports_what_mem_evaluate_measures(tmp_path, monkeypatch):
    from mem_core.train import runtime as rt

    monkeypatch.setattr(rt, "cpu_has_native_bf16", lambda: True)
    run = finetune.run(config("finetune", "cpu_bf16=true", "epochs=2"), tmp_path / "ft")
    reported = json.loads((run.path / "result.json").read_text())
    measured = evaluate_run(run.path, "sim", None, "val")
    assert (measured["n"], measured["top1"], measured["confusion"]) == (
        reported["n"],
        reported["top1"],
        reported["confusion"],
    )


def test_evaluation_uses_the_split_file_the_run_trained_with(tmp_path):
    from test_datasets import make_ncaltech

    from mem_core.datasets.ncaltech101 import ncaltech101_split

    root = tmp_path / "ncaltech"
    make_ncaltech(root)
    split = ncaltech101_split(root, tmp_path / "default.json")
    split["val"] = split["val"][:3]  # the run's own split: three validation files
    custom = tmp_path / "mine.json"
    custom.write_text(json.dumps(split))
    overrides = [f"data.path={root}", f"data.split_file={custom}", "data.max_samples=8"]
    run = finetune.run(config("finetune", *overrides, dataset="ncaltech101"), tmp_path / "ft")
    assert json.loads((run.path / "result.json").read_text())["n"] == 3
    assert evaluate_run(run.path, "ncaltech101", root, "val")["n"] == 3  # not the default split's val


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", ["paper-ncars", "paper-ncaltech101", "paper-nimagenet"])
def test_every_paper_preset_runs_its_code_paths_at_tiny_size(tmp_path, preset, device):
    """The paper presets' own settings (RandAugment, layer decay, EMA, N-ImageNet's resize + random crop, head
    dropout, long cosine schedules) on a tiny model: every stage's first steps, on the CPU and on a GPU if any."""
    tiny = ["epochs=1", "batch_size=8", "data.max_samples=16", "data.num_workers=0", f"device={device}"]
    tiny += ["input.size=[32, 32]", "input.n_max=2000"]
    if preset == "paper-nimagenet":
        tiny.append("input.resize_to=[40, 52]")
    vit = ["model.patch_size=8", "model.embed_dim=32", "model.depth=4", "model.num_heads=2"]

    def cfg(stage, *extra):
        values = {"data.dataset": "sim"}
        return stage_config(stage, preset=preset, values=values, overrides=[*tiny, *extra])

    tok = tokenizer.run(
        cfg("tokenizer", "model.num_layers=3", "model.num_tokens=64", "model.hidden_dim=16"), tmp_path / "tok"
    )
    pre = pretrain.run(cfg("pretrain", *vit), tmp_path / "pre", tokenizer=tok.path)
    ft = finetune.run(cfg("finetune", *vit), tmp_path / "ft", init=pre.path)
    seg = segment.run(cfg("segment", *vit, "head_channels=16"), tmp_path / "seg", init=pre.path)
    for run in (tok, pre, ft, seg):
        assert RunDir(run.path).finished
    spec = json.loads((ft.path / "config.json").read_text())["config"]["input"]
    assert spec["randaug_ops"] == 2 and (preset != "paper-nimagenet" or spec["resize_to"] == [40, 52])


def test_label_efficiency_experiment_scores_three_arms_on_test_and_runs_in_parallel(
    tmp_path, monkeypatch, capsys, request
):
    """MEM, the same ViT from scratch and a CNN yardstick get the same labelled samples and steps, and a student
    distilled from each MEM run the same steps too; validation picks each run's epoch and the data's test split
    scores the kept models, which is the headline of the table, the plot and results.json; a user's `mem evaluate`
    of any run, the CNN's included, reads the same test figure."""
    import shutil

    from mem_core.train.experiment import TEST_SCORES, LabelEfficiencyConfig
    from mem_core.train.experiment import run as run_experiment

    monkeypatch.setattr("mem_core.cores.usable_cores", lambda: 2)  # two jobs of one torch thread each, as on 2 cores
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.set_num_threads(1)  # the same arithmetic in this process as in the parallel jobs
    tiny = [*TINY_INPUT, "epochs=2", "batch_size=8", "data.max_samples=24"]
    tok = ["model.num_layers=3", "model.num_tokens=64", "model.hidden_dim=16", "model.codebook_dim=8"]
    overrides = {"all": tiny, "tokenizer": tok, "pretrain": TINY_VIT, "finetune": TINY_VIT}
    cfg = LabelEfficiencyConfig(
        dataset="sim",
        out=str(tmp_path),
        fractions=(0.5, 1.0),
        seeds=(0,),
        overrides=overrides,
        yardstick="resnet10t",
        distill=True,
    )
    report = run_experiment(cfg)
    assert report["headline"] == "test_top1" and report["test_samples"] == 300  # sim's test split, every sample
    assert [(r["labels"], r["arm"]) for r in report["rows"]] == [
        (f, arm) for f in (0.5, 1.0) for arm in ("mem", "scratch", "resnet10t", "mem-distilled")
    ]
    for student in (r for r in report["rows"] if r["arm"] == "mem-distilled"):
        teacher = next(r["run"] for r in report["rows"] if (r["labels"], r["arm"]) == (student["labels"], "mem"))
        assert json.loads((Path(student["run"]) / "result.json").read_text())["teacher"] == str(Path(teacher).resolve())
    for row in report["rows"]:  # equal steps: the epochs and validations of all labels at every fraction
        assert row["epochs"] == 2 and len(row["val_curve"]) == 2
        assert row["train_samples"] == 24 and not row["cut_short"]  # data.max_samples caps both fractions
        assert row["final_top1"] == row["val_curve"][-1][1] and row["kept_top1"] >= row["final_top1"]
        assert row["choose_on"] == "val" and row["val_top1"] == row["kept_top1"] and row["val_apart_top1"] is None
        scored = json.loads((Path(row["run"]) / TEST_SCORES).read_text())
        assert scored["split"] == "test" and scored["top1"] == row["test_top1"] and scored["n"] == 300
    cnn = next(r for r in report["rows"] if r["arm"] == "resnet10t")
    assert json.loads((Path(cnn["run"]) / "config.json").read_text())["config"]["arch"] == "resnet10t"
    arms = report["arms"]
    assert set(arms) == {"mem", "scratch", "resnet10t", "mem-distilled"}
    assert arms["mem"]["parameters"] == arms["scratch"]["parameters"] != arms["resnet10t"]["parameters"]
    assert all(0 < a["cpu_ms_p50"] <= a["cpu_ms_p95"] for a in arms.values())
    assert {(lead["labels"], lead["of"], lead["over"]) for lead in report["leads"]} == {
        (f, of, arm)
        for f in (0.5, 1.0)
        for of, over in (("mem", ("scratch", "resnet10t")), ("mem-distilled", ("mem", "scratch", "resnet10t")))
        for arm in over
    }
    summary = {(s["labels"], s["arm"]): s for s in report["summary"]}
    assert summary[1.0, "mem"]["test_top1"]["mean"] == next(
        r["test_top1"] for r in report["rows"] if (r["labels"], r["arm"]) == (1.0, "mem")
    )
    table = (tmp_path / "results.md").read_text()
    for expected in (
        "**test top-1 (kept model)**",
        "val top-1 (kept model, chose it)",
        "Leads in top-1 points",
        "CPU ms per live window",
    ):
        assert expected in table
    for png in ("label_efficiency.png", "val_curves.png"):
        assert (tmp_path / png).stat().st_size > 10_000
    assert json.loads((tmp_path / "results.json").read_text())["headline"] == "test_top1"

    # the command a user runs: the finished runs and their test scores are reused, the table printed, the exit clean
    args = ["experiment", "label-efficiency", "--dataset", "sim", "--out", str(tmp_path), "--fractions", "0.5,1.0"]
    args += [
        "--seeds",
        "0",
        "--yardstick",
        "resnet10t",
        "--distill",
        *(a for stage, items in overrides.items() for item in items for a in ("--set", f"{stage}:{item}")),
    ]
    monkeypatch.setattr(sys, "argv", ["mem", *args])
    from app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "test top-1 (kept model)" in out and "resnet10t" in out and "results:" in out

    # --no-baselines: MEM and its students alone (another point of an unlabeled curve), their finished runs reused
    monkeypatch.setattr(sys, "argv", ["mem", *args, "--no-baselines"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0, capsys.readouterr().err
    assert "resnet10t" not in capsys.readouterr().out
    alone = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["labels"], r["arm"]) for r in alone] == [(f, a) for f in (0.5, 1.0) for a in ("mem", "mem-distilled")]
    pretrained = {r["run"]: r["test_top1"] for r in report["rows"] if r["arm"] in ("mem", "mem-distilled")}
    assert {r["run"]: r["test_top1"] for r in alone} == pretrained

    # `mem evaluate` scores the yardstick's run like any other
    evaluate = ["mem", "evaluate", "--model", cnn["run"], "--dataset", "sim", "--split", "test", "--json"]
    monkeypatch.setattr(sys, "argv", evaluate)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["top1"] == cnn["test_top1"]

    # --jobs 2: MEM's and the CNN's runs of one fraction train again, side by side, to the same curves (the
    # tokenizer, the pretraining and the other runs reused)
    again = [row for row in report["rows"] if row["labels"] == 0.5 and row["arm"] in ("mem", "resnet10t")]
    for row in again:
        shutil.rmtree(row["run"])
    in_parallel = run_experiment(dataclasses.replace(cfg, jobs=2))
    assert [(r["run"], r["val_curve"], r["test_top1"]) for r in in_parallel["rows"]] == [
        (r["run"], r["val_curve"], r["test_top1"]) for r in report["rows"]
    ]
    for row in again:  # each run's output went to its own log
        log = (tmp_path / "logs" / f"{Path(row['run']).name}.log").read_text()
        assert f"epoch {row['epochs']}/{row['epochs']}" in log
    assert "finetune (all runs, wall clock)" in in_parallel["seconds"]
    with pytest.raises(ConfigError, match="jobs"):
        LabelEfficiencyConfig(jobs=0)
    with pytest.raises(ConfigError, match="yardstick must be one of resnet10t, resnet18"):
        LabelEfficiencyConfig(yardstick="vgg11")
    with pytest.raises(ConfigError, match="choose_on='test': choose on a validation split"):
        LabelEfficiencyConfig(choose_on="test")


def test_a_shard_damaged_inside_its_data_stops_training_with_one_line_from_a_worker(tmp_path, events_factory):
    """Damage the shard check cannot see without reading every event surfaces from a loader worker as it would in the
    main process: one line naming the shard, not torch's "Caught ... in DataLoader worker" traceback."""
    from mem_core.corpus import CorpusWriter
    from mem_core.errors import MemError
    from mem_core.events import SensorSize

    with CorpusWriter(tmp_path / "corpus") as writer:
        writer.add_recording("r", events_factory(300_000, sensor=SensorSize(64, 64)), SensorSize(64, 64))
    shard = tmp_path / "corpus" / "shard-00000.h5"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    shard.write_bytes(data)
    cfg = config("tokenizer", f"data.path={tmp_path / 'corpus'}", "data.num_workers=1", dataset="corpus")
    with pytest.raises(MemError) as info:
        tokenizer.run(cfg, tmp_path / "tok")
    message = str(info.value)
    assert "shard-00000.h5" in message and "\n" not in message and "DataLoader worker" not in message


@pytest.mark.parametrize("damage", ["x beyond the sensor", "reversed times"])
def test_a_shard_with_values_its_recording_cannot_hold_stops_training_with_one_line(tmp_path, events_factory, damage):
    """Values altered with valid checksums pass every shard check short of --verify: the window read names them."""
    import h5py

    from mem_core.corpus import CorpusWriter
    from mem_core.errors import MemError
    from mem_core.events import SensorSize

    with CorpusWriter(tmp_path / "corpus") as writer:
        writer.add_recording("r", events_factory(60_000, sensor=SensorSize(64, 64)), SensorSize(64, 64))
    with h5py.File(tmp_path / "corpus" / "shard-00000.h5", "r+") as f:
        if damage == "x beyond the sensor":
            f["x"][::1000] = 5000
        else:
            f["t"][:] = f["t"][()][::-1]
    cfg = config("tokenizer", f"data.path={tmp_path / 'corpus'}", "data.num_workers=1", dataset="corpus")
    with pytest.raises(MemError) as info:
        tokenizer.run(cfg, tmp_path / "tok")
    message = str(info.value)
    assert (
        message.startswith(f"{tmp_path / 'corpus' / 'shard-00000.h5'}: recording 'r': event ") and "\n" not in message
    )
    assert ("x=5000" in message) if damage == "x beyond the sensor" else ("comes before" in message)


@pytest.mark.parametrize("full_from_epoch", [0, 1])
def test_a_disk_full_at_a_checkpoint_stops_with_one_line_and_resume_logs_each_epoch_once(
    tmp_path, monkeypatch, full_from_epoch
):
    import errno
    import os

    from mem_core.runs import rundir

    epochs_done = []
    write = rundir._Writes.write

    def full_disk_write(self, data):
        if len(epochs_done) >= full_from_epoch:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, data)

    save_checkpoint = rundir.RunDir.save_checkpoint

    def counting(self, state, best=False):  # an epoch is done once its checkpoint is written
        save_checkpoint(self, state, best=best)
        if not best:
            epochs_done.append(state["epoch"])

    monkeypatch.setattr(rundir._Writes, "write", full_disk_write)
    monkeypatch.setattr(rundir.RunDir, "save_checkpoint", counting)
    out = tmp_path / "ft"
    with pytest.raises(RunError, match=r"ft/(best|checkpoint)\.pt: cannot write \(No space left on device\); the"):
        finetune.run(config("finetune", "epochs=2"), out)
    if full_from_epoch:
        assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == []  # no half-written file left
        assert load_checkpoint(out / "checkpoint.pt")["epoch"] == 0  # the last good checkpoint stays
    else:
        assert not out.exists()  # failed before its first checkpoint: the directory it made is gone, nothing half-made
    monkeypatch.undo()
    finetune.run(config("finetune", "epochs=2"), out, resume=bool(full_from_epoch))
    assert [r["epoch"] for r in RunDir(out).metrics()] == [0, 1]


def test_a_metrics_record_the_disk_cannot_take_leaves_no_half_line(tmp_path, monkeypatch):
    import errno
    import os

    run = RunDir.create(tmp_path / "run", "finetune", {}, resume=False)
    run.log({"epoch": 0, "train_loss": 1.0})
    write = os.write

    def full_after_five_bytes(fd, data):
        write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_after_five_bytes)
    with pytest.raises(RunError, match=r"metrics\.jsonl: cannot write \(No space left on device\)"):
        run.log({"epoch": 1, "train_loss": 0.5})
    monkeypatch.undo()
    assert run.metrics() == [{"epoch": 0, "train_loss": 1.0}]


def test_a_run_directory_that_cannot_be_one_is_refused_in_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(RunError, match=r"taken: exists and is not a directory, so it cannot hold a run"):
        RunDir.create(tmp_path / "taken", "finetune", {}, resume=False)
    with pytest.raises(RunError, match=r"cannot hold a run \(File name too long\)"):
        RunDir.create(tmp_path.joinpath(*["d" * 200] * 21), "finetune", {}, resume=False)


def test_training_started_with_sigint_ignored_still_stops_on_sigint(tmp_path):
    """A script's background job (``mem pretrain ... &``) inherits SIGINT ignored: Ctrl-C must still stop it."""
    import signal
    import subprocess
    import time

    code = (
        "import sys\nfrom mem_core.train import finetune\nfrom mem_core.train.configs import stage_config\n"
        f"cfg = stage_config('finetune', preset='cpu-tiny', values={{'data.dataset': 'sim'}}, overrides={TINY_INPUT!r}"
        f" + {TINY_VIT!r} + ['epochs=1000', 'batch_size=8', 'data.max_samples=16'])\n"
        "finetune.run(cfg, sys.argv[1])\n"
    )
    ignored = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731  (as a shell starts `job &`)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "ft")], stderr=subprocess.PIPE, text=True, preexec_fn=ignored
    )
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "ft" / "checkpoint.pt").exists():  # an epoch is done: training runs
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in stderr
    assert load_checkpoint(tmp_path / "ft" / "checkpoint.pt")["epoch"] >= 0


def test_automatic_loader_workers_share_the_cores_a_process_gets(monkeypatch):
    from mem_core.configuration import ConfigError
    from mem_core.train.data import MAX_AUTO_WORKERS, loader_workers

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert loader_workers(-1) == MAX_AUTO_WORKERS  # a 16-core GPU host, one process
    assert loader_workers(-1, world_size=4) == 4  # torchrun with 4 processes on it
    assert loader_workers(3, world_size=4) == 3  # a count the user set stays
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert loader_workers(-1, world_size=2) == 1  # never none: loading stays off the training process
    assert stage_config("finetune").data.num_workers == -1
    with pytest.raises(ConfigError, match="num_workers"):
        stage_config("finetune", overrides=["data.num_workers=-2"])


def test_ctrl_c_in_the_middle_of_a_checkpoint_write_is_a_ctrl_c_and_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    from mem_core.runs import rundir

    path = tmp_path / "checkpoint.pt"
    rundir.atomic_torch_save({"epoch": 0, "w": torch.zeros(4096)}, path)
    write, calls = rundir._Writes.write, []

    def ctrl_c_on_the_third_write(self, data):
        calls.append(len(data))
        if len(calls) == 3:
            write(self, bytes(data)[: len(data) // 2])  # part of the record reached the file
            raise KeyboardInterrupt
        return write(self, data)

    monkeypatch.setattr(rundir._Writes, "write", ctrl_c_on_the_third_write)
    with pytest.raises(KeyboardInterrupt):  # not torch's "unexpected pos": the CLI says what was kept and exits 130
        rundir.atomic_torch_save({"epoch": 1, "w": torch.ones(4096)}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no half-written temporary file


def test_without_a_terminal_a_stage_says_where_it_is_inside_an_epoch(tmp_path, monkeypatch, capsys):
    """A log file or a pipe gets a progress line at least every PROGRESS_EVERY_S inside an epoch (the step, the pace,
    what is left of the epoch and of the run), not only the line at its end."""
    from mem_core.train import engine

    monkeypatch.setattr(engine, "PROGRESS_EVERY_S", 0.0)  # a line at every check
    monkeypatch.setattr(engine, "CHECK_EVERY_S", 0.0)  # a check after every step
    finetune.run(config("finetune", "epochs=2"), tmp_path / "ft")
    lines = [line for line in capsys.readouterr().err.splitlines() if ": step " in line]
    assert "finetune epoch 1/2: step 1/5" in lines[0]  # 40 samples in batches of 8
    assert any(line.startswith("finetune epoch 2/2: step 5/5") for line in lines)
    assert "samples/s; the epoch ends in" in lines[-1] and "the run in about" in lines[-1]


def test_the_estimate_of_what_is_left_follows_the_recent_pace():
    """A machine that slowed down shows in the estimate within the pace window, not averaged with the fast start."""
    from mem_core.train.engine import PACE_WINDOW_S, Pace, duration

    pace = Pace()
    for t in range(0, 600, 10):  # 10 steps a second for 10 minutes
        pace.add(float(t), 10 * t)
    for t in range(600, 600 + 2 * int(PACE_WINDOW_S), 10):  # then 1 step a second
        pace.add(float(t), 6000 + (t - 600))
    assert pace.rate() == pytest.approx(1.0)
    assert [duration(s) for s in (45, 720, 12_000)] == ["45 s", "12 min", "3 h 20 min"]


def test_a_run_trained_on_its_splits_as_shipped_is_never_evaluated_on_a_val_carved_from_its_training_split(
    tmp_path, data_dir
):
    """N-Cars carves a val out of a train/ with no val/ beside it; a run that held nothing out (``data.held_out``
    false, choosing on val-apart) trained on those samples, so `mem evaluate` opens the splits as the run did."""
    from mem_core.datasets import DatasetError

    for split in ("train", "val-apart"):
        for cls in ("cars", "background"):
            (tmp_path / split / cls).mkdir(parents=True)
            for path in sorted((data_dir / "ncars-dev" / split / cls).iterdir())[:10]:
                (tmp_path / split / cls / path.name).symlink_to(path)
    settings = (f"data.path={tmp_path}", "data.val_split=val-apart")
    shipped = finetune.run(config("finetune", *settings, "data.held_out=false", dataset="ncars"), tmp_path / "shipped")
    with pytest.raises(DatasetError, match="no N-Cars split 'val'"):
        evaluate_run(shipped.path, "ncars", tmp_path, "val")
    assert evaluate_run(shipped.path, "ncars", tmp_path, "train")["n"] == 20  # all of train, as it trained
    carving = finetune.run(config("finetune", *settings, dataset="ncars"), tmp_path / "carving")
    assert 0 < evaluate_run(carving.path, "ncars", tmp_path, "val")["n"] < 20  # carved out of train, held out
