import json

import numpy as np
import pytest
import torch

import mem_core.representation.histogram as histogram_module
from mem_core.events import EVENT_DTYPE, SensorSize, center_window, make_events
from mem_core.representation.histogram import (
    batch_histogram,
    collate_events,
    event_histogram,
    input_histogram,
    scatter_histogram,
    temporal_histogram,
    timestamp_histogram,
)
from mem_core.representation.pipeline import (
    batch_preprocess,
    extent_boxes,
    histograms_to_input,
    log_scale,
    normalize_histogram,
    prepare_events,
    preprocess,
    remove_hot_pixels,
    resize_histogram,
)
from mem_core.representation.spec import CHANNELS, InputSpec, n_channels

SENSOR = SensorSize(32, 48)
# A small spec so that the pipeline tests stay fast; the default (224 x 224) spec is checked once below.
SMALL = InputSpec(n_max=2000, size=(40, 56), shift_px=3, randaug_ops=2)


def reference_histogram(events, sensor, channels=2):
    """Slow, obviously correct counts: np.add.at on (p, y, x)."""
    out = np.zeros((channels, sensor.height, sensor.width), np.int64)
    np.add.at(out, (events["p"].astype(np.intp), events["y"].astype(np.intp), events["x"].astype(np.intp)), 1)
    return out


def test_histogram_counts_equal_np_add_at_reference(events_factory):
    ev = events_factory(20000, SENSOR)
    hist = event_histogram(ev, SENSOR)
    assert hist.dtype == np.float32
    assert hist.shape == (2, SENSOR.height, SENSOR.width)
    np.testing.assert_array_equal(hist, reference_histogram(ev, SENSOR))


def test_channel_0_is_off_and_channel_1_is_on():
    ev = make_events([0, 1, 2], [1, 3, 3], [2, 0, 0], [0, 1, 1])
    hist = event_histogram(ev, SENSOR)
    assert hist[0, 2, 1] == 1  # the OFF event at x=1, y=2
    assert hist[1, 0, 3] == 2  # the two ON events at x=3, y=0
    assert hist.sum() == 3


def test_counts_do_not_wrap_above_uint16(events_factory):
    hot = make_events(np.arange(70_000), np.full(70_000, 7), np.full(70_000, 5), np.ones(70_000))
    ev = np.concatenate([events_factory(1000, SENSOR), hot])
    hist = event_histogram(ev, SENSOR)
    reference = reference_histogram(ev, SENSOR)
    assert reference[1, 5, 7] > 65_535
    np.testing.assert_array_equal(hist, reference)


def test_streams_longer_than_float32_exact_range_are_counted_in_int64(events_factory, monkeypatch):
    # Exercise the path used above 2**24 events without allocating 2**24 events.
    monkeypatch.setattr(histogram_module, "FLOAT32_EXACT", 10)
    ev = events_factory(5000, SENSOR)
    np.testing.assert_array_equal(event_histogram(ev, SENSOR), reference_histogram(ev, SENSOR))
    ts = timestamp_histogram(ev, SENSOR)
    np.testing.assert_array_equal(ts[:2], reference_histogram(ev, SENSOR))
    assert 0 < ts[2].max() <= 1


@pytest.mark.parametrize("field", ["x", "y", "p"])
def test_events_off_the_sensor_raise(events_factory, field):
    ev = events_factory(100, SENSOR)
    ev[field][10] = {"x": SENSOR.width, "y": SENSOR.height, "p": 2}[field]
    with pytest.raises(ValueError, match="outside the sensor 48x32"):
        event_histogram(ev, SENSOR)


def test_wrong_dtype_raises():
    with pytest.raises(ValueError, match="EVENT_DTYPE"):
        event_histogram(np.zeros((10, 4)), SENSOR)


