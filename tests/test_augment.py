import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mem_core.augment import (
    RANDAUG_OPS,
    _affine_grid,
    apply_rand_augment,
    augment_events,
    draw_rand_augment,
    drop_events,
    rand_augment,
)
from mem_core.events import SensorSize, validate_events
from mem_core.representation import InputSpec, batch_preprocess, collate_events, event_histogram

SENSOR = SensorSize(32, 48)


# The three event augmentations one step at a time, in plain numpy: the oracle of the one-pass ``augment_events``.


def flip_polarity(events: np.ndarray) -> np.ndarray:
    """Swap ON and OFF (p -> 1 - p)."""
    out = events.copy()
    out["p"] = 1 - events["p"]
    return out


def hflip_events(events: np.ndarray, sensor: SensorSize) -> np.ndarray:
    """Mirror left-right: x -> W - 1 - x."""
    out = events.copy()
    out["x"] = sensor.width - 1 - events["x"].astype(np.int32)
    return out


def shift_events(events: np.ndarray, sensor: SensorSize, dx: int, dy: int) -> np.ndarray:
    """Move every event by (dx, dy) pixels and drop the events that leave the sensor."""
    x = events["x"].astype(np.int32) + dx
    y = events["y"].astype(np.int32) + dy
    keep = (x >= 0) & (x < sensor.width) & (y >= 0) & (y < sensor.height)
    out = events[keep]
    out["x"] = x[keep]
    out["y"] = y[keep]
    return out


def test_flip_polarity_swaps_on_and_off_only(events_factory):
    ev = events_factory(500, SENSOR)
    before = ev.copy()
    out = flip_polarity(ev)
    np.testing.assert_array_equal(out["p"], 1 - ev["p"])
    for field in ("t", "x", "y"):
        np.testing.assert_array_equal(out[field], ev[field])
    np.testing.assert_array_equal(ev, before)  # the input is not modified
    np.testing.assert_array_equal(event_histogram(out, SENSOR), event_histogram(ev, SENSOR)[::-1])


def test_hflip_mirrors_x_exactly(events_factory):
    ev = events_factory(500, SENSOR)
    out = hflip_events(ev, SENSOR)
    np.testing.assert_array_equal(out["x"], SENSOR.width - 1 - ev["x"].astype(int))
    np.testing.assert_array_equal(event_histogram(out, SENSOR), event_histogram(ev, SENSOR)[..., ::-1])
    np.testing.assert_array_equal(hflip_events(out, SENSOR), ev)


@pytest.mark.parametrize(("dx", "dy"), [(5, -3), (-15, 15), (0, 0), (48, 0)])
def test_shift_moves_events_and_drops_those_leaving_the_frame(events_factory, dx, dy):
    ev = events_factory(2000, SENSOR)
    out = shift_events(ev, SENSOR, dx, dy)
    validate_events(out, SENSOR)
    hist = event_histogram(ev, SENSOR)
    expected = np.zeros_like(hist)
    h, w = SENSOR
    ys, xs = slice(max(dy, 0), min(h + dy, h)), slice(max(dx, 0), min(w + dx, w))
    expected[:, ys, xs] = hist[:, max(-dy, 0) : min(h - dy, h), max(-dx, 0) : min(w - dx, w)]
    np.testing.assert_array_equal(event_histogram(out, SENSOR), expected)


def test_augment_events_stays_on_sensor_and_is_reproducible(events_factory):
    ev = events_factory(3000, SENSOR)
    before = ev.copy()
    spec = InputSpec(shift_px=15)
    for seed in range(10):
        out = augment_events(ev, SENSOR, spec, np.random.default_rng(seed))
        validate_events(out, SENSOR)
        np.testing.assert_array_equal(out, augment_events(ev, SENSOR, spec, np.random.default_rng(seed)))
    np.testing.assert_array_equal(ev, before)


