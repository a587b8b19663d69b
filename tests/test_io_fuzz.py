"""Property tests of the values a file declares: columns of any integer type (and DSEC's ``t_offset``) are read as
exactly the events they hold, or refused with ``EventFileError``; never wrapped around. (Damaged files of every
format are fuzzed in ``test_fuzz_files``, read in a child process under a memory and a time bound.)
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mem_core.events import validate_events
from mem_core.io import EventFileError, read_events

FUZZ = settings(
    max_examples=80,
    deadline=timedelta(seconds=20),  # a loaded shared machine; the first example also compiles numba kernels
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


INTEGER_DTYPES = ["<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"]


@st.composite
def integer_columns(draw) -> dict[str, np.ndarray]:
    """Columns x, y, t, p of any integer types, as a hostile file may declare them: times of any value of their type,
    the other columns mostly plausible (so the times are reached), else of any value too."""
    n = draw(st.integers(1, 6))
    columns = {}
    for name in "xytp":
        dtype = np.dtype(draw(st.sampled_from(INTEGER_DTYPES)))
        info = np.iinfo(dtype)
        if name == "t" or draw(st.integers(0, 3)) == 0:
            edges = [
                v for v in (info.min, info.max, 65_536, 2**61, 2**61 + 1, -(2**61) - 1) if info.min <= v <= info.max
            ]
            values = st.one_of(st.integers(info.min, info.max), st.sampled_from(edges))
        else:
            values = st.integers(0, min(info.max, 479))
        columns[name] = np.array(draw(st.lists(values, min_size=n, max_size=n)), dtype)
    return columns


def read_exactly_or_refuse(path: Path, columns: dict[str, np.ndarray], t_offset: int = 0) -> None:
    """A clean refusal, or exactly the values the file holds (times + ``t_offset``), never wrapped around."""
    try:
        events, sensor = read_events(path)
    except EventFileError as e:
        assert e.path == str(path) and e.reason
        return
    validate_events(events, sensor)
    held = sorted(
        (int(t) + t_offset, int(x), int(y), int(p > 0))
        for t, x, y, p in zip(columns["t"], columns["x"], columns["y"], columns["p"], strict=True)
    )
    assert sorted(zip(*(events[f].tolist() for f in "txyp"), strict=True)) == held


@FUZZ
@given(columns=integer_columns())
def test_npz_columns_of_any_integer_type_are_read_exactly_or_refused(work, columns):
    data = np.zeros(len(columns["t"]), dtype=[(name, column.dtype) for name, column in columns.items()])
    for name, column in columns.items():
        data[name] = column
    path = work / "columns.npz"
    with path.open("wb") as f:
        np.savez(f, event_data=data)
    read_exactly_or_refuse(path, columns)


@FUZZ
@given(columns=integer_columns(), t_offset=st.integers(-(2**63), 2**64 - 1))
def test_dsec_columns_and_t_offset_of_any_integer_type_are_read_exactly_or_refused(work, columns, t_offset):
    import h5py

    path = work / "columns.h5"
    with h5py.File(path, "w") as f:
        for name, column in columns.items():
            f.create_dataset(f"events/{name}", data=column)
        f.create_dataset("t_offset", data=np.array(t_offset, "<u8" if t_offset >= 2**63 else "<i8"))
    read_exactly_or_refuse(path, columns, t_offset)