def test_temporal_bins_split_the_time_span_evenly_and_partition_the_counts(events_factory):
    ev = events_factory(4000, SENSOR)
    ev["t"] = np.sort(np.random.default_rng(1).integers(1000, 1400, len(ev)))
    ev["t"][0], ev["t"][-1] = 1000, 1399  # span of 400 us: bin b holds 1000 + [100 b, 100 b + 100)
    hist = temporal_histogram(ev, SENSOR, bins=4)
    assert hist.shape == (8, SENSOR.height, SENSOR.width)
    for b in range(4):
        in_bin = ev[(ev["t"] - 1000) // 100 == b]
        np.testing.assert_array_equal(hist[2 * b : 2 * b + 2], reference_histogram(in_bin, SENSOR))
    np.testing.assert_array_equal(hist.reshape(4, 2, *SENSOR).sum(0), event_histogram(ev, SENSOR))


def test_timestamp_channel_holds_the_normalized_time_of_the_newest_event(events_factory):
    ev = events_factory(3000, SENSOR)
    hist = timestamp_histogram(ev, SENSOR)
    np.testing.assert_array_equal(hist[:2], event_histogram(ev, SENSOR))
    t0, span = ev["t"][0], ev["t"][-1] - ev["t"][0]
    expected = np.zeros(SENSOR, np.float32)
    for e in ev:  # sorted by time: the last assignment is the newest event
        expected[e["y"], e["x"]] = (e["t"] - t0) / span
    np.testing.assert_allclose(hist[2], expected, rtol=1e-6)
    assert hist[2].max() == 1.0
    assert np.all(hist[2][hist[:2].sum(0) == 0] == 0)


@pytest.mark.parametrize("channels", CHANNELS)
def test_empty_window_gives_zeros_never_nan(channels):
    spec = InputSpec(n_max=100, size=(16, 16), channels=channels)
    empty = np.empty(0, EVENT_DTYPE)
    assert not input_histogram(empty, SENSOR, channels).any()
    for train in (False, True):
        x = preprocess(empty, SENSOR, spec, train=train, rng=np.random.default_rng(0))
        assert x.shape == (spec.in_chans, 16, 16)
        assert torch.isfinite(x).all() and not x.any()


def test_input_spec_channels_and_validation():
    assert InputSpec().in_chans == 2
    assert InputSpec(channels="temporal").in_chans == 8
    assert InputSpec(channels="temporal", temporal_bins=3).in_chans == 6
    assert InputSpec(channels="timestamp").in_chans == 3
    for bad in ({"channels": "rgb"}, {"size": (224,)}, {"resize_to": (200, 200)}, {"hflip_p": 1.5}, {"n_max": 0}):
        with pytest.raises(ValueError):
            InputSpec(**bad)
    with pytest.raises(ValueError, match="randaug_magnitude"):
        InputSpec(randaug_magnitude=31)


def test_input_spec_round_trips_through_json():
    spec = InputSpec(channels="temporal", resize_to=(256, 341), hot_pixel_std=None)
    assert InputSpec(**json.loads(json.dumps(spec.to_dict()))) == spec


def test_default_spec_gives_a_224_input_in_unit_range(events_factory):
    ev = events_factory(40000, SensorSize(100, 120))
    x = preprocess(ev, SensorSize(100, 120), InputSpec(), train=False)
    assert x.shape == (2, 224, 224) and x.dtype == torch.float32
    assert x.min() >= 0 and 0.5 < x.max() <= 1


@pytest.mark.parametrize("channels", CHANNELS)
def test_evaluation_is_deterministic_and_uses_the_centre_window(events_factory, channels):
    spec = InputSpec(n_max=1000, size=(40, 56), channels=channels)
    ev = events_factory(5000, SENSOR)
    first = preprocess(ev, SENSOR, spec, train=False)
    np.testing.assert_array_equal(first, preprocess(ev.copy(), SENSOR, spec, train=False))
    np.testing.assert_array_equal(first, preprocess(center_window(ev, 1000), SENSOR, spec, train=False))
    assert first.shape == (spec.in_chans, 40, 56)
    assert first.min() >= 0 and first.max() <= 1


def test_training_randomness_is_reproducible_from_the_seed(events_factory):
    ev = events_factory(5000, SENSOR)
    a = preprocess(ev, SENSOR, SMALL, train=True, rng=np.random.default_rng(7))
    b = preprocess(ev, SENSOR, SMALL, train=True, rng=np.random.default_rng(7))
    c = preprocess(ev, SENSOR, SMALL, train=True, rng=np.random.default_rng(8))
    np.testing.assert_array_equal(a, b)
    assert not torch.equal(a, c)
    assert a.min() >= 0 and a.max() <= 1


def test_training_without_a_generator_is_an_error(events_factory):
    with pytest.raises(ValueError, match="Generator"):
        preprocess(events_factory(100, SENSOR), SENSOR, SMALL, train=True)


def test_training_windows_are_contiguous_slices_of_n_max_events(events_factory):
    ev = events_factory(5000, SENSOR)
    spec = InputSpec(n_max=700, flip_polarity_p=0, hflip_p=0, shift_px=0)
    window = prepare_events(ev, SENSOR, spec, train=True, rng=np.random.default_rng(3))
    start = int(np.searchsorted(ev["t"], window["t"][0]))
    assert len(window) == 700
    np.testing.assert_array_equal(window, ev[start : start + 700])


def test_hot_pixel_is_removed_exactly_and_the_rest_kept(events_factory):
    background = events_factory(3000, SENSOR)
    hot = make_events(np.arange(5000), np.full(5000, 9), np.full(5000, 4), np.zeros(5000))
    ev = np.sort(np.concatenate([background, hot]), order="t")
    spec = InputSpec(n_max=10_000, size=(64, 96))
    out = preprocess(ev, SENSOR, spec, train=False)

    expected = torch.from_numpy(event_histogram(background, SENSOR))[None]
    expected[:, :, 4, 9] = 0  # the hot pixel is zeroed in both polarities, nothing else changes
    expected = resize_histogram(normalize_histogram(expected), (64, 96))[0]
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7)


