import numpy as np
import pytest

from mem_core.events import (
    EVENT_DTYPE,
    SensorSize,
    center_window,
    infer_sensor,
    make_events,
    random_window,
    validate_events,
)


def test_dtype_is_the_documented_contract():
    assert EVENT_DTYPE.names == ("t", "x", "y", "p")
    assert [EVENT_DTYPE[n].str for n in EVENT_DTYPE.names] == ["<i8", "<u2", "<u2", "|u1"]


def test_validate_accepts_sorted_events_on_sensor(events_factory):
    validate_events(events_factory(1000), SensorSize(32, 48))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.__setitem__("t", e["t"][::-1].copy()), "not sorted"),
        (lambda e: e["x"].__setitem__(3, 48), "outside the sensor"),
        (lambda e: e["y"].__setitem__(3, 32), "outside the sensor"),
        (lambda e: e["p"].__setitem__(0, 2), "polarity"),
    ],
)
def test_validate_names_the_problem(events_factory, mutate, message):
    ev = events_factory(100)
    mutate(ev)
    with pytest.raises(ValueError, match=message):
        validate_events(ev, SensorSize(32, 48))


def test_validate_rejects_wrong_dtype():
    with pytest.raises(ValueError, match="EVENT_DTYPE"):
        validate_events(np.zeros(3, dtype=np.float32))


def test_random_window_is_contiguous_and_reproducible(events_factory):
    ev = events_factory(1000)
    a = random_window(ev, 100, np.random.default_rng(7))
    b = random_window(ev, 100, np.random.default_rng(7))
    assert np.array_equal(a, b) and len(a) == 100
    start = int(np.flatnonzero(ev == a[0])[0])
    assert np.array_equal(ev[start : start + 100], a)
    starts = {int(np.flatnonzero(ev == random_window(ev, 100, np.random.default_rng(s))[0])[0]) for s in range(20)}
    assert len(starts) > 10


def test_windows_of_short_streams_return_everything(events_factory):
    ev = events_factory(50)
    assert len(random_window(ev, 100, np.random.default_rng(0))) == 50
    assert len(center_window(ev, 100)) == 50
    assert np.array_equal(center_window(ev, 10), ev[20:30])


def test_infer_sensor_and_make_events():
    ev = make_events([1, 2], [3, 9], [4, 1], [0, 1])
    assert infer_sensor(ev) == SensorSize(5, 10)
