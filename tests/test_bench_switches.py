"""The speed switches' benchmarks (bench/gpu_checklist.sh speed): each variant measured beside the first, in one
process, with its rows named; variant names checked before any work."""

from __future__ import annotations

import pytest

from bench import bench_live, bench_train
from mem_core.events import SensorSize


def test_a_variant_is_switches_joined_by_plus_and_a_wrong_one_is_refused_by_name():
    assert bench_train.parse_variant("eager") == frozenset()
    assert bench_train.parse_variant("blocks+flex+bf16-targets") == {"blocks", "flex", "bf16-targets"}
    with pytest.raises(ValueError, match=r"variant 'blocks\+fast': unknown switch 'fast'"):
        bench_train.parse_variant("blocks+fast")
    with pytest.raises(ValueError, match="blocks and compile exclude each other"):
        bench_train.parse_variant("compile+blocks")
    assert bench_live.predictor_switches("eager") == {}
    assert bench_live.predictor_switches("bf16-weights+cuda-graph") == {"bf16_weights": True, "cuda_graph": True}
    with pytest.raises(ValueError, match="unknown switch 'graph'"):
        bench_live.predictor_switches("graph")


@pytest.mark.slow  # three training steps of three stage runs
def test_bench_train_measures_each_variant_beside_the_first():
    rows = bench_train.main(
        preset="cpu-tiny",
        device="cpu",
        batch_size=4,
        steps=1,
        warmup=1,
        sensor=SensorSize(100, 120),
        events=3000,
        stages=("pretrain", "finetune"),
        loader=False,
        variants=("eager", "bf16-targets"),
    )
    speeds = {(r["variant"], r["name"]) for r in rows if r["name"].endswith("images/s")}
    assert speeds == {
        ("eager", "pretrain images/s"),
        ("eager", "finetune images/s"),
        ("bf16-targets", "pretrain images/s"),  # the targets are pretraining's alone
    }
    [ratio] = [r for r in rows if r["unit"] == "x"]
    assert ratio["name"] == "pretrain images/s, bf16-targets / eager" and ratio["value"] > 0


@pytest.mark.slow  # a predictor on a few hundred windows per variant
def test_bench_live_times_the_predictor_under_each_variant_without_a_server(monkeypatch):
    monkeypatch.setattr(bench_live, "PREDICTOR_WINDOWS", 20)
    rows = {r["name"]: r for r in bench_live.main(variants=("eager", "bf16-weights"), server=False)}
    for variant in ("eager", "bf16-weights"):
        assert rows[f"predictor {variant}: call p95"]["value"] >= rows[f"predictor {variant}: call p50"]["value"] > 0
        assert rows[f"predictor {variant}: stage model, p50"]["value"] > 0
    assert rows["predictor call p95, bf16-weights / eager"]["value"] > 0
    assert not any(name.startswith(("latency", "start:", "viewer")) for name in rows)  # no server, no viewer