def test_remove_hot_pixels_threshold_and_timestamp_channel():
    hist = torch.ones(1, 3, 10, 10)
    hist[0, 1, 2, 3] = 1000.0
    hist[0, 2] = 0.5  # a timestamp channel, not a count
    out = remove_hot_pixels(hist, num_std=5.0, count_channels=2)
    assert out[0, :, 2, 3].tolist() == [0.0, 0.0, 0.0]
    assert (out.sum() - out[0, :, 2, 3].sum()) == hist.sum() - hist[0, :, 2, 3].sum()
    assert torch.equal(remove_hot_pixels(hist, num_std=1e9, count_channels=2), hist)


def test_normalize_divides_counts_by_their_peak_per_sample():
    hist = torch.zeros(2, 3, 4, 4)
    hist[0, 0, 1, 1], hist[0, 1, 2, 2], hist[0, 2] = 8.0, 2.0, 0.25
    out = normalize_histogram(hist, count_channels=2)
    assert out[0, 0, 1, 1] == 1.0 and out[0, 1, 2, 2] == 0.25
    assert torch.equal(out[0, 2], hist[0, 2])  # the timestamp channel is already in [0, 1]
    assert torch.equal(out[1], torch.zeros(3, 4, 4))  # empty sample: zeros, no NaN


def test_resize_to_then_crop_centre_at_eval_random_at_train(events_factory):
    spec = InputSpec(
        n_max=4000, size=(32, 32), resize_to=(48, 64), randaug_ops=0, shift_px=0, hflip_p=0, flip_polarity_p=0
    )
    ev = events_factory(3000, SENSOR)
    hist = torch.from_numpy(event_histogram(ev, SENSOR))[None]
    expected = resize_histogram(normalize_histogram(hist), (48, 64))[0, :, 8:40, 16:48]
    np.testing.assert_allclose(
        preprocess(ev, SENSOR, spec, train=False).numpy(), expected.numpy(), rtol=1e-6, atol=1e-7
    )
    crops = {preprocess(ev, SENSOR, spec, train=True, rng=np.random.default_rng(s)).sum().item() for s in range(5)}
    assert len(crops) > 1


