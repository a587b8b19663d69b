import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mem_core.augment import (
    RANDAUG_OPS,
    _affine_grid,
    _rand_augment_torch,
    augment_events,
    draw_rand_augment,
    flip_polarity,
    hflip_events,
    rand_augment,
    resize_and_augment,
    shift_events,
)
from mem_core.events import SensorSize, validate_events
from mem_core.representation import InputSpec, event_histogram

SENSOR = SensorSize(32, 48)


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


def test_hflip_rejects_events_wider_than_the_sensor(events_factory):
    ev = events_factory(10, SENSOR)
    ev["x"][0] = SENSOR.width
    with pytest.raises(ValueError, match="width 48"):
        hflip_events(ev, SENSOR)


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


def centred(x: torch.Tensor) -> torch.Tensor:
    """x with events only in its central third: rotated, sheared or shifted, they stay clear of the image edge,
    where the compiled kernel and grid_sample use different (half-pixel) border rules."""
    height, width = x.shape[-2:]
    out = torch.zeros_like(x)
    rows, cols = slice(height // 3, 2 * height // 3), slice(width // 3, 2 * width // 3)
    out[..., rows, cols] = x[..., rows, cols]
    return out


@pytest.mark.parametrize("op", RANDAUG_OPS)
def test_cpu_kernel_and_torch_ops_apply_the_same_plan(op):
    # rand_augment runs a compiled kernel on CPU and torch ops on other devices; both must give the same image.
    x = centred(random_images(n=4, channels=3))
    level = 2 / 3
    plan = [[(op, level), ("brightness", level)], [("brightness", -level), (op, -level)]]
    plan += [[("identity", level), (op, -level)], [(op, level), ("identity", level)]]
    by_kernel = resize_and_augment(x, x.shape[-2:], plan)
    by_torch = _rand_augment_torch(x.clone(), plan)
    np.testing.assert_allclose(by_kernel.numpy(), by_torch.numpy(), rtol=0, atol=1e-5)  # float rounding only


def test_consecutive_warps_interpolate_once():
    x = centred(random_images(n=1))
    undone = resize_and_augment(x, x.shape[-2:], [[("rotate", 0.5), ("rotate", -0.5)]])
    np.testing.assert_allclose(undone.numpy(), x.numpy(), rtol=0, atol=1e-5)


def test_rand_augment_is_the_drawn_plan_applied():
    x = random_images()
    plan = draw_rand_augment(len(x), 2, 20, torch.Generator().manual_seed(5))
    expected = resize_and_augment(x, x.shape[-2:], plan)
    assert torch.equal(rand_augment(x, generator=torch.Generator().manual_seed(5)), expected)
    y = x.clone()
    out = rand_augment(y, generator=torch.Generator().manual_seed(5), inplace=True)
    assert out.data_ptr() == y.data_ptr() and torch.equal(out, expected)


@pytest.mark.parametrize("size", [(24, 32), (50, 47), (61, 90)])
def test_resize_equals_bilinear_interpolate(size):
    x = random_images(n=3, size=(24, 32))
    expected = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    np.testing.assert_allclose(resize_and_augment(x, size).numpy(), expected.numpy(), rtol=0, atol=1e-6)


def test_leading_translation_is_an_exact_shift_of_the_resized_image():
    x = random_images(n=4, size=(20, 30))
    plan = [[("translate_x", 0.5), ("translate_y", -0.5)], [("identity", 0.5), ("translate_y", 1.0)]] * 2
    fused = resize_and_augment(x, (44, 64), plan)
    two_steps = _rand_augment_torch(F.interpolate(x, size=(44, 64), mode="bilinear", align_corners=False), plan)
    np.testing.assert_allclose(fused.numpy(), two_steps.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("ops", [[("rotate", 0.5)], [("translate_x", 0.3), ("shear_y", -1.0)]])
def test_leading_warp_is_fused_with_the_resize(ops):
    # One bilinear sampling of the small image instead of resize-then-warp: the same geometry, a little less blur.
    x = torch.zeros(1, 1, 30, 40)
    x[0, 0, 12:15, 25:28] = 1.0  # a blob right of the centre
    fused = resize_and_augment(x, (90, 120), [ops])[0, 0]
    resized = F.interpolate(x, size=(90, 120), mode="bilinear", align_corners=False)
    two_steps = _rand_augment_torch(resized, [ops])[0, 0]
    ys, xs = torch.meshgrid(torch.arange(90.0), torch.arange(120.0), indexing="ij")
    assert abs(fused.sum() / two_steps.sum() - 1) < 0.02  # the same mass ...
    for coordinate in (xs, ys):  # ... at the same place (centroid within 0.2 px)
        centroid = (fused * coordinate).sum() / fused.sum()
        assert abs(centroid - (two_steps * coordinate).sum() / two_steps.sum()) < 0.2
    assert fused.max() >= two_steps.max()  # one interpolation blurs less than two


def test_ops_after_a_pixel_op_run_at_output_resolution():
    x = centred(random_images(n=3, size=(20, 30)))
    plan = [[("brightness", -0.5), ("rotate", 0.5)], [("posterize", 1.0), ("translate_x", -0.5)]]
    plan += [[("contrast", 0.5), ("translate_y", 0.5)]]
    fused = resize_and_augment(x, (40, 60), plan)
    resized = F.interpolate(x, size=(40, 60), mode="bilinear", align_corners=False)
    np.testing.assert_allclose(fused.numpy(), _rand_augment_torch(resized, plan).numpy(), rtol=0, atol=1e-5)


def test_resize_and_augment_rejects_what_it_cannot_do():
    x = random_images(n=2, size=(24, 32))
    with pytest.raises(ValueError, match="antialiased"):
        resize_and_augment(x, (12, 32))
    with pytest.raises(ValueError, match="CPU batch"):
        resize_and_augment(x.half(), (24, 32))
    with pytest.raises(ValueError, match="out must be"):
        resize_and_augment(x, (30, 40), out=torch.empty(2, 2, 24, 32))
    with pytest.raises(ValueError, match="plan covers 1"):
        resize_and_augment(x, (24, 32), [[("identity", 1.0)]])
