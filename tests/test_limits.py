"""Where two boundaries meet, what one accepts the other takes: whatever an export accepts, the live server can
publish and the viewer's decoders (mem_core/protocol/) draw; whatever a file holds, the wire carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from app.cli import app
from app.config import ServeConfig
from mem_core import events, limits, protocol
from mem_core.configuration import ConfigError, to_dict
from mem_core.corpus import CorpusWriter
from mem_core.datasets import DatasetError, open_source
from mem_core.models import ViTConfig
from mem_core.representation import InputSpec
from mem_core.runs.export import check_meta
from mem_core.runs.rundir import RunError

SENSOR = {"height": limits.MAX_SENSOR_SIDE, "width": limits.MAX_SENSOR_SIDE}
MAX_EXPORT_MS = limits.MAX_EXPORT_WINDOW_MS
WIDE = "\U0001d538"  # a printable character of 4 UTF-8 bytes, the widest a header holds


def names(count: int, offset: int = 0, length: int = limits.MAX_CLASS_NAME) -> list[str]:
    """``count`` distinct class names of ``length`` 4-byte characters."""
    return [WIDE * (length - 1) + chr(0x20000 + offset + i) for i in range(count)]


def text(length: int = limits.MAX_TEXT) -> str:
    return WIDE * length


def meta(classes: list[str], side: int = 64, task: str = "classification") -> dict:
    arch = ViTConfig(img_size=side, patch_size=side // 8, embed_dim=32, depth=1, num_heads=2, drop_path=0.0)
    spec = InputSpec(size=(side, side), n_max=limits.MAX_EXPORT_WINDOW_EVENTS)
    window = {"events": spec.n_max, "ms": limits.MAX_EXPORT_WINDOW_MS}
    head = 32 if task == "segmentation" else None
    return {
        "task": task,
        "architecture": to_dict(arch),
        "classes": classes,
        "input": to_dict(spec),
        "head_channels": head,
        "training_window": window,
    }


def labels_field(model_classes: list[str]) -> dict:
    """The server's ``labels`` field at its largest: the model's classes offered, as many other names captured."""
    captured = names(limits.MAX_CLASSES, offset=limits.MAX_CLASSES)
    return {
        "root": text(),
        "classes": model_classes + captured,
        "counts": dict.fromkeys(captured, (1 << 63) - 1),
        "captures": (1 << 63) - 1,
        "last": captured[-1],
        "error": text(),
    }


def settings(model_classes: list[str]) -> dict:
    """What stats and control replies share (docs/protocol.md), every text at its longest."""
    window = {"events": limits.MAX_WINDOW_EVENTS, "ms": limits.MAX_WINDOW_MS}
    replay = {"playing": True, "speed": 1000.0, "position_s": 1e9, "duration_s": 1e9}
    return {
        "session": text(),
        "task": "classification",
        "commands": (1 << 63) - 1,
        "model_state": "ready",
        # the window the server starts with is the export's training window
        "accumulation": {**window, "default_events": limits.MAX_EXPORT_WINDOW_EVENTS, "default_ms": MAX_EXPORT_MS},
        "source": {"kind": text(), "model": text(), "serial": text(), **SENSOR, "recordable": True, "replay": replay},
        "recording": {"active": True, "root": text(), "name": text(), "events": 1 << 62, "error": text()},
        "labels": labels_field(model_classes),
        "training": {"state": text(), "epoch": 1, "epochs": 1, "val_top1": 1.0, "run": text(), "message": text()},
        "model": {"name": text(), "version": 1, "path": text(), "error": text()},
    }


def test_the_largest_class_set_an_export_accepts_reaches_the_viewer_in_every_message():
    classes = names(limits.MAX_CLASSES)
    check_meta(meta(classes), Path("model.json"))  # the export accepts it

    probs = np.full(len(classes), 1 / len(classes), np.float32)
    top_k = [{"id": i, "name": name, "prob": float(probs[i])} for i, name in enumerate(classes)]
    pred = protocol.encode(
        "pred", 0, {"probs": probs}, task="classification", classes=classes, top_k=top_k, model_version=1
    )
    stats = protocol.encode("stats", 0, **settings(classes), control="tcp://127.0.0.1:5558", events_per_s=1e9)
    state = {**settings(classes), "classes": classes, "token_grid": [limits.MAX_IMAGE_SIDE] * 2}
    reply = protocol.encode_control(0, "state", ok=False, error=text(), state=state)

    for frames in (pred, stats, reply):
        assert len(frames[1]) <= limits.MAX_HEADER_BYTES
    assert protocol.VIEW_DECODERS["pred"](protocol.decode(pred)).classes == classes
    assert protocol.VIEW_DECODERS["stats"](protocol.decode(stats))["labels"]["classes"][: len(classes)] == classes
    assert protocol.decode_reply(protocol.decode(reply))["state"]["classes"] == classes
    segmentation = protocol.encode(
        "pred", 0, {"mask": np.zeros((8, 8), np.uint16)}, task="segmentation", classes=classes
    )
    assert protocol.VIEW_DECODERS["pred"](protocol.decode(segmentation)).mask is not None


REFUSED_CLASS_SETS = pytest.mark.parametrize(
    ("classes", "problem"),
    [
        (names(limits.MAX_CLASSES + 1), "at most 1000"),
        (names(2, length=limits.MAX_CLASS_NAME + 1), "at most 55 characters"),
        (["car", "car"], "distinct"),
        (["car", "tab\there"], "printable"),
        (["car", "   "], "printable"),
    ],
)


@REFUSED_CLASS_SETS
def test_a_class_set_the_wire_cannot_carry_is_refused_by_the_export_in_one_line(classes, problem):
    with pytest.raises(RunError, match=problem) as info:
        check_meta(meta(classes), Path("model.json"))
    assert str(info.value).startswith("model.json: classes") and "\n" not in str(info.value)


@REFUSED_CLASS_SETS
def test_a_class_set_the_wire_cannot_carry_is_refused_by_mem_serve_before_it_starts(classes, problem):
    with pytest.raises(ConfigError, match=problem):
        ServeConfig(classes=tuple(classes))


def test_mem_serve_names_the_class_that_cannot_be_labelled_in_one_line(tmp_path):
    long = "x" * (limits.MAX_CLASS_NAME + 1)
    result = CliRunner().invoke(
        app, ["serve", "--source", "sim", "--classes", f"car,{long}", "--pub", "tcp://127.0.0.1:*"]
    )
    assert isinstance(result.exception, ConfigError)  # what `mem` prints as one line, before opening the source
    assert str(result.exception).startswith("classes.1: string should have at most 55 characters")


@pytest.mark.parametrize(
    ("label", "problem"), [("x" * (limits.MAX_CLASS_NAME + 1), "at most 55"), ("a\x07", "printable")]
)
def test_a_corpus_whose_labels_no_model_could_carry_is_refused_before_training(
    tmp_path, events_factory, label, problem
):
    sensor = events.SensorSize(16, 16)
    with CorpusWriter(tmp_path) as writer:
        for k, name in enumerate(["car", label, "car", label]):
            writer.add_recording(f"r{k}", events_factory(200, sensor, seed=k), sensor, label=name)
    with pytest.raises(DatasetError, match=f"the recordings' labels cannot be a model.s classes.[01]: .*{problem}"):
        open_source("corpus", tmp_path, "train")


def test_the_largest_input_an_export_accepts_is_drawn_by_the_viewer():
    side = limits.MAX_INPUT_SIDE
    check_meta(meta(["a", "b"], side=side, task="segmentation"), Path("model.json"))
    hist = protocol.encode("hist", 0, {"hist": np.zeros((2, side, side), np.float16)})
    mask = protocol.encode(
        "pred", 0, {"mask": np.zeros((side, side), np.uint8)}, task="segmentation", classes=["a", "b"]
    )
    grid = np.full((side, side), limits.MAX_NUM_TOKENS - 1, np.int32)  # the finest grid and the largest codebook
    tokens = protocol.encode("tokens", 0, {"tokens": grid}, num_tokens=limits.MAX_NUM_TOKENS)
    assert protocol.VIEW_DECODERS["hist"](protocol.decode(hist)).shape == (2, side, side)
    assert protocol.VIEW_DECODERS["pred"](protocol.decode(mask)).mask.shape == (side, side)
    assert protocol.VIEW_DECODERS["tokens"](protocol.decode(tokens))[1] == limits.MAX_NUM_TOKENS


def test_a_capture_label_of_the_longest_class_name_is_taken():
    label = names(1)[0]
    assert limits.MAX_LABEL == limits.MAX_CLASS_NAME
    assert protocol.decode_control(protocol.decode(protocol.encode_control(0, "capture", label=label))) == (
        "capture",
        {"label": label},
    )


def test_the_largest_sensor_a_file_may_have_travels_as_events(events_factory):
    sensor = events.SensorSize(events.MAX_SENSOR_SIDE, events.MAX_SENSOR_SIDE)
    batch = events_factory(100, sensor, seed=1)
    decoded, got = protocol.decode_events(protocol.decode(protocol.encode_events(0, batch, sensor)))
    assert got == sensor and np.array_equal(decoded, batch)


def test_a_recording_folder_of_a_path_longer_than_a_text_field_reaches_the_viewer_by_its_end(tmp_path, events_factory):
    from recorders.live_recorder import LiveRecorder

    root = tmp_path.joinpath(*(f"{k}" + "d" * 250 for k in range(5)), "recordings")  # ~1,300 characters
    recorder = LiveRecorder(root)
    recorder.start("walk")
    recorder.append(events_factory(100, events.SensorSize(16, 16)), events.SensorSize(16, 16), {"kind": "sim"})
    state = recorder.state()
    recorder.stop()
    stats = protocol.decode_stats(protocol.decode(protocol.encode("stats", 0, recording=state)))
    shown = stats["recording"]["root"]
    assert len(str(root)) > limits.MAX_TEXT and len(shown) == limits.MAX_TEXT
    assert shown.startswith("\u2026") and str(root).endswith(shown[1:])


def test_a_labels_folder_of_a_path_longer_than_a_text_field_reaches_the_viewer_by_its_end(tmp_path):
    from app.live.labelling import LabelDesk

    root = tmp_path.joinpath(*(f"{k}" + "d" * 250 for k in range(5)), "labels")  # ~1,300 characters
    labels, training = LabelDesk(root, root.parent / "label-runs", epochs=5).state(["car"])
    stats = protocol.decode_stats(protocol.decode(protocol.encode("stats", 0, labels=labels, training=training)))
    assert len(str(root)) > limits.MAX_TEXT and stats["labels"]["root"] == limits.fit_path(root)
    assert stats["labels"]["root"].endswith("d" * 200 + "/labels")


def test_the_largest_messages_the_wire_allows_pass_the_socket_limits():
    """The frame and byte limits the server's sockets read within (``MAX_CONTROL_*``, ``MAX_EVENTS_*``) let through
    every message the protocol allows there: a control request with a header of the largest size, an events message
    of every buffer it may carry and of the largest batch the ``tcp://`` source could queue."""
    request = protocol.encode_control(0, "capture", label=names(1)[0])
    header = request[1][:-1] + b" " * (limits.MAX_HEADER_BYTES - len(request[1])) + b"}"  # padded to the limit
    assert len(request) <= limits.MAX_CONTROL_FRAMES
    assert len(request[0]) + len(header) <= limits.MAX_CONTROL_BYTES
    assert limits.MAX_EVENTS_FRAMES == 2 + limits.MAX_BUFFERS
    largest_batch = limits.MAX_EVENT_QUEUE_BYTES // events.EVENT_DTYPE.itemsize  # events the queue takes at most
    widest = 4 * 8  # bytes an event takes on the wire in four 8-byte columns
    assert limits.MAX_HEADER_BYTES + largest_batch * widest <= limits.MAX_EVENTS_BYTES