def test_collate_puts_the_windows_back_to_back_without_padding(events_factory):
    windows = [events_factory(50, SENSOR, seed=1), np.empty(0, EVENT_DTYPE), events_factory(20, SENSOR, seed=2)]
    batch = collate_events(windows, SENSOR)
    assert batch.t.shape == (70,) and batch.lengths.tolist() == [50, 0, 20] and len(batch) == 3
    assert batch.starts().tolist() == [0, 50, 50]
    for b, w in enumerate(windows):
        for column, field in zip(batch.window(b), "txyp", strict=True):
            np.testing.assert_array_equal(column.numpy(), w[field])
    with pytest.raises(ValueError, match="window 1"):
        collate_events([windows[0], np.zeros(5)], SENSOR)


@pytest.mark.parametrize("channels", CHANNELS)
def test_torch_and_numba_batch_histograms_equal_the_per_sample_histogram(events_factory, channels):
    windows = [events_factory(n, SENSOR, seed=n) for n in (300, 1, 0, 1000)]
    batch = collate_events(windows, SENSOR)
    by_numba = batch_histogram(batch, channels, 3, backend="numba")
    by_torch = batch_histogram(batch, channels, 3, backend="torch")
    for b, w in enumerate(windows):
        np.testing.assert_array_equal(by_numba[b].numpy(), input_histogram(w, SENSOR, channels, 3))
    np.testing.assert_array_equal(by_torch.numpy(), by_numba.numpy())


def test_batch_histogram_rejects_off_sensor_events(events_factory):
    bad = events_factory(10, SENSOR)
    bad["x"][3] = SENSOR.width
    batch = collate_events([events_factory(10, SENSOR), bad], SENSOR)
    for backend in ("numba", "torch"):
        with pytest.raises(ValueError, match="batch sample 1"):
            batch_histogram(batch, backend=backend)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("channels", CHANNELS)
def test_on_a_gpu_the_histograms_are_the_cpus(events_factory, channels):
    batch = collate_events([events_factory(n, SENSOR, seed=n) for n in (3000, 0, 1, 700)], SENSOR)
    on_gpu = batch_histogram(batch.pin_memory(), channels, 3, device="cuda")
    np.testing.assert_array_equal(on_gpu.cpu().numpy(), batch_histogram(batch, channels, 3).numpy())


def test_time_channels_refuse_a_window_out_of_time_order_on_both_backends(events_factory):
    late = events_factory(10, SENSOR)
    late["t"][4] = late["t"][-1] + 1  # after the window's last event: outside its time span
    batch = collate_events([events_factory(10, SENSOR), late], SENSOR)
    for backend in ("numba", "torch"):
        assert batch_histogram(batch, "hist", backend=backend).sum() == 20  # counts do not read the times
        for channels in ("temporal", "timestamp"):
            with pytest.raises(ValueError, match="batch sample 1: 1 of 10 events"):
                batch_histogram(batch, channels, backend=backend)


