"""MEM's packed ``.evz`` files: exact round trips, the size that makes a dataset fit a thin link, damaged files
refused by name, and ``pack_folder`` mirroring a dataset tree."""

from __future__ import annotations

import lzma
import struct
import zlib
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from conftest import synthetic_events
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mem_core.events import EVENT_DTYPE, SensorSize, make_events
from mem_core.io import EventFileError, describe, detect_format, evz, read_events, write_events
from mem_core.io.pack import pack_folder

WIDE = SensorSize(720, 1280)
TINY = SensorSize(4, 4)


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype == EVENT_DTYPE
    for f in EVENT_DTYPE.names:
        np.testing.assert_array_equal(a[f], b[f], err_msg=f"field {f}")


def crafted(n: int, payload: bytes, *, sensor=TINY, t0=0, widths=(1, 1, 1), stream=None) -> bytes:
    """An .evz file declaring ``n`` events with a valid checksum over ``payload`` (compressed unless ``stream``)."""
    head = evz.HEADER.pack(evz.MAGIC, evz.VERSION, sensor.width, sensor.height, n, t0, *widths, 0)[:-4]
    if stream is None:
        stream = lzma.compress(payload, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + stream


def refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "damaged.evz"
    path.write_bytes(content)
    with pytest.raises(EventFileError, match=message) as info:
        read_events(path)
    assert info.value.path == str(path)


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize(
    ("events", "sensor"),
    [
        (synthetic_events(5000, seed=1, t0=123_456), SensorSize(32, 48)),
        (synthetic_events(3000, WIDE, seed=2), WIDE),  # x, y need two bytes
        (make_events([-(2**61), 0, 2**61], [1279, 0, 5], [719, 300, 0], [1, 0, 1]), WIDE),  # steps of 2^61 us
        (make_events([0, 2**62 - 2**61], [0, 1], [1, 0], [0, 1]), SensorSize(2, 2)),  # one step of 2^61 us
        (make_events([7] * 20, np.arange(20), [3] * 20, [1, 0] * 10), SensorSize(4, 20)),  # no time step
        (make_events([5], [0], [0], [1]), SensorSize(1, 1)),
        (np.empty(0, EVENT_DTYPE), SensorSize(100, 120)),
        (np.empty(0, EVENT_DTYPE), SensorSize(0, 0)),  # an empty recording of unknown geometry
    ],
    ids=["small", "wide", "largest-gaps", "gap", "same-time", "one", "empty", "empty-unknown-sensor"],
)
def test_any_valid_recording_round_trips_exactly(tmp_path, events, sensor):
    path = write_events(tmp_path / "rec.evz", events, sensor)
    back, got = read_events(path)
    assert got == sensor
    assert_same(back, events)
    assert detect_format(path) == "evz"


def test_real_ncars_files_round_trip_in_under_2_4_bytes_per_event(data_dir, tmp_path):
    """What makes the 22.8 M events of ncars-dev fit about 50 MiB: a .dat takes 8 bytes an event."""
    paths = sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[:25]
    paths += sorted((data_dir / "ncars-dev" / "test" / "background").glob("*.dat"))[:25]
    events_total = bytes_total = 0
    for k, path in enumerate(paths):
        events, sensor = read_events(path)
        packed = write_events(tmp_path / f"{k}.evz", events, sensor)
        back, got = read_events(packed)
        assert got == sensor
        assert_same(back, events)
        events_total += events.size
        bytes_total += packed.stat().st_size
    assert bytes_total / events_total < 2.4


def test_describe_reads_an_evz_file(tmp_path):
    events = synthetic_events(100, seed=3, t0=1000)
    info = describe(write_events(tmp_path / "rec.evz", events, SensorSize(32, 48)))
    assert (info["format"], info["events"], info["width"], info["height"]) == ("evz", 100, 48, 32)
    assert (info["t_min"], info["t_max"], info["on"]) == (int(events["t"][0]), int(events["t"][-1]), events["p"].sum())


def test_content_wins_over_the_name(tmp_path):
    events = synthetic_events(50, seed=4)
    disguised = write_events(tmp_path / "rec.evz", events, SensorSize(32, 48)).rename(tmp_path / "rec.dat")
    assert detect_format(disguised) == "evz"
    assert_same(read_events(disguised).events, events)


def test_writer_refuses_what_is_no_valid_recording(tmp_path):
    with pytest.raises(ValueError, match="not sorted"):
        evz.write_evz(tmp_path / "a.evz", synthetic_events(10)[::-1].copy(), SensorSize(32, 48))
    with pytest.raises(ValueError, match="implausible sensor"):
        evz.write_evz(tmp_path / "a.evz", synthetic_events(10), SensorSize(32, 100_000))


# ------------------------------------------------------------------------------------------ damaged files


@pytest.fixture
def good(tmp_path) -> bytes:
    events = synthetic_events(2000, seed=5)
    return write_events(tmp_path / "good.evz", events, SensorSize(32, 48)).read_bytes()


@pytest.mark.parametrize("keep", [3, 8, 34])
def test_a_file_cut_in_its_header_is_refused(tmp_path, good, keep):
    refused(tmp_path, good[:keep], r"truncated: the file ends inside the 35-byte \.evz header")


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.9, 0.999])
def test_a_file_cut_in_its_stream_is_refused(tmp_path, good, fraction):
    keep = evz.HEADER.size + int(fraction * (len(good) - evz.HEADER.size))
    refused(tmp_path, good[:keep], r"truncated|corrupt")


