"""Property tests: whatever bytes a file holds, ``read_events`` returns valid events or raises ``EventFileError``.

Never another exception type, never a hang, never a crash of the interpreter.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mem_core.events import SensorSize, validate_events
from mem_core.io import EventFileError, read_events, write_events

FUZZ = settings(
    max_examples=80,
    deadline=timedelta(seconds=20),  # a loaded shared machine; the first example also compiles numba kernels
    suppress_health_check=[HealthCheck.too_slow],
)

EXTENSIONS = [".bin", ".bs2", ".dat", ".raw", ".npz", ".h5", ".aedat4", ".evz", ".xyz"]
PREFIXES = [
    b"",
    b"%",
    b"% Version 2\n",
    b"% Width 120\n% Height 100\n\x00\x08",
    b"% evt 3.0\n",
    b"% evt 2.0\n",
    b"% format EVT3;height=720;width=1280\n% end\n",
    b"PK\x03\x04",
    b"\x89HDF\r\n\x1a\n",
    b"#!AER-DAT4.0\r\n",
    b"MEMEVZ\x00\x01",
]


def read_or_refuse(path: Path) -> None:
    """The property: a clean refusal, or events that are sorted, binary-polarity and on the sensor."""
    try:
        events, sensor = read_events(path)
    except EventFileError as e:
        assert e.path == str(path) and e.reason
        return
    assert isinstance(sensor, SensorSize)
    validate_events(events, sensor)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def samples(data_dir, work) -> dict[str, bytes]:
    """Real recordings plus files written in the .npz, .h5 and .evz layouts, as bytes to cut and damage."""
    rng = np.random.default_rng(0)
    n = 300
    events = np.sort(rng.integers(0, 50_000, n))
    from mem_core.events import make_events

    ev = make_events(events, rng.integers(0, 64, n), rng.integers(0, 48, n), rng.integers(0, 2, n))
    written = {
        suffix: write_events(work / f"sample{suffix}", ev, SensorSize(48, 64)) for suffix in (".npz", ".h5", ".evz")
    }
    real = {
        ".dat": sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[0],
        ".bs2": data_dir / "nmnist-small" / "1.bs2",
        ".bin": data_dir / "fixtures" / "nmnist_sample.bin",
        ".raw": data_dir / "fixtures" / "prophesee_evt3_sample.raw",
        "2.raw": data_dir / "fixtures" / "prophesee_evt2_sample.raw",
    }
    return {name: path.read_bytes() for name, path in {**real, **written}.items()}


def _write(work: Path, name: str, content: bytes) -> Path:
    suffix = "." + name.split(".")[-1]
    path = work / f"case{suffix}"
    path.write_bytes(content)
    return path


@pytest.mark.slow
@FUZZ
@given(prefix=st.sampled_from(PREFIXES), tail=st.binary(max_size=2048), suffix=st.sampled_from(EXTENSIONS))
def test_random_bytes_are_read_or_refused(work, prefix, tail, suffix):
    read_or_refuse(_write(work, suffix, prefix + tail))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_truncated_real_files_are_read_or_refused(samples, work, data):
    name = data.draw(st.sampled_from(sorted(samples)))
    content = samples[name]
    cut = data.draw(st.integers(0, len(content) - 1))
    read_or_refuse(_write(work, name, content[:cut]))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_damaged_real_files_are_read_or_refused(samples, work, data):
    name = data.draw(st.sampled_from(sorted(samples)))
    content = bytearray(samples[name])
    for _ in range(data.draw(st.integers(1, 16))):
        content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
    read_or_refuse(_write(work, name, bytes(content)))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_cut_or_damaged_aedat4_is_read_or_refused_in_process(data_dir, work, data):
    """AEDAT4 decoded in-process: cuts and damage in any part (header, packet headers, LZ4 frames, data table)."""
    content = bytearray((data_dir / "fixtures" / "inivation_sample.aedat4").read_bytes())
    if data.draw(st.booleans()):
        content = content[: data.draw(st.integers(0, len(content) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
    read_or_refuse(_write(work, ".aedat4", bytes(content)))


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