def counted_one_by_one(window: np.ndarray, channels: str, bins: int) -> np.ndarray:
    """The histogram of one window event by event in Python, leaving out what the kernels skip: the reference."""
    out = np.zeros((n_channels(channels, bins), *SENSOR), np.float32)
    if not len(window):
        return out
    t0, t_last = int(window["t"][0]), int(window["t"][-1])
    for t, x, y, p in zip(*(window[k].astype(np.int64) for k in "txyp"), strict=True):
        if x >= SENSOR.width or y >= SENSOR.height or p > 1 or (channels != "hist" and not t0 <= t <= t_last):
            continue
        channel = 2 * ((t - t0) * bins // (t_last - t0 + 1)) + p if channels == "temporal" else p
        out[channel, y, x] += 1
        if channels == "timestamp":  # the newest event's time in the window's span
            out[2, y, x] = max(out[2, y, x], (t - t0) / (t_last - t0) if t_last > t0 else 1.0)
    return out


@pytest.mark.parametrize("channels", CHANNELS)
def test_the_device_kernel_counts_like_a_loop_over_the_events_leaving_out_what_does_not_fit(events_factory, channels):
    rng = np.random.default_rng(5)
    windows = []
    for n in (400, 0, 1, 250):
        w = events_factory(n, SENSOR, seed=n)
        bad = rng.random(n) < 0.2  # a fifth of the events off the sensor, with a polarity > 1 or out of time order
        w["x"][bad & (rng.random(n) < 0.3)] = rng.integers(SENSOR.width, 65_535)
        w["y"][bad & (rng.random(n) < 0.3)] = SENSOR.height
        w["p"][bad & (rng.random(n) < 0.3)] = rng.integers(2, 255)
        if n > 2:
            w["t"][1:-1][bad[1:-1] & (rng.random(n - 2) < 0.5)] = rng.choice([-5, 10**9]) + w["t"][0]
        windows.append(w)
    counted = scatter_histogram(collate_events(windows, SENSOR), channels, 3)
    for b, w in enumerate(windows):
        np.testing.assert_allclose(counted[b].numpy(), counted_one_by_one(w, channels, 3), rtol=1e-6, atol=0)
    assert counted[0, :2].sum() < 400  # the bad events were there and were left out


@pytest.mark.parametrize("crop", ["sensor", "extent"])
@pytest.mark.parametrize("channels", CHANNELS)
def test_batched_equals_per_sample_at_evaluation(events_factory, channels, crop):
    spec = InputSpec(n_max=1500, size=(40, 56), channels=channels, resize_to=(44, 60), crop=crop)
    streams = [events_factory(n, SENSOR, seed=n) for n in (4000, 800, 0, 1500)]
    windows = [prepare_events(s, SENSOR, spec, train=False) for s in streams]
    batched = batch_preprocess(collate_events(windows, SENSOR), spec, train=False)
    per_sample = torch.stack([preprocess(s, SENSOR, spec, train=False) for s in streams])
    np.testing.assert_allclose(batched.numpy(), per_sample.numpy(), rtol=0, atol=1e-6)


def test_batched_training_is_reproducible_and_in_range(events_factory):
    rng = np.random.default_rng(0)
    windows = [
        prepare_events(events_factory(3000, SENSOR, seed=i), SENSOR, SMALL, train=True, rng=rng) for i in range(4)
    ]
    batch = collate_events(windows, SENSOR)
    a = batch_preprocess(batch, SMALL, train=True, generator=torch.Generator().manual_seed(1))
    b = batch_preprocess(batch, SMALL, train=True, generator=torch.Generator().manual_seed(1))
    assert a.shape == (4, 2, 40, 56)
    assert torch.equal(a, b)
    assert a.min() >= 0 and a.max() <= 1
    with pytest.raises(ValueError, match="Generator"):
        batch_preprocess(batch, SMALL, train=True)


def test_batch_preprocess_rejects_windows_longer_than_n_max(events_factory):
    batch = collate_events([events_factory(SMALL.n_max + 1, SENSOR)], SENSOR)
    with pytest.raises(ValueError, match="prepare_events"):
        batch_preprocess(batch, SMALL, train=False)


def test_log_scale_lifts_single_events_and_keeps_the_unit_range():
    x = torch.zeros(2, 3, 4, 4)
    x[0, 0, 1, 1], x[0, 1, 2, 2], x[0, 1, 3, 3], x[0, 2] = 1.0, 1 / 50, 0.5, 0.25
    out = log_scale(x, count_channels=2, gain=50.0)
    assert out[0, 0, 1, 1] == pytest.approx(1.0) and out[0, 0, 0, 0] == 0.0  # the peak stays 1, empty pixels 0
    assert out[0, 1, 2, 2].item() == pytest.approx(np.log(2) / np.log(51))  # 1/50 of the peak: 0.18, not 0.02
    assert out[0, 1, 2, 2] < out[0, 1, 3, 3] < 1.0  # monotone
    assert torch.equal(out[0, 2], x[0, 2]) and torch.equal(out[1], torch.zeros(3, 4, 4))  # timestamp untouched
    assert torch.equal(x[0, 1, 2, 2], torch.tensor(1 / 50))  # not in place unless asked
    for bad in ({"scale": "sqrt"}, {"log_gain": 0.0}, {"log_gain": float("nan")}):
        with pytest.raises(ValueError, match=r"scale|log_gain"):
            InputSpec(**bad)


def test_log_scale_is_taken_after_a_shrinking_resize(events_factory):
    # A lone event averaged with empty neighbours by the shrink must keep log-scale brightness: the log comes
    # after the resize, on the normalized counts, not before it on the raw ones.
    events = events_factory(2000, SENSOR, seed=3)
    hist = torch.from_numpy(input_histogram(events, SENSOR))[None]
    spec = InputSpec(n_max=2000, size=(SENSOR.height // 2, SENSOR.width // 2), scale="log", hot_pixel_std=None)
    shrunk = resize_histogram(normalize_histogram(hist), spec.size)
    expected = np.log1p(spec.log_gain * shrunk.numpy()) / np.log1p(spec.log_gain)
    for path in (histograms_to_input(hist, spec, train=False), preprocess(events, SENSOR, spec, train=False)[None]):
        np.testing.assert_allclose(path.numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scale", ["linear", "log"])
@pytest.mark.parametrize("channels", CHANNELS)
def test_hot_pixels_every_channel_kind_and_scale_batched_equals_per_sample(events_factory, channels, scale):
    spec = InputSpec(n_max=3000, size=(40, 56), channels=channels, scale=scale)
    hot = make_events(np.arange(3000), np.full(3000, 9), np.full(3000, 4), np.zeros(3000))
    streams = [np.sort(np.concatenate([events_factory(2000, SENSOR, seed=s), hot]), order="t") for s in range(3)]
    batched = batch_preprocess(collate_events([center_window(s, 3000) for s in streams], SENSOR), spec, train=False)
    per_sample = torch.stack([preprocess(s, SENSOR, spec, train=False) for s in streams])
    np.testing.assert_allclose(batched.numpy(), per_sample.numpy(), rtol=0, atol=1e-6)


def test_collate_in_a_dataloader_worker_builds_the_batch_in_shared_memory(events_factory, monkeypatch):
    windows = [events_factory(n, SENSOR, seed=n) for n in (40, 7, 0)]
    private = collate_events(windows, SENSOR)
    monkeypatch.setattr(histogram_module, "get_worker_info", lambda: object())  # as inside a worker process
    shared = collate_events(windows, SENSOR)
    for name in ("t", "x", "y", "p"):
        assert getattr(shared, name).is_shared() and not getattr(private, name).is_shared()
        assert torch.equal(getattr(shared, name), getattr(private, name))
    assert torch.equal(shared.lengths, private.lengths)


@pytest.mark.parametrize("train", [False, True])
def test_label_images_follow_the_resize_and_the_crop(train):
    # Events fill a block; its label image marks the same block. Through resize_to + a (random) crop, the input's
    # events must still sit on their labels (cropping the input alone would misalign them).
    sensor = SensorSize(40, 60)
    ys, xs = np.mgrid[10:20, 35:50]
    n = ys.size * 4
    events = make_events(np.arange(n), np.tile(xs.ravel(), 4), np.tile(ys.ravel(), 4), np.zeros(n))
    mask = np.zeros(sensor, np.uint8)
    mask[10:20, 35:50] = 1
    spec = InputSpec(n_max=n, size=(32, 32), resize_to=(48, 72), randaug_ops=0, hot_pixel_std=None)
    batch = collate_events([events] * 6, sensor)
    generator = torch.Generator().manual_seed(3) if train else None
    x, labels = batch_preprocess(
        batch, spec, train=train, generator=generator, labels=torch.from_numpy(np.stack([mask] * 6))
    )
    assert labels.shape == (6, 32, 32) and labels.dtype == torch.int64
    on_label = (x[:, 0] * (labels == 1)).sum((1, 2)) / x[:, 0].sum((1, 2)).clamp_min(1e-9)
    assert (x[:, 0].sum((1, 2)) > 0).all() and (on_label > 0.9).all()  # bilinear edges aside, events sit on labels
    if train:
        assert len({tuple(torch.nonzero(lab).min(0).values.tolist()) for lab in labels}) > 1  # crops differ


def test_labels_with_randaugment_are_refused(events_factory):
    batch = collate_events([events_factory(100, SENSOR)], SENSOR)
    with pytest.raises(ValueError, match="randaug_ops = 0"):
        batch_preprocess(batch, SMALL, train=True, generator=torch.Generator(), labels=torch.zeros(1, *SENSOR))


def block_events(sensor: SensorSize, rows: slice, cols: slice, repeat: int = 3) -> np.ndarray:
    """Every pixel of a block, ``repeat`` times, alternating polarity: an object in one part of the sensor."""
    ys, xs = np.mgrid[rows, cols]
    n = ys.size * repeat
    return make_events(np.arange(n), np.tile(xs.ravel(), repeat), np.tile(ys.ravel(), repeat), np.arange(n) % 2)


def lit_extent(x: torch.Tensor) -> tuple[int, int]:
    """(rows, cols) spanned by the non-zero pixels of one (C, H, W) input."""
    ys, xs = np.nonzero(x.sum(0).numpy() > 0.05)
    return int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1)


def test_extent_crop_shows_an_object_in_a_corner_at_the_full_input_size_with_its_aspect_ratio():
    # An N-Cars-like sample: a 20 x 30 object in the top-left corner of a 100 x 120 frame.
    sensor = SensorSize(100, 120)
    events = block_events(sensor, slice(0, 20), slice(0, 30))
    spec = dict(n_max=len(events), size=(64, 64), hot_pixel_std=None)
    whole = preprocess(events, sensor, InputSpec(**spec), train=False)
    extent = preprocess(events, sensor, InputSpec(**spec, crop="extent"), train=False)
    assert lit_extent(whole)[1] <= 30 * 64 / 120 + 2  # the whole frame squeezed: a quarter of the width
    rows, cols = lit_extent(extent)
    assert cols >= 62 and abs(rows - 64 * 20 / 30) <= 2  # the full width, and the height keeps the aspect ratio
    assert extent[:, 0].amax() > 0 and extent[:, -10:].amax() == 0  # the square stays in the frame: its foot is empty
    assert extent.min() >= 0 and extent.max() == pytest.approx(1.0)


def test_extent_boxes_of_empty_tiny_and_wide_windows():
    hist = torch.zeros(4, 2, 40, 60)
    hist[1, 1, 5, 7] = 1  # one event: a square of a quarter of the shorter side around it, inside the sensor
    hist[2, 0, 10:20, 50:60] = 1  # a 10 x 10 block at the right edge
    hist[3, 0, 20:25, 0:60] = 1  # wider than the sensor is tall: the square reaches past top and bottom
    assert extent_boxes(hist) == [(-10, 0, 60), (0, 2, 10), (10, 50, 10), (-10, 0, 60)]


def test_extent_crop_refuses_label_images(events_factory):
    batch = collate_events([events_factory(100, SENSOR)], SENSOR)
    spec = InputSpec(n_max=2000, size=(16, 16), crop="extent", randaug_ops=0)
    with pytest.raises(ValueError, match='crop="sensor"'):
        batch_preprocess(batch, spec, train=False, labels=torch.zeros(1, *SENSOR))
    with pytest.raises(ValueError, match="unknown input crop 'box'"):
        InputSpec(crop="box")


def test_an_event_batch_slices_into_micro_batches_of_whole_windows(events_factory):
    windows = [events_factory(n, SENSOR, seed=n) for n in (5, 9, 3)]
    batch = collate_events(windows, SENSOR)
    part = batch[1:3]
    assert len(part) == 2 and part.lengths.tolist() == [9, 3] and part.sensor == batch.sensor
    assert part.window(0)[0].tolist() == windows[1]["t"].tolist() and part.x[9:].tolist() == windows[2]["x"].tolist()
    assert len(batch[3:]) == 0 and batch[3:].t.shape == (0,) and batch[:1].t.tolist() == windows[0]["t"].tolist()
    with pytest.raises(TypeError, match="sliced by a slice"):
        batch[0]
    with pytest.raises(ValueError, match="contiguous rows"):
        batch[::2]