def test_every_flipped_byte_is_refused(tmp_path, good):
    """Header and stream are covered by the checksum: a flip anywhere is refused, never read as other events."""
    rng = np.random.default_rng(0)
    for at in [*range(evz.HEADER.size), *rng.integers(evz.HEADER.size, len(good), 60)]:
        damaged = bytearray(good)
        damaged[at] ^= 1 << int(rng.integers(8))
        refused(tmp_path, bytes(damaged), r"corrupt|truncated|version|not an \.evz")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b"MEMEVX\x00" + b[7:], "not an .evz file"),
        (lambda b: b[:7] + b"\x02" + b[8:], r"\.evz version 2, this reader reads version 1"),
        (lambda b: b[:28] + b"\x09" + b[29:], "bytes per time step 9"),
        (lambda b: b[:29] + b"\x03" + b[30:], "per x 3"),
        (lambda b: b[:8] + struct.pack("<H", 0) + b[10:], "implausible sensor 0x32"),
        (lambda b: b + b"\x00", "1 bytes follow the end of the stream"),
    ],
    ids=["magic", "version", "step-bytes", "x-bytes", "zero-width", "trailing-byte"],
)
def test_a_damaged_header_is_refused_naming_the_field(tmp_path, good, change, message):
    refused(tmp_path, change(good), message)