def test_augment_events_applies_what_the_spec_asks(events_factory):
    ev = events_factory(300, SENSOR)
    off = InputSpec(flip_polarity_p=0.0, hflip_p=0.0, shift_px=0)
    out = augment_events(ev, SENSOR, off, np.random.default_rng(0))
    np.testing.assert_array_equal(out, ev)
    assert out is not ev
    always = InputSpec(flip_polarity_p=1.0, hflip_p=1.0, shift_px=2)
    out = augment_events(ev, SENSOR, always, np.random.default_rng(0))
    flipped = hflip_events(flip_polarity(ev), SENSOR)
    shifts = [(dx, dy) for dx in range(-2, 3) for dy in range(-2, 3)]
    assert any(np.array_equal(out, shift_events(flipped, SENSOR, dx, dy)) for dx, dy in shifts)


def test_augment_events_rejects_off_sensor_events(events_factory):
    ev = events_factory(10, SENSOR)
    ev["y"][4] = SENSOR.height
    with pytest.raises(ValueError, match="outside the sensor"):
        augment_events(ev, SENSOR, InputSpec(), np.random.default_rng(0))


class FixedDraws:
    """Stands in for ``np.random.Generator`` in ``drop_events``: the kind, then uniform draws at given fractions of
    their range, and ``random`` values for the random drop."""

    def __init__(self, kind: int, fractions: list[float], random: tuple[float, ...] = (0.5,)):
        self.kind, self.fractions, self.values = kind, list(fractions), random

    def integers(self, n):
        return self.kind

    def uniform(self, lo, hi):
        return lo + self.fractions.pop(0) * (hi - lo)

    def random(self, n):
        return np.resize(np.asarray(self.values), n)


def test_event_drop_removes_a_time_interval_a_box_or_a_random_share(events_factory):
    ev = events_factory(3000, SENSOR)
    t0, t1 = int(ev["t"][0]), int(ev["t"][-1])
    # time: ratio 0.5 (the middle of 0.1..0.9), the interval at the start of the window
    out = drop_events(ev, SENSOR, FixedDraws(0, [0.5, 0.0]))
    np.testing.assert_array_equal(out, ev[ev["t"] > t0 + 0.5 * (t1 - t0)])
    # area: ratio 0.5, the box centred on the sensor's centre: half its width and half its height
    out = drop_events(ev, SENSOR, FixedDraws(1, [0.5, 0.5, 0.5]))
    inside = (np.abs(ev["x"] - SENSOR.width / 2) < SENSOR.width / 4) & (
        np.abs(ev["y"] - SENSOR.height / 2) < SENSOR.height / 4
    )
    assert 0 < inside.sum() < len(ev)
    np.testing.assert_array_equal(out, ev[~inside])
    # random: an event goes when its draw is below the ratio (0.5 here)
    np.testing.assert_array_equal(drop_events(ev, SENSOR, FixedDraws(2, [0.5], random=(0.4, 0.6))), ev[1::2])
    np.testing.assert_array_equal(ev, events_factory(3000, SENSOR))  # the input is not modified


def test_event_drop_never_empties_a_window(events_factory):
    ev = events_factory(50, SENSOR)
    out = drop_events(ev, SENSOR, FixedDraws(2, [0.5], random=(0.0,)))  # every event's draw is below the ratio
    np.testing.assert_array_equal(out, ev)
    assert len(drop_events(ev[:0], SENSOR, np.random.default_rng(0))) == 0


def test_augment_events_drops_events_when_asked(events_factory):
    ev = events_factory(3000, SENSOR)
    plain = InputSpec(flip_polarity_p=0.0, hflip_p=0.0, shift_px=0)
    dropping = InputSpec(flip_polarity_p=0.0, hflip_p=0.0, shift_px=0, event_drop_p=1.0)
    sizes = []
    for seed in range(20):
        np.testing.assert_array_equal(augment_events(ev, SENSOR, plain, np.random.default_rng(seed)), ev)
        out = augment_events(ev, SENSOR, dropping, np.random.default_rng(seed))
        np.testing.assert_array_equal(out, augment_events(ev, SENSOR, dropping, np.random.default_rng(seed)))
        assert np.isin(out, ev).all()  # a subset: nothing moved, nothing invented
        sizes.append(len(out))
    assert max(sizes) < len(ev) and min(sizes) > 0
    with pytest.raises(ValueError, match="event_drop_p"):
        InputSpec(event_drop_p=1.5)


