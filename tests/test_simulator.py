"""The simulated event camera: valid streams, events where objects move, labels, sensor effects, datasets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mem_core.events import EVENT_DTYPE, SensorSize, validate_events
from mem_core.simulator import BACKGROUND_LABEL, SHAPES, EventSimulator, SimulatorConfig, make_sample

SENSOR = SensorSize(48, 64)
SMALL = SimulatorConfig(sensor=SENSOR, size_range=(0.2, 0.3), speed_range=(150.0, 300.0), noise_rate_hz=0.5)


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """Binary dilation of ``mask`` (H, W) with a (2 radius + 1)^2 square."""
    h, w = mask.shape
    padded = np.pad(mask, radius)
    out = np.zeros_like(mask)
    for dy in range(2 * radius + 1):
        for dx in range(2 * radius + 1):
            out |= padded[dy : dy + h, dx : dx + w]
    return out


def per_pixel_gaps(events: np.ndarray, width: int) -> np.ndarray:
    """Time between consecutive events of the same pixel."""
    pixel = events["y"].astype(np.int64) * width + events["x"]
    order = np.lexsort((events["t"], pixel))
    same_pixel = pixel[order][1:] == pixel[order][:-1]
    return np.diff(events["t"][order])[same_pixel]


def test_stream_batches_are_valid_sorted_and_tile_time():
    sim = EventSimulator(SMALL)
    batches = list(sim.stream(duration_us=25_000, batch_us=7_000))
    spans = [(0, 7_000), (7_000, 14_000), (14_000, 21_000), (21_000, 25_000)]
    assert len(batches) == len(spans)
    for batch, (start, end) in zip(batches, spans, strict=True):
        assert batch.dtype == EVENT_DTYPE
        validate_events(batch, SENSOR)
        assert batch.size > 0
        assert start <= batch["t"].min() and batch["t"].max() < end
    validate_events(np.concatenate(batches), SENSOR)
    assert sim.time_us == 25_000
    following = next(sim.stream(batch_us=5_000))  # an endless stream continues where the last one stopped
    assert following["t"].min() >= 25_000 and following["t"].max() < 30_000


def test_same_seed_gives_identical_events_and_other_seed_differs():
    first = EventSimulator(SMALL).simulate(20_000)
    again = EventSimulator(SMALL).simulate(20_000)
    other = EventSimulator(dataclasses.replace(SMALL, seed=1)).simulate(20_000)
    np.testing.assert_array_equal(first, again)
    assert first.size != other.size or not np.array_equal(first, other)


@pytest.mark.parametrize("class_id", range(len(SHAPES)))
def test_events_concentrate_where_the_object_is(class_id):
    duration_us = 20_000
    events, mask = make_sample(class_id, np.random.default_rng(class_id), SMALL, duration_us=duration_us)
    assert set(np.unique(mask)) == {BACKGROUND_LABEL, class_id + 1}
    # The mask is taken mid-sample: the object is within half the sample's travel of it.
    reach = int(np.ceil(SMALL.speed_range[1] * duration_us * 1e-6 / 2)) + 2
    near = dilate(mask > 0, reach)
    hits = near[events["y"], events["x"]]
    density_near = hits.sum() / near.sum()
    density_far = (~hits).sum() / (~near).sum()
    assert hits.mean() > 0.9
    assert density_near > 20 * density_far


def test_both_polarities_and_sub_frame_timestamps():
    events = EventSimulator(dataclasses.replace(SMALL, noise_rate_hz=0.0)).simulate(30_000)
    on_fraction = events["p"].mean()
    assert 0.2 < on_fraction < 0.8
    # Events carry interpolated times, not just the render instants.
    assert np.mean(events["t"] % SMALL.step_us == 0) < 0.1


def test_refractory_period_is_respected_per_pixel():
    busy = dataclasses.replace(
        SMALL, texture=0.8, contrast_threshold=0.05, threshold_sigma=0.0, speed_range=(600.0, 800.0), noise_rate_hz=20.0
    )
    free = per_pixel_gaps(EventSimulator(dataclasses.replace(busy, refractory_us=0)).simulate(20_000), SENSOR.width)
    limited = EventSimulator(dataclasses.replace(busy, refractory_us=400)).simulate(20_000)
    assert (free < 400).any(), "scene too calm to exercise the refractory period"
    assert per_pixel_gaps(limited, SENSOR.width).min() >= 400


def test_halving_the_contrast_threshold_about_doubles_the_events():
    quiet = dataclasses.replace(SMALL, noise_rate_hz=0.0, threshold_sigma=0.0)
    coarse = EventSimulator(dataclasses.replace(quiet, contrast_threshold=0.1)).simulate(20_000).size
    fine = EventSimulator(dataclasses.replace(quiet, contrast_threshold=0.05)).simulate(20_000).size
    # A bit above 2: changes smaller than the coarse threshold fire only at the fine one.
    assert 1.8 < fine / coarse < 2.6


def test_noise_only_scene_gives_the_configured_rate():
    rate_hz, duration_us = 50.0, 200_000
    config = dataclasses.replace(SMALL, n_objects=0, noise_rate_hz=rate_hz)
    events = EventSimulator(config).simulate(duration_us)
    expected = rate_hz * SENSOR.height * SENSOR.width * duration_us * 1e-6
    assert abs(events.size - expected) < 0.05 * expected
    assert 0.45 < events["p"].mean() < 0.55
    counts = np.bincount(
        events["y"].astype(np.int64) * SENSOR.width + events["x"], minlength=SENSOR.width * SENSOR.height
    )
    assert counts.max() < 5 * expected / counts.size  # spread over the sensor, no hot pixels


def test_classes_have_distinct_masks():
    # The same seed gives the same pose, so only the shape differs between the masks.
    masks = [EventSimulator(SMALL, object_classes=[k]).label_mask() for k in range(len(SHAPES))]
    for k, mask in enumerate(masks):
        assert set(np.unique(mask)) == {BACKGROUND_LABEL, k + 1}
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            inside_a, inside_b = masks[a] > 0, masks[b] > 0
            iou = (inside_a & inside_b).sum() / (inside_a | inside_b).sum()
            assert iou < 0.8, f"{SHAPES[a]} and {SHAPES[b]} masks overlap too much (IoU {iou:.2f})"


def test_objects_bounce_and_stay_on_the_sensor():
    config = dataclasses.replace(SMALL, n_objects=1, speed_range=(2000.0, 2000.0), max_angular_speed=0.0)
    sim = EventSimulator(config)
    inside = sim.label_mask() > 0
    area, centroid = inside.sum(), np.argwhere(inside).mean(axis=0)
    for _ in sim.stream(duration_us=300_000, batch_us=10_000):  # about ten border hits
        inside = sim.label_mask() > 0
        assert abs(inside.sum() - area) <= 0.05 * area  # never cut by a border
        new_centroid = np.argwhere(inside).mean(axis=0)
        assert np.linalg.norm(new_centroid - centroid) > 1.0  # never stuck at a wall
        centroid = new_centroid


def make_dataset(n_per_class: int, seed: int, config: SimulatorConfig, duration_us: int):
    """``n_per_class`` samples of every class as (events, class_id, mask), sample ``i`` drawn from ``seed`` and ``i``
    alone (how the ``sim`` dataset seeds its samples)."""
    n_classes = len(config.classes)
    for i, child in enumerate(np.random.SeedSequence(seed).spawn(n_per_class * n_classes)):
        events, mask = make_sample(i % n_classes, np.random.default_rng(child), config, duration_us)
        yield events, i % n_classes, mask


def test_make_dataset_is_reproducible_balanced_and_labelled():
    config = dataclasses.replace(SMALL, sensor=SensorSize(32, 32))
    samples = list(make_dataset(2, seed=7, config=config, duration_us=5_000))
    again = list(make_dataset(2, seed=7, config=config, duration_us=5_000))
    other = list(make_dataset(2, seed=8, config=config, duration_us=5_000))
    assert sorted(class_id for _, class_id, _ in samples) == sorted(list(range(len(SHAPES))) * 2)
    for (events, class_id, mask), (events2, class_id2, mask2) in zip(samples, again, strict=True):
        np.testing.assert_array_equal(events, events2)
        np.testing.assert_array_equal(mask, mask2)
        assert class_id == class_id2
        assert (mask == class_id + 1).any()
        validate_events(events, config.sensor)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(samples, other, strict=True))


def test_make_sample_distractors_are_labelled_as_other_classes():
    target = 2
    _, mask = make_sample(target, np.random.default_rng(0), SMALL, duration_us=4_000, distractors=3)
    labels = set(np.unique(mask).tolist()) - {BACKGROUND_LABEL}
    assert target + 1 in labels
    assert len(labels) >= 2  # at least one distractor is visible


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"classes": ("disc", "hexagon")}, "hexagon"),
        ({"noise_rate_hz": -1.0}, "noise_rate_hz"),
        ({"contrast_threshold": 0.0}, "contrast_threshold"),
        ({"speed_range": (5.0, 1.0)}, "speed_range"),
        ({"step_us": 1.5}, "step_us must be an integer"),
        ({"scene_us": -1}, "scene_us"),
        ({"n_objects": 10**9}, r"n_objects must be in \[0, 256\]"),  # a corpus's metadata may ask for any number
        ({"sensor": (100_000, 64)}, "sides must lie in 1..8192"),
    ],
)
def test_config_rejects_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        SimulatorConfig(**change)


def test_object_classes_out_of_range_are_rejected():
    with pytest.raises(ValueError, match="out of range"):
        EventSimulator(SMALL, object_classes=[len(SHAPES)])


def test_scene_cuts_show_every_class_without_a_burst_of_events():
    """A long recording from one simulator must cover the classes (a corpus of one shape teaches nothing), and a cut
    must not fire the whole old and new silhouettes as one burst."""
    scene_us = 20_000
    config = dataclasses.replace(SMALL, n_objects=1, noise_rate_hz=0.0, scene_us=scene_us)
    sim = EventSimulator(config)
    seen, masks, per_ms = [], [], []
    for batch in sim.stream(duration_us=15 * scene_us, batch_us=scene_us // 2):
        seen.append(sim.object_classes[0])
        masks.append(sim.label_mask())
        per_ms.append(np.bincount((batch["t"] % (scene_us // 2)) // 1000, minlength=scene_us // 2000))
    assert len(set(seen)) >= 4  # 15 scenes over 5 classes
    assert all(set(np.unique(m)) == {BACKGROUND_LABEL, c + 1} for m, c in zip(masks, seen, strict=True))
    rates = np.stack(per_ms)  # (batches, ms): batches 0, 2, 4, ... start with a cut
    first_ms_after_cut, other_ms = rates[2::2, 0], rates[:, 1:]
    assert first_ms_after_cut.max() < 3 * np.median(other_ms[other_ms > 0])
    cut = EventSimulator(config)
    assert cut.simulate(scene_us).size > 0 and cut.time_us == scene_us


def test_scene_cuts_keep_fixed_object_classes():
    config = dataclasses.replace(SMALL, scene_us=10_000)
    sim = EventSimulator(config, object_classes=[2, 4])
    before = sim.label_mask()
    sim.simulate(25_000)
    assert sim.object_classes == [2, 4]
    assert not np.array_equal(before, sim.label_mask())  # new poses