def test_a_huge_declared_count_is_refused_before_decompressing(tmp_path, good, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("decompressed")

    monkeypatch.setattr(evz, "decompress", never)
    for n in (2**40, 2**64 - 1):
        refused(tmp_path, good[:12] + struct.pack("<Q", n) + good[20:], "more than LZMA2 can expand")


def test_a_stream_that_expands_beyond_the_declared_events_is_refused(tmp_path):
    """A small file declaring 10 events whose stream holds 64 MiB: decoding stops at the 10 events' bytes."""
    bomb = lzma.compress(bytes(64 << 20), format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
    assert len(bomb) < 20_000
    size = evz.payload_bytes(10, 1, 1, 1)
    refused(tmp_path, crafted(10, bytes(size), stream=bomb), f"holds more than the {size} bytes of the 10 events")


def test_a_stream_holding_fewer_events_than_declared_is_refused(tmp_path):
    short, size = evz.payload_bytes(9, 1, 1, 1), evz.payload_bytes(10, 1, 1, 1)
    stream = lzma.compress(bytes(short), format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
    refused(tmp_path, crafted(10, bytes(size), stream=stream), f"ends after {short} of the {size} bytes")


def test_times_beyond_the_event_clock_are_refused_not_wrapped(tmp_path):
    step = (2**62).to_bytes(8, "little")  # from t0 = 2^61 one step reaches 3 x 2^61
    payload = bytes(step) + bytes(4) + b"\x00"  # 2 events: 8 step planes, x, y, polarity bits
    refused(tmp_path, crafted(2, payload, t0=2**61, widths=(8, 1, 1)), "time of event 1 lies beyond")
    top = (2**63 + 5).to_bytes(8, "little")  # a step with the top bit set must not turn negative
    refused(tmp_path, crafted(2, top + bytes(5), widths=(8, 1, 1)), "time of event 1 lies beyond")


def test_events_off_the_declared_sensor_are_refused(tmp_path):
    payload = bytes([0, 9, 0, 0, 0, 0])  # 2 events: one step of 0, x = 9 and 0, y = 0 and 0, polarity bits
    refused(tmp_path, crafted(2, payload), r"x<=9.*outside the 4x4 .* sensor declared by the \.evz header")


# ------------------------------------------------------------------------------------------ pack_folder


def test_pack_folder_mirrors_a_tree_packing_event_files_and_copying_the_rest(tmp_path, data_dir):
    src, dst = tmp_path / "src", tmp_path / "dst"
    reals = sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[:6]
    for k, real in enumerate(reals):
        (src / ("a" if k % 2 else "b")).mkdir(parents=True, exist_ok=True)
        (src / ("a" if k % 2 else "b") / real.name).write_bytes(real.read_bytes())
    (src / "index.csv").write_text("path,label\n")
    (src / "a" / "list.txt").write_text("1 0\n")
    (src / "b" / "cut.dat").write_bytes(reals[0].read_bytes()[:1000])
    lines: list[str] = []
    report = pack_folder(src, dst, workers=2, progress=lines.append)
    assert (report.packed, report.copied) == (6, 2)
    assert report.skipped == [("b/cut.dat", report.skipped[0][1])] and "truncated" in report.skipped[0][1]
    assert report.packed_bytes == sum(p.stat().st_size for p in dst.rglob("*.evz"))
    assert report.events == sum(read_events(p).events.size for p in reals)
    assert report.source_bytes == sum(p.stat().st_size for p in reals)
    assert lines and lines[-1].startswith("packed 9/9 files")
    assert (dst / "index.csv").read_text() == "path,label\n" and (dst / "a" / "list.txt").read_text() == "1 0\n"
    for k, real in enumerate(reals):
        packed = dst / ("a" if k % 2 else "b") / f"{real.stem}.evz"
        assert_same(read_events(packed).events, read_events(real).events)
    assert not (dst / "b" / "cut.evz").exists() and not list(dst.rglob(".*"))  # no partial files


def test_pack_folder_refuses_two_files_that_would_share_a_name(tmp_path):
    (tmp_path / "src").mkdir()
    for name in ("a.dat", "a.npz"):
        write_events(tmp_path / "src" / name, synthetic_events(20), SensorSize(32, 48))
    with pytest.raises(ValueError, match=r"a\.dat and a\.npz would both be packed as a\.evz"):
        pack_folder(tmp_path / "src", tmp_path / "dst", workers=1)
    with pytest.raises(ValueError, match="must lie outside"):
        pack_folder(tmp_path / "src", tmp_path / "src" / "packed", workers=1)


@settings(max_examples=60, deadline=timedelta(seconds=20), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_events_round_trip_exactly(tmp_path_factory, data):
    """Times anywhere in +-2^61 us with any gaps, coordinates up to the widest sensor, both polarities."""
    n = data.draw(st.integers(0, 300))
    side = data.draw(st.sampled_from([1, 34, 255, 256, 257, 8192]))
    t = sorted(data.draw(st.lists(st.integers(-(2**61), 2**61), min_size=n, max_size=n)))
    coordinate = st.lists(st.integers(0, side - 1), min_size=n, max_size=n)
    events = make_events(
        t, data.draw(coordinate), data.draw(coordinate), data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    )
    path = write_events(tmp_path_factory.mktemp("evz") / "rec.evz", events, SensorSize(side, side))
    back, sensor = read_events(path)
    assert sensor == (side, side)
    assert_same(back, events)


def test_inspecting_a_packed_folder_lists_its_evz_files(tmp_path):
    from recorders.inventory import describe_folder

    (tmp_path / "a").mkdir()
    write_events(tmp_path / "a" / "rec.evz", synthetic_events(40), SensorSize(32, 48))
    (tmp_path / "index.csv").write_text("path,label\n")
    listing = describe_folder(tmp_path)
    assert listing["event_files"] == 1
    assert {k: listing["files"][0][k] for k in ("path", "format", "events")} == {
        "path": "a/rec.evz",
        "format": "evz",
        "events": 40,
    }