def random_images(n=6, channels=2, size=(24, 32), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, channels, *size, generator=g)
    return x * (torch.rand(n, channels, *size, generator=g) < 0.3)  # sparse, like event histograms


@pytest.mark.parametrize("op", RANDAUG_OPS)
def test_every_op_keeps_shape_and_unit_range(op):
    x = random_images(channels=8)
    before = x.clone()
    out = rand_augment(x, ops=2, magnitude=30, generator=torch.Generator().manual_seed(0), op_names=(op,))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.min() >= 0 and out.max() <= 1
    assert torch.equal(x, before)  # the input is not modified
    if op != "identity":
        assert not torch.equal(out, x)


@pytest.mark.parametrize("op", ["identity", "rotate", "shear_x", "translate_y", "brightness", "contrast", "sharpness"])
def test_magnitude_zero_is_the_identity(op):
    x = random_images()
    out = rand_augment(x, ops=1, magnitude=0, generator=torch.Generator().manual_seed(0), op_names=(op,))
    np.testing.assert_allclose(out.numpy(), x.numpy(), rtol=0, atol=1e-5)


def test_translate_moves_by_whole_pixels():
    x = torch.zeros(8, 2, 20, 33)
    x[:, 1, 10, 16] = 1.0
    out = rand_augment(x, ops=1, magnitude=15, generator=torch.Generator().manual_seed(0), op_names=("translate_x",))
    shift = round(150 / 331 * 33 * 0.5)  # magnitude 15 of 30 = half of the maximum translation
    for sample in out:
        assert sample.sum() == 1.0  # the event pixel moved intact (no interpolation blur)
        _, y, xpos = (sample == 1.0).nonzero()[0].tolist()
        assert y == 10 and abs(xpos - 16) == shift


def test_rotation_turns_about_the_centre_without_skew_on_non_square_inputs():
    height, width = 31, 61
    x = torch.zeros(16, 1, height, width)
    x[:, 0, 15, 30 + 12] = 1.0  # 12 px right of the centre pixel (15, 30)
    out = rand_augment(x, ops=1, magnitude=15, generator=torch.Generator().manual_seed(0), op_names=("rotate",))
    ys, xs = torch.meshgrid(torch.arange(height) - 15.0, torch.arange(width) - 30.0, indexing="ij")
    for sample in out[:, 0]:
        mass = sample.sum()
        cy, cx = (sample * ys).sum() / mass, (sample * xs).sum() / mass
        assert abs(math.hypot(cx, cy) - 12) < 0.3  # same distance from the centre in pixels
        assert abs(abs(math.degrees(math.atan2(cy, cx))) - 15) < 1.5  # turned by 30 deg * 15/30


def test_fast_affine_grid_equals_torch_affine_grid():
    theta = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(0))
    expected = F.affine_grid(theta, [5, 2, 17, 29], align_corners=False)
    np.testing.assert_allclose(_affine_grid(theta, 17, 29).numpy(), expected.numpy(), atol=1e-5)


def test_ops_differ_per_sample():
    x = random_images(n=1).expand(8, -1, -1, -1)
    out = rand_augment(x, generator=torch.Generator().manual_seed(0))
    distinct = {tuple(s.flatten()[::97].tolist()) for s in out}
    assert len(distinct) > 2


