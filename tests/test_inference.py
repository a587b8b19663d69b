"""The live path's predictor: what its speed switches (bf16 weights, a CUDA graph of tokenizer and model) keep the
same, and where they do not apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import synthetic_events

from mem_core.events import SensorSize
from mem_core.inference import Predictor
from mem_core.models import TokenizerConfig, ViTConfig
from mem_core.representation import InputSpec
from mem_core.runs.export import export_random

SENSOR = SensorSize(48, 64)
CLASSES = tuple(f"class {i}" for i in range(10))


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, object]:
    """A tiny random classifier of 10 classes with a 64-token tokenizer, and a segmenter."""
    arch = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0)
    spec = InputSpec(n_max=2000, size=(32, 32))
    return {
        "classification": export_random(
            tmp_path_factory.mktemp("cls"),
            classes=CLASSES,
            architecture=arch,
            input_spec=spec,
            tokenizer=TokenizerConfig(img_size=32, num_layers=3, num_tokens=64, hidden_dim=16),
        ),
        "segmentation": export_random(
            tmp_path_factory.mktemp("seg"),
            task="segmentation",
            classes=("background", "disc", "square"),
            architecture=arch,
            input_spec=spec,
            head_channels=8,
        ),
    }


def predictors(export, device: str = "cpu", **switches) -> tuple[Predictor, Predictor]:
    """The default predictor and one with ``switches``, on the same weights: a random head spread out, so that the
    probabilities differ between classes (export_random's head starts near zero, as BEiT's does)."""
    reference = Predictor(export, device=device)
    for name, p in reference.model.named_parameters():
        if name.startswith("head"):
            torch.nn.init.normal_(p, std=1.0, generator=torch.Generator(device).manual_seed(0))
    other = Predictor(export, device=device, **switches)
    other.model.load_state_dict(reference.model.state_dict())  # cast into the other's dtype
    for predictor in (reference, other):
        predictor.warm_up()
    return reference, other


def windows(n: int = 3) -> list[np.ndarray]:
    return [synthetic_events(1500, SENSOR, seed=i) for i in range(n)]


def test_bf16_weights_predict_what_the_fp32_model_does_with_the_same_tokens(exports):
    reference, fast = predictors(exports["classification"], bf16_weights=True)
    assert {p.dtype for p in fast.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in fast.tokenizer.parameters()} == {torch.float32}  # tokens as the fp32 tokenizer makes them
    for events in windows():
        expected, got = reference(events, SENSOR), fast(events, SENSOR)
        assert expected.probs.std() > 0.02  # classes told apart, so the comparison means something
        np.testing.assert_allclose(got.probs, expected.probs, atol=2e-2)
        assert got.probs.argmax() == expected.probs.argmax()
        np.testing.assert_array_equal(got.tokens, expected.tokens)
        np.testing.assert_array_equal(got.hist, expected.hist)
        assert got.region == expected.region


@pytest.mark.parametrize("task", ["classification", "segmentation"])
def test_a_cuda_graph_is_left_out_without_cuda_and_changes_nothing(exports, task):
    reference, other = predictors(exports[task], cuda_graph=True)
    assert not other.graphed and not other.cuda_graph
    for events in windows():
        expected, got = reference(events, SENSOR), other(events, SENSOR)
        for name in ("hist", "probs", "mask", "tokens"):
            a, b = getattr(expected, name), getattr(got, name)
            assert (a is None) == (b is None), name
            if a is not None:
                np.testing.assert_array_equal(b, a, err_msg=name)
        assert got.stages_ms.keys() == expected.stages_ms.keys()


def test_a_cuda_graph_that_fails_to_record_leaves_the_windows_running_as_they_are(exports, monkeypatch, caplog):
    """``mem serve`` asks every GPU model for a graph: one that cannot be recorded is warned about once and the
    windows run without it, rather than the server stopping."""
    reference, failing = Predictor(exports["classification"]), Predictor(exports["classification"])
    failing.cuda_graph = True  # as on a GPU: warm_up records the graph

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "Stream", refuse)
    with caplog.at_level("WARNING", logger="mem_core.inference"):
        failing.warm_up()
    assert not failing.graphed
    assert "CUDA graph of the model could not be recorded (operation not permitted" in caplog.text
    for events in windows():
        expected, got = reference(events, SENSOR), failing(events, SENSOR)
        np.testing.assert_array_equal(got.probs, expected.probs)
        np.testing.assert_array_equal(got.tokens, expected.tokens)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("task", ["classification", "segmentation"])
def test_on_a_gpu_the_cuda_graph_replays_what_the_model_and_tokenizer_compute(exports, task):
    """Window after window (the static input refilled each time), with bf16 weights as the live benchmark runs it."""
    reference, graphed = predictors(exports[task], "cuda", bf16_weights=True, cuda_graph=True)
    assert graphed.graphed
    for events in windows(4):
        expected, got = reference(events, SENSOR), graphed(events, SENSOR)
        if task == "classification":
            np.testing.assert_allclose(got.probs, expected.probs, atol=2e-2)
            np.testing.assert_array_equal(got.tokens, expected.tokens)
            assert "tokenizer" not in got.stages_ms  # recorded with the model
        else:
            assert (got.mask == expected.mask).mean() > 0.99
        np.testing.assert_array_equal(got.hist, expected.hist)