def test_same_generator_seed_gives_the_same_augmentation():
    x = random_images()
    a = rand_augment(x, generator=torch.Generator().manual_seed(3))
    b = rand_augment(x, generator=torch.Generator().manual_seed(3))
    c = rand_augment(x, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_rand_augment_rejects_bad_arguments():
    x = random_images()
    with pytest.raises(ValueError, match="solarize"):
        rand_augment(x, op_names=("solarize",))
    with pytest.raises(ValueError, match="magnitude"):
        rand_augment(x, magnitude=31)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        rand_augment(x[0])


def test_rand_augment_is_the_drawn_plan_applied():
    x = random_images()
    plan = draw_rand_augment(len(x), 2, 20, torch.Generator().manual_seed(5))
    expected = apply_rand_augment(x.clone(), plan)
    assert torch.equal(rand_augment(x, generator=torch.Generator().manual_seed(5)), expected)
    y = x.clone()
    out = rand_augment(y, generator=torch.Generator().manual_seed(5), inplace=True)
    assert out.data_ptr() == y.data_ptr() and torch.equal(out, expected)


def test_zoom_scales_a_window_about_its_events_and_settings_at_zero_draw_nothing(events_factory):
    """``scale_jitter`` zooms a training window about its events' centre by a factor within [1/(1+j), 1+j], the
    other augmentations unchanged; a setting at 0 draws nothing, so the windows of a recipe without it do not move."""
    sensor = SensorSize(100, 120)
    ev = events_factory(4000, sensor)
    ev = ev[(np.abs(ev["x"].astype(int) - 60) < 20) & (np.abs(ev["y"].astype(int) - 50) < 20)]  # an object
    plain = InputSpec(shift_px=0, flip_polarity_p=0.0, hflip_p=0.0)
    spreads = []
    for seed in range(40):
        out = augment_events(ev, sensor, dataclasses.replace(plain, scale_jitter=0.5), np.random.default_rng(seed))
        spreads.append(out["x"].astype(float).std() / ev["x"].astype(float).std())
        assert abs(out["x"].mean() - ev["x"].mean()) < 1.5 and abs(out["y"].mean() - ev["y"].mean()) < 1.5
    assert 1 / 1.5 - 0.05 < min(spreads) < 0.8 and 1.3 < max(spreads) < 1.5 + 0.05
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    augment_events(ev, sensor, InputSpec(), a)
    augment_events(ev, sensor, dataclasses.replace(InputSpec(), scale_jitter=0.0, noise_events=0.0), b)
    assert a.random() == b.random()


def test_background_activity_adds_uniform_events_in_time_order(events_factory):
    """``noise_events`` adds up to that share of a window's events at uniform pixels and times within its span,
    merged in time order; the window's own events are all still there, in their order."""
    ev = events_factory(2000, SENSOR)
    spec = InputSpec(shift_px=0, flip_polarity_p=0.0, hflip_p=0.0, noise_events=0.5)
    added = []
    for seed in range(20):
        out = augment_events(ev, SENSOR, spec, np.random.default_rng(seed))
        validate_events(out, SENSOR)
        assert np.all(np.diff(out["t"]) >= 0) and out["t"][0] >= ev["t"][0] and out["t"][-1] <= ev["t"][-1]
        added.append(len(out) - len(ev))
        mine = np.isin(out, ev)
        np.testing.assert_array_equal(out[mine], ev)  # a stable merge: the window's events keep their order
    assert min(added) >= 0 and max(added) <= 1000 and max(added) > 500
    with pytest.raises(ValueError, match="noise_events must be in"):
        InputSpec(noise_events=2.0)


def test_background_activity_keeps_the_window_within_n_max(events_factory):
    """A window already at ``n_max`` events with background activity added stays at ``n_max`` (a contiguous run
    of the noisy stream, in time order), so a batch of them goes through ``batch_preprocess``."""
    spec = InputSpec(shift_px=0, flip_polarity_p=0.0, hflip_p=0.0, noise_events=0.5, n_max=1500)
    ev = events_factory(1500, SENSOR)
    windows = [augment_events(ev, SENSOR, spec, np.random.default_rng(seed)) for seed in range(8)]
    assert all(len(w) <= spec.n_max for w in windows) and max(len(w) for w in windows) == spec.n_max
    assert all(np.all(np.diff(w["t"]) >= 0) for w in windows)
    x = batch_preprocess(collate_events(windows, SENSOR), spec, train=True, generator=torch.Generator().manual_seed(0))
    assert x.shape == (8, spec.in_chans, *spec.size)
