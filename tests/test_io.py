"""Event file readers and writers: real recordings, documented layouts written here, errors and plug-ins."""

from __future__ import annotations

import io
import json
import pickle
import shlex
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from hostile import dat_with_geometry, dsec_declaring, npz_declaring, write_with_dv

from mem_core.events import EVENT_DTYPE, SensorSize, make_events, validate_events
from mem_core.io import (
    EventFile,
    EventFileError,
    aedat4,
    describe,
    detect_format,
    read_events,
    register_reader,
    registry,
    write_events,
)

# ------------------------------------------------------------------------------------------ helpers


def dat_header_end(buf: bytes) -> int:
    """Offset just past the ``%`` header lines of a Prophesee file."""
    pos = 0
    while buf[pos : pos + 1] == b"%":
        pos = buf.index(b"\n", pos) + 1
    return pos


def evt3_words(*words: int) -> bytes:
    return b"% evt 3.0\n" + np.asarray(words, dtype="<u2").tobytes()


def assert_same_events(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == EVENT_DTYPE and b.dtype == EVENT_DTYPE
    for f in EVENT_DTYPE.names:
        np.testing.assert_array_equal(a[f], b[f], err_msg=f"field {f}")


# ------------------------------------------------------------------------------------------ real files


def test_ncars_dat_files_decode_to_their_records(data_dir):
    paths = sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[:10]
    paths += sorted((data_dir / "ncars-dev" / "val" / "background").glob("*.dat"))[:10]
    for path in paths:
        buf = path.read_bytes()
        start = dat_header_end(buf) + 2  # + event type and size bytes
        events, sensor = read_events(path)
        assert sensor == SensorSize(100, 120)  # N-Cars: 120 x 100 (w x h), no geometry in the header
        validate_events(events, sensor)
        assert events.size == (len(buf) - start) // 8
        for i in (0, events.size // 2, events.size - 1):
            t, w = struct.unpack_from("<II", buf, start + 8 * i)
            assert (events["t"][i], events["x"][i], events["y"][i], events["p"][i]) == (
                t,
                w & 0x3FFF,
                (w >> 14) & 0x3FFF,
                (w >> 28) & 1,
            )
        assert events["t"][0] >= 0 and events["t"][-1] < 100_000  # 100 ms samples
    assert detect_format(paths[0]) == "dat"


@pytest.mark.parametrize("name", ["nmnist-small/1.bs2", "nmnist-small/500.bs2", "fixtures/nmnist_sample.bin"])
def test_nmnist_files_decode_to_their_5_byte_records(data_dir, name):
    path = data_dir / name
    raw = np.frombuffer(path.read_bytes(), dtype=np.uint8).reshape(-1, 5)
    assert not np.any(raw[:, 1] == 240)  # no overflow markers: every record is an event
    events, sensor = read_events(path)
    assert sensor == SensorSize(34, 34)
    validate_events(events, sensor)
    assert events.size == len(raw)
    b = raw.astype(np.int64)
    np.testing.assert_array_equal(events["x"], b[:, 0])
    np.testing.assert_array_equal(events["y"], b[:, 1])
    np.testing.assert_array_equal(events["p"], b[:, 2] >> 7)
    np.testing.assert_array_equal(events["t"], (b[:, 2] & 0x7F) << 16 | b[:, 3] << 8 | b[:, 4])


def test_evt3_matches_the_reference_decoding_in_events_and_order(data_dir):
    """Same events in the same order as ``prophesee_evt3_sample_reference.npy``; timestamps where it is right.

    The reference (expelliarmus) also counts every backwards step of EVT_TIME_LOW as a 4096 us overflow. The
    stream has such steps that are not wraps (e.g. TIME_LOW 811 then 800 with no event between), so from the
    first of them on the reference runs ahead by whole multiples of 4096 us, jumping ~4 ms between two
    consecutive events. We follow the format (time = time-high << 12 | time-low, wraps only on time-high).
    """
    ours, sensor = read_events(data_dir / "fixtures" / "prophesee_evt3_sample.raw")
    ref = np.load(data_dir / "fixtures" / "prophesee_evt3_sample_reference.npy")
    assert sensor == SensorSize(720, 1280)  # Gen4.1 plugin named in the header
    assert ours.size == ref.size
    for f in ("x", "y", "p"):
        np.testing.assert_array_equal(ours[f], ref[f].astype(ours[f].dtype), err_msg=f)
    ahead = ref["t"] - ours["t"]
    assert ahead[0] == 0 and np.all(ahead % 4096 == 0) and np.all(np.diff(ahead) >= 0)
    first = int(np.argmax(ahead > 0))
    np.testing.assert_array_equal(ours["t"][:first], ref["t"][:first])
    steps = np.flatnonzero(np.diff(ahead)) + 1  # where the reference jumps ahead
    assert np.all(np.diff(ref["t"])[steps - 1] > 4000) and np.all(np.diff(ours["t"])[steps - 1] < 100)


def test_evt3_timestamps_stay_inside_the_time_high_words_of_the_stream(data_dir):
    buf = (data_dir / "fixtures" / "prophesee_evt3_sample.raw").read_bytes()
    words = np.frombuffer(buf, dtype="<u2", offset=dat_header_end(buf)).astype(np.int64)
    highs = words[words >> 12 == 0x8] & 0xFFF
    assert np.all(np.diff(highs) >= 0)  # no 24-bit wrap in this sample
    events, _ = read_events(data_dir / "fixtures" / "prophesee_evt3_sample.raw")
    assert events["t"][0] >= highs.min() << 12 and events["t"][-1] < (highs.max() + 1) << 12
    validate_events(events)


def test_evt2_sample_decodes_every_cd_word(data_dir):
    path = data_dir / "fixtures" / "prophesee_evt2_sample.raw"
    buf = path.read_bytes()
    words = np.frombuffer(buf, dtype="<u4", offset=dat_header_end(buf)).astype(np.int64)
    assert words[0] >> 28 == 0x8  # starts with a time-high word: no event is dropped
    kinds = words >> 28
    cd = words[kinds <= 1]
    events, sensor = read_events(path)
    assert detect_format(path) == "evt2"
    assert sensor == SensorSize(480, 640)  # Gen3 VGA plugin, events fit
    validate_events(events, sensor)
    assert events.size == cd.size
    highs = words[kinds == 0x8] & 0x0FFFFFFF
    assert events["t"][0] >= highs.min() << 6 and events["t"][-1] < (highs.max() + 1) << 6
    np.testing.assert_array_equal(events["x"], (cd >> 11) & 0x7FF)  # same order: the sample is time-ordered
    np.testing.assert_array_equal(events["y"], cd & 0x7FF)
    np.testing.assert_array_equal(events["p"], cd >> 28)


def test_multi_sample_aertb_hdf5_is_refused_with_a_reason(data_dir):
    with pytest.raises(EventFileError, match=r"not a DSEC events file.*'0', '7'"):
        read_events(data_dir / "fixtures" / "nmnist_two_class.h5")


# ------------------------------------------------------------------------------------------ AEDAT4

SAMPLE_COMPRESSION_AT = 46  # the IOHeader's compression field in the real sample (int32, LZ4 = 1)


dv_events = aedat4.dv_processing_events  # dv-processing's own decoding: the reference


def aedat4_packets(buf: bytes, streams: set[int]) -> list[tuple[int, int, int]]:
    """(offset of the packet header, stream id, size) of each packet of ``streams`` until something else follows
    (the data table), chained here independently of the reader."""
    at, out = len(aedat4.MAGIC) + 4 + struct.unpack_from("<i", buf, len(aedat4.MAGIC))[0], []
    while at + 8 <= len(buf):
        stream, size = struct.unpack_from("<ii", buf, at)
        if stream not in streams or size <= 0 or at + 8 + size > len(buf):
            break
        out.append((at, stream, size))
        at += 8 + size
    return out


def assert_same_as_dv(events: np.ndarray, expected: np.ndarray) -> None:
    for ours, theirs in zip("txyp", ("timestamp", "x", "y", "polarity"), strict=True):
        np.testing.assert_array_equal(events[ours], expected[theirs], err_msg=f"field {ours}")


def test_aedat4_matches_dv_processing(data_dir):
    path = data_dir / "fixtures" / "inivation_sample.aedat4"
    events, sensor = read_events(path)
    assert sensor == SensorSize(240, 320)  # a DVXplorer Lite: 320 x 240
    assert events.size == 111_954
    assert_same_as_dv(events, dv_events(path))


@pytest.mark.parametrize("compression", ["NONE", "LZ4", "LZ4_HIGH", "ZSTD", "ZSTD_HIGH"])
def test_aedat4_written_by_dv_processing_reads_back(tmp_path, events_factory, compression):
    sensor = SensorSize(48, 64)
    events = events_factory(3000, sensor, seed=5, t0=1_600_000_000_000_000)
    path = write_with_dv(tmp_path / f"{compression}.aedat4", events, sensor, compression)
    read, read_sensor = read_events(path)
    assert read_sensor == sensor
    assert_same_events(read, events)
    assert_same_as_dv(read, dv_events(path))


def test_aedat4_is_decoded_in_process(data_dir, monkeypatch):
    def no_child(*args, **kwargs):
        raise AssertionError("reading an AEDAT4 file started a process")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    assert read_events(data_dir / "fixtures" / "inivation_sample.aedat4").events.size == 111_954


@pytest.mark.timeout(30)
def test_aedat4_damage_that_makes_dv_processing_spin_is_refused_at_once(data_dir, tmp_path):
    # Zeroing 8 bytes inside the first LZ4 packet makes dv-processing 2.0.4 loop for good in its decompressor.
    buf = (data_dir / "fixtures" / "inivation_sample.aedat4").read_bytes()
    path = tmp_path / "damaged.aedat4"
    path.write_bytes(buf[:2835] + bytes(8) + buf[2843:])
    with pytest.raises(EventFileError, match=r"corrupt: the packet at byte 2342 does not decompress"):
        read_events(path)


def _sample_with(buf: bytes, change: str) -> bytes:
    """The real sample with one structural field changed (packet headers, IOHeader, data table position)."""
    packets = aedat4_packets(buf, {0, 2, 3})
    out = bytearray(buf)
    (first, _, size), (last, _, last_size) = packets[0], packets[-1]
    table_at = last + 8 + last_size
    at_table = buf.index(struct.pack("<q", table_at), len(aedat4.MAGIC))
    if change == "stream id":
        out[first : first + 4] = struct.pack("<i", 9)
    elif change == "event packet as IMU":
        out[first : first + 4] = struct.pack("<i", 2)
    elif change == "packet size":
        out[first + 4 : first + 8] = struct.pack("<i", size + 1000)
    elif change == "last packet size":
        out[last + 4 : last + 8] = struct.pack("<i", last_size + 4)
    elif change == "compression":
        assert buf[SAMPLE_COMPRESSION_AT : SAMPLE_COMPRESSION_AT + 4] == struct.pack("<i", 1)
        out[SAMPLE_COMPRESSION_AT : SAMPLE_COMPRESSION_AT + 4] = struct.pack("<i", 9)
    elif change == "table position":
        out[at_table : at_table + 8] = struct.pack("<q", packets[5][0] + 8)
    return bytes(out)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("stream id", r"packet header at byte 2334 \(stream 9, 7949 bytes\) names a stream the header does not"),
        ("event packet as IMU", r"data table .* lists packet 0 at byte 2342 \(stream 0, 7949 bytes\), the file has "),
        ("packet size", r"packet header at byte 11291 \(stream \d+, \d+ bytes\) names a stream the header does not"),
        ("last packet size", r"the packet at byte \d+ \(\d+ bytes\) runs 4 bytes into the data table at byte 945243"),
        ("compression", r"unknown compression type 9 in the IOHeader"),
        ("table position", r"runs \d+ bytes into the data table at byte \d+"),
    ],
)
def test_aedat4_with_damaged_structure_is_refused_naming_the_damage(data_dir, tmp_path, change, message):
    path = tmp_path / "damaged.aedat4"
    path.write_bytes(_sample_with((data_dir / "fixtures" / "inivation_sample.aedat4").read_bytes(), change))
    with pytest.raises(EventFileError, match=message) as info:
        read_events(path)
    assert info.value.path == str(path)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (b"EVTS", b"EVTX", r"the event packet at byte \d+ is not a EVTS flatbuffer \(found b'EVTX'\)"),
        (struct.pack("<I", 1000), struct.pack("<I", 10**9), r"declares 1000000000 elements, more than its"),
    ],
)
def test_aedat4_with_a_damaged_event_packet_is_refused(tmp_path, events_factory, old, new, message):
    sensor = SensorSize(48, 64)
    path = write_with_dv(tmp_path / "plain.aedat4", events_factory(3000, sensor), sensor, "NONE")  # packets as stored
    buf = path.read_bytes()
    at = buf.index(old, aedat4_packets(buf, {0})[0][0] + 8)  # in the first packet (the header names EVTS too)
    path.write_bytes(buf[:at] + new + buf[at + len(old) :])
    with pytest.raises(EventFileError, match=message):
        read_events(path)


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (999, r"the data table declares 999 events in the packet at byte \d+, it holds 1000"),
        (2**40, r"the data table declares 1099511627776 events in the \d+-byte packet at byte \d+"),
        (-1, r"the data table declares -1 events"),
    ],
)
def test_aedat4_whose_data_table_miscounts_a_packet_is_refused(tmp_path, events_factory, declared, message):
    """The result is allocated from the table's counts: each must be what its packet holds, and no more than the
    packet's bytes can expand to."""
    sensor = SensorSize(48, 64)
    path = write_with_dv(tmp_path / "counted.aedat4", events_factory(3000, sensor), sensor, "NONE")  # 3 x 1000
    buf = path.read_bytes()
    last, _, size = aedat4_packets(buf, {0})[-1]
    at = buf.index(struct.pack("<q", 1000), last + 8 + size)  # NumElements of the table's first entry
    path.write_bytes(buf[:at] + struct.pack("<q", declared) + buf[at + 8 :])
    with pytest.raises(EventFileError, match=message):
        read_events(path)


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        (10, r"truncated: the file ends inside the AEDAT4 version line \(10 bytes\)"),
        (100, "header size 2316 does not fit the 100-byte file"),
        (
            500_000,
            r"truncated: the file ends at byte 500000 but its data table starts at byte 945243 \(at least 445244",
        ),
        (947_000, r"the data table at byte 945243 ends before its LZ4 frame does \(cut or damaged\)"),
    ],
)
def test_truncated_aedat4_is_refused_naming_what_is_missing(data_dir, tmp_path, keep, message):
    path = tmp_path / "cut.aedat4"
    path.write_bytes((data_dir / "fixtures" / "inivation_sample.aedat4").read_bytes()[:keep])
    with pytest.raises(EventFileError, match=message):
        read_events(path)


def test_aedat4_of_a_killed_writer_reads_its_whole_packets(tmp_path, events_factory):
    """A writer that dies leaves the header it started with (no data table) and maybe half a packet."""
    sensor = SensorSize(48, 64)
    events = events_factory(3000, sensor, seed=7)
    buf = write_with_dv(tmp_path / "closed.aedat4", events, sensor).read_bytes()
    last, _, size = aedat4_packets(buf, {0})[-1]
    table_at = last + 8 + size
    at = buf.index(struct.pack("<q", table_at), len(aedat4.MAGIC))
    unclosed = buf[:at] + struct.pack("<q", -1) + buf[at + 8 : table_at]  # the IOHeader as written at the start
    whole = tmp_path / "whole.aedat4"
    whole.write_bytes(unclosed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same_events(read_events(whole).events, events)
    cut = tmp_path / "cut.aedat4"
    cut.write_bytes(unclosed[: last + 20])
    with pytest.warns(UserWarning, match=r"the last packet is cut \(\d+ bytes missing\).*read the 2 whole packets"):
        read = read_events(cut).events
    assert read.size == 2000
    assert_same_events(read, events[:2000])
    assert_same_as_dv(read, dv_events(cut))


# ------------------------------------------------------------------------------------------ writers


@pytest.mark.parametrize(
    ("suffix", "sensor", "read_sensor"),
    [
        (".dat", SensorSize(32, 48), SensorSize(32, 48)),  # header keeps the geometry
        (".h5", SensorSize(32, 48), SensorSize(32, 48)),  # events group attributes keep it
        (".bin", SensorSize(180, 240), None),  # no geometry: inferred
        (".bs2", SensorSize(34, 34), SensorSize(34, 34)),
        (".npz", SensorSize(32, 48), SensorSize(480, 640)),  # N-ImageNet geometry when the events fit
        (".evz", SensorSize(32, 48), SensorSize(32, 48)),  # the header keeps it
    ],
)
def test_written_files_read_back_identically(tmp_path, events_factory, suffix, sensor, read_sensor):
    events = events_factory(3000, sensor, seed=3, t0=1234)
    path = write_events(tmp_path / f"rec{suffix}", events, sensor)
    back, got_sensor = read_events(path)
    assert_same_events(back, events)
    expected = read_sensor or SensorSize(int(events["y"].max()) + 1, int(events["x"].max()) + 1)
    assert got_sensor == expected
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no partial file left behind


@pytest.mark.parametrize("suffix", [".dat", ".h5", ".npz", ".evz"])
def test_empty_recordings_round_trip(tmp_path, suffix):
    path = write_events(tmp_path / f"empty{suffix}", np.empty(0, EVENT_DTYPE), SensorSize(34, 34))
    assert read_events(path).events.size == 0


def test_bin_refuses_an_empty_recording(tmp_path):
    # A 0-byte file is what a failed copy leaves behind: reading one is an error, so writing one is too.
    with pytest.raises(ValueError, match="empty"):
        write_events(tmp_path / "empty.bin", np.empty(0, EVENT_DTYPE), SensorSize(34, 34))


def test_dat_crossing_the_32_bit_clock_wrap_round_trips(tmp_path, events_factory):
    events = events_factory(2000, t0=(1 << 32) - 50_000)  # ~200 ms of events, wrapping after 50 ms
    assert events["t"][0] < 1 << 32 <= events["t"][-1]
    path = write_events(tmp_path / "wrap.dat", events, SensorSize(32, 48))
    buf = path.read_bytes()
    stored = np.frombuffer(buf, dtype="<u4", offset=dat_header_end(buf) + 2)[0::2]
    assert np.any(np.diff(stored.astype(np.int64)) < 0)  # the file really holds a wrapped clock
    assert_same_events(read_events(path).events, events)


@pytest.mark.parametrize(
    ("t", "message"),
    [([1 << 32, (1 << 32) + 1], "first timestamp"), ([0, 1 << 31], "gap"), ([-1, 0], "first timestamp")],
)
def test_dat_writer_rejects_clocks_it_cannot_store(tmp_path, t, message):
    with pytest.raises(ValueError, match=message):
        write_events(tmp_path / "bad.dat", make_events(t, [0, 1], [0, 1], [0, 1]), SensorSize(4, 4))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("x", "y", "t", "message"),
    [
        (256, 0, 0, "8-bit coordinates"),
        (0, 300, 0, "8-bit coordinates"),
        (0, 240, 0, "y=240"),
        (0, 0, 1 << 23, "2\\^23"),
    ],
)
def test_bin_writer_rejects_what_the_format_cannot_hold(tmp_path, x, y, t, message):
    with pytest.raises(ValueError, match=message):
        write_events(tmp_path / "bad.bin", make_events([t], [x], [y], [1]), SensorSize(512, 512))


def test_writer_rejects_unknown_extensions_and_invalid_events(tmp_path, events_factory):
    with pytest.raises(ValueError, match=r"cannot write '\.txt'"):
        write_events(tmp_path / "a.txt", events_factory(10), SensorSize(32, 48))
    unsorted = events_factory(10)[::-1].copy()
    with pytest.raises(ValueError, match="not sorted"):
        write_events(tmp_path / "a.dat", unsorted, SensorSize(32, 48))
    with pytest.raises(ValueError, match="outside the sensor"):
        write_events(tmp_path / "a.dat", events_factory(100), SensorSize(8, 8))


def test_npz_is_the_n_imagenet_layout(tmp_path, events_factory):
    events = events_factory(500, SensorSize(480, 640))
    path = write_events(tmp_path / "sample.npz", events, SensorSize(480, 640))
    with np.load(path) as archive:
        data = archive["event_data"]
    assert set(data.dtype.names) == {"x", "y", "t", "p"}
    np.testing.assert_array_equal(data["t"], events["t"])
    np.testing.assert_array_equal(data["p"], events["p"].astype(bool))


def test_npz_with_signed_polarity_maps_minus_one_to_off(tmp_path):
    data = np.zeros(4, dtype=[("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "i1")])
    data["t"] = [5, 1, 2, 3]  # unsorted on purpose
    data["p"] = [1, -1, 1, -1]
    np.savez(tmp_path / "signed.npz", event_data=data)
    events, _ = read_events(tmp_path / "signed.npz")
    assert events["t"].tolist() == [1, 2, 3, 5] and events["p"].tolist() == [0, 1, 0, 1]


def test_npz_with_float_times_is_refused(tmp_path):
    data = np.zeros(3, dtype=[("x", "<u2"), ("y", "<u2"), ("t", "<f8"), ("p", "u1")])
    np.savez(tmp_path / "seconds.npz", event_data=data)
    with pytest.raises(EventFileError, match="integers"):
        read_events(tmp_path / "seconds.npz")


def test_h5_is_the_dsec_layout(tmp_path, events_factory):
    events = events_factory(5000, SensorSize(480, 640), t0=1_600_000_000_000_000)
    path = write_events(tmp_path / "events.h5", events, SensorSize(480, 640))
    with h5py.File(path, "r") as f:
        t_offset = int(f["t_offset"][()])
        rel = f["events/t"][()].astype(np.int64)
        ms_to_idx = f["ms_to_idx"][()]
        filter_id = f["events/x"].id.get_create_plist().get_filter(0)[0]
    assert filter_id == 32001  # Blosc, registered by hdf5plugin
    np.testing.assert_array_equal(rel + t_offset, events["t"])
    for m in range(len(ms_to_idx)):
        assert ms_to_idx[m] == np.searchsorted(rel, 1000 * m, side="left")
    assert ms_to_idx[-1] == events.size


def test_dsec_file_without_geometry_gets_the_dsec_sensor(tmp_path, events_factory):
    events = events_factory(100, SensorSize(480, 640))
    path = tmp_path / "events.h5"
    with h5py.File(path, "w") as f:  # as DSEC ships it: no attributes
        for k, dtype in (("x", "u2"), ("y", "u2"), ("t", "u4"), ("p", "u1")):
            f.create_dataset(f"events/{k}", data=events[k].astype(dtype))
        f.create_dataset("t_offset", data=np.int64(7))
        f.create_dataset("ms_to_idx", data=np.zeros(1, np.uint64))
    back, sensor = read_events(path)
    assert sensor == SensorSize(480, 640)
    np.testing.assert_array_equal(back["t"], events["t"] + 7)


# ------------------------------------------------------------------------------------------ decoding rules


def test_bin_overflow_marker_advances_later_timestamps(tmp_path):
    records = [(1, 2, 0x80, 0, 10), (0, 240, 0, 0, 0), (3, 4, 0x00, 0, 20)]  # event, overflow, event
    path = tmp_path / "overflow.bin"
    path.write_bytes(bytes(b for rec in records for b in rec))
    events, _ = read_events(path)
    assert events["t"].tolist() == [10, 20 + (1 << 13)]
    assert events["y"].tolist() == [2, 4] and events["p"].tolist() == [1, 0]


def test_dat_with_slightly_unordered_times_is_stably_sorted(tmp_path):
    t = [10, 30, 20, 30, 40]
    x = [0, 1, 2, 3, 4]
    rec = np.zeros(5, dtype=[("t", "<u4"), ("w", "<u4")])
    rec["t"], rec["w"] = t, x
    path = tmp_path / "jitter.dat"
    path.write_bytes(b"% Version 2\n% Width 8\n% Height 8\n" + bytes([0, 8]) + rec.tobytes())
    events, sensor = read_events(path)
    assert events["t"].tolist() == [10, 20, 30, 30, 40]
    assert events["x"].tolist() == [0, 2, 1, 3, 4]  # equal times keep the file order
    assert sensor == SensorSize(8, 8)


def test_evt3_vectors_and_time_base_wrap():
    words = evt3_words(
        0x8000 | 0xFFF,  # TIME_HIGH 0xFFF
        0x6000 | 0xFF0,  # TIME_LOW -> t = 0xFFFFF0
        0x0000 | 7,  # ADDR_Y y=7
        0x2000 | 0x800 | 5,  # ADDR_X x=5, ON
        0x3000 | 100,  # VECT_BASE_X x=100, OFF
        0x4000 | 0b100000000101,  # VECT_12: x=100, 102, 111; base -> 112
        0x5000 | 0b10000001,  # VECT_8: x=112, 119
        0x8000 | 0x000,  # TIME_HIGH wraps to 0: + 2^24
        0x6000 | 0x003,
        0x2000 | 9,  # ADDR_X x=9, OFF
    )
    from mem_core.io.evt import decode_evt3

    events, beyond_x, time_back = decode_evt3(np.frombuffer(words, dtype="<u2", offset=10))
    assert beyond_x == 0 and time_back == 0
    assert events["x"].tolist() == [5, 100, 102, 111, 112, 119, 9]
    assert events["y"].tolist() == [7] * 7
    assert events["p"].tolist() == [1, 0, 0, 0, 0, 0, 0]
    assert events["t"].tolist() == [0xFFFFF0] * 6 + [(1 << 24) + 3]


def test_evt2_time_high_wrap_continues_the_clock(tmp_path):
    def cd(kind, t_low, x, y):
        return kind << 28 | t_low << 22 | x << 11 | y

    words = [0x8 << 28 | 0x0FFFFFFF, cd(1, 63, 5, 6), 0x8 << 28 | 0, cd(0, 1, 7, 8)]
    path = tmp_path / "wrap.raw"
    path.write_bytes(b"% format EVT2;height=10;width=20\n% end\n" + np.asarray(words, "<u4").tobytes())
    events, sensor = read_events(path)
    assert sensor == SensorSize(10, 20)
    assert events["t"].tolist() == [(0x0FFFFFFF << 6) | 63, (1 << 34) | 1]
    assert events["p"].tolist() == [1, 0] and events["x"].tolist() == [5, 7]


def test_raw_geometry_header_and_events_outside_it(tmp_path):
    ok = tmp_path / "ok.raw"
    ok.write_bytes(b"% geometry 16x8\n% evt 3.0\n" + np.asarray([0x8000, 0x0003, 0x2000 | 15], "<u2").tobytes())
    assert read_events(ok).sensor == SensorSize(8, 16)
    bad = tmp_path / "bad.raw"
    bad.write_bytes(b"% geometry 16x8\n% evt 3.0\n" + np.asarray([0x8000, 0x2000 | 16], "<u2").tobytes())
    with pytest.raises(EventFileError, match="outside the 16x8"):
        read_events(bad)


# ------------------------------------------------------------------------------------------ errors


def test_error_names_the_path_and_reason_and_survives_pickling(tmp_path):
    missing = tmp_path / "nope.dat"
    with pytest.raises(EventFileError) as info:
        read_events(missing)
    err = info.value
    assert err.path == str(missing) and err.reason == "no such file or directory"
    assert str(err) == f"{missing}: no such file or directory"
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.reason, str(again)) == (err.path, err.reason, str(err))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.bin", b"", "empty file"),
        ("cut.bin", bytes(12), r"12 bytes is not a whole number of 5-byte events \(2 trailing bytes after 2 whole"),
        (
            "cut.dat",
            b"% Version 2\n" + bytes([0, 8]) + bytes(19),
            r"19 bytes of events .*\(3 trailing bytes after 2 whole records\)",
        ),
        ("headless.dat", bytes(16), "no '%' header"),
        ("noeol.dat", b"% Data file containing", "header ends without a newline"),
        ("notype.dat", b"% Version 2\n", "not followed by the event type"),
        ("v1.dat", b"% Version 1\n" + bytes([0, 8]), "version '1'"),
        ("trigger.dat", b"% Version 2\n" + bytes([14, 8]), "event type 14"),
        ("size.dat", b"% Version 2\n" + bytes([0, 16]), "event size 16"),
        ("geom.dat", b"% Width x\n% Height 2\n" + bytes([0, 8]), "unreadable sensor geometry"),
        ("odd.raw", b"% evt 3.0\n" + bytes(3), "whole number of 2-byte words"),
        ("evt21.raw", b"% format EVT21;height=720;width=1280\n" + bytes(8), "encoding 'evt21'"),
        ("none.raw", b"% date today\n" + bytes(8), "encoding none"),
        ("junk.npz", b"PK\x03\x04" + bytes(40), "corrupt .npz"),
        ("junk.h5", b"\x89HDF\r\n\x1a\n" + bytes(40), "corrupt HDF5"),
        ("junk.aedat4", b"#!AER-DAT4.0\r\n" + bytes(10), "header size 0"),
        ("junk.evz", b"MEMEVZ\x00\x01" + bytes(40), r"per x 0, per y 0 \(1 or 2\)"),
        ("notes.txt", b"hello", "unknown event file format"),
    ],
)
def test_broken_files_raise_event_file_error(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(EventFileError, match=message) as info:
        read_events(path)
    assert info.value.path == str(path)


def test_a_truncated_dat_says_how_to_keep_its_whole_records(tmp_path, events_factory):
    events = events_factory(100)
    whole = write_events(tmp_path / "rec.dat", events, SensorSize(32, 48)).read_bytes()
    cut = tmp_path / "cut file.dat"
    cut.write_bytes(whole[:-3])  # a copy interrupted inside the last record
    with pytest.raises(EventFileError, match="5 trailing bytes after 99 whole records") as info:
        read_events(cut)
    head, option, size, path, into, kept = shlex.split(str(info.value).split("keep them in a new file: ")[1])
    assert (head, option, path, into, kept) == ("head", "-c", str(cut), ">", "cut file-whole.dat")
    kept = tmp_path / kept
    kept.write_bytes(cut.read_bytes()[: int(size)])  # what the command keeps
    assert_same_events(read_events(kept).events, events[:99])


def test_npz_without_event_data_lists_its_keys(tmp_path):
    np.savez(tmp_path / "other.npz", frames=np.zeros(3))
    with pytest.raises(EventFileError, match=r"no 'event_data'.*\['frames'\]"):
        read_events(tmp_path / "other.npz")


def test_content_wins_over_extension(tmp_path, events_factory):
    events = events_factory(50)
    path = write_events(tmp_path / "rec.dat", events, SensorSize(32, 48))
    disguised = path.rename(tmp_path / "rec.bin")
    assert detect_format(disguised) == "dat"
    assert_same_events(read_events(disguised).events, events)


def test_directory_is_not_an_event_file(tmp_path):
    with pytest.raises(EventFileError, match="directory"):
        read_events(tmp_path)


# ------------------------------------------------------------------------------------------ implausible files
# Files that decode without a format error but cannot be recordings: random bytes behind a valid header, absurd
# geometry, declared sizes the file does not hold. Each is refused before it costs memory.

NCARS_HEADER = b"% Data file containing Event2d events.\n% Version 2\n% Date 2017-10-31 11:27:54\n" + bytes([0, 8])


@pytest.mark.parametrize(
    ("name", "head", "message"),
    [
        ("noise.dat", NCARS_HEADER, "time steps back by"),
        ("noise.bin", b"", "time steps back by"),
        ("noise.raw", b"% evt 2.0\n", "time-high words step back"),
        ("noise3.raw", b"% evt 3.0\n", "corrupt: "),
    ],
)
def test_random_bytes_behind_a_valid_header_are_refused(tmp_path, name, head, message):
    rng = np.random.default_rng(7)
    path = tmp_path / name
    path.write_bytes(head + rng.integers(0, 256, 40_000, dtype=np.uint8).tobytes())
    with pytest.raises(EventFileError, match=message) as info:
        read_events(path)
    assert info.value.path == str(path)


def test_dat_with_a_huge_declared_sensor_is_refused(tmp_path, events_factory):
    good = write_events(tmp_path / "a.dat", events_factory(100), SensorSize(32, 48)).read_bytes()
    path = tmp_path / "huge.dat"
    path.write_bytes(dat_with_geometry(good, 4294967295, 4294967295))
    with pytest.raises(EventFileError, match=r"corrupt header: implausible sensor 4294967295x4294967295"):
        read_events(path)


def test_events_far_off_any_real_sensor_are_refused(tmp_path):
    # .npz stores no geometry: one event at x = 65535 would otherwise make a 65536-pixel-wide sensor
    path = tmp_path / "far.npz"
    write_events(path, make_events([0, 1], [0, 65535], [0, 3], [1, 0]), SensorSize(4, 65536))
    with pytest.raises(EventFileError, match=r"implausible sensor 65536x4 .* 1\.\.8192"):
        read_events(path)


def test_npz_declaring_more_events_than_it_holds_is_refused_before_allocating(tmp_path):
    npz = io.BytesIO()
    np.savez(npz, event_data=np.zeros(100, dtype=[("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "?")]))
    path = tmp_path / "lying.npz"
    path.write_bytes(npz_declaring(npz.getvalue(), 10**13))
    with pytest.raises(EventFileError, match=r"declares shape \(10000000000000,\)"):
        read_events(path)


def test_h5_declaring_more_events_than_it_stores_is_refused_before_allocating(tmp_path):
    path = dsec_declaring(tmp_path / "events.h5", 1 << 40)  # nothing written
    assert path.stat().st_size < 100_000
    with pytest.raises(EventFileError, match=r"declare 9895604649984 bytes .* stores 0 bytes"):
        read_events(path)


def test_a_reader_running_out_of_memory_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_READERS", list(registry._READERS))

    def greedy(path: Path) -> EventFile:
        raise MemoryError("Unable to allocate 12.0 TiB")

    register_reader("greedy", None, greedy, (".greedy",))
    (tmp_path / "x.greedy").write_bytes(b"tiny")
    with pytest.raises(EventFileError, match=r"x\.greedy: decoding needs more memory .*12\.0 TiB"):
        read_events(tmp_path / "x.greedy")


# ------------------------------------------------------------------------------------------ describe, plug-ins


def test_describe_summarises_a_real_file_as_json(data_dir):
    path = sorted((data_dir / "ncars-dev" / "val" / "cars").glob("*.dat"))[0]
    events, sensor = read_events(path)
    info = json.loads(json.dumps(describe(path)))
    assert info == {
        "format": "dat",
        "events": events.size,
        "height": sensor.height,
        "width": sensor.width,
        "t_min": int(events["t"][0]),
        "t_max": int(events["t"][-1]),
        "on": int(np.count_nonzero(events["p"] == 1)),
        "off": int(np.count_nonzero(events["p"] == 0)),
    }


def test_describe_an_empty_recording(tmp_path):
    path = write_events(tmp_path / "empty.dat", np.empty(0, EVENT_DTYPE), SensorSize(10, 20))
    assert describe(path) == {
        "format": "dat",
        "events": 0,
        "height": 10,
        "width": 20,
        "t_min": None,
        "t_max": None,
        "on": 0,
        "off": 0,
    }


def test_registered_reader_can_claim_a_directory_and_files(tmp_path, monkeypatch, events_factory):
    monkeypatch.setattr(registry, "_READERS", list(registry._READERS))
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{}")
    events = events_factory(20)

    def sniff(path: Path, head: bytes) -> bool:
        return (path / "manifest.json").is_file() or head.startswith(b"STORE")

    register_reader("store", sniff, lambda path: EventFile(events, SensorSize(32, 48)), (".store",))
    assert detect_format(store) == "store"
    assert_same_events(read_events(store).events, events)
    (tmp_path / "x.store").write_bytes(b"anything")
    assert detect_format(tmp_path / "x.store") == "store"  # by extension when no sniffer claims it
    assert registry.formats()[0] == "store"


# ------------------------------------------------------------------------------------------ optional packages

OPTIONAL = ("hdf5plugin", "lz4", "zstandard", "zmq", "dv_processing")


def test_training_and_plain_files_need_none_of_the_optional_packages(data_dir, tmp_path, events_factory):
    """A GPU machine given only what training needs (no hdf5plugin, lz4, zstandard, ZMQ or dv-processing) imports
    the datasets and every training stage and reads .dat and .evz files; an AEDAT4 file then names what it lacks."""
    dat = sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[0]
    evz = write_events(tmp_path / "x.evz", events_factory(100), SensorSize(32, 48))
    aedat = data_dir / "fixtures" / "inivation_sample.aedat4"
    code = f"""
import json, sys
for name in {OPTIONAL!r}:
    sys.modules[name] = None  # import name raises ImportError
import mem_core.datasets, mem_core.train.experiment, mem_core.train.finetune, mem_core.train.pretrain
import mem_core.train.tokenizer
from mem_core.io import EventFileError, read_events
sizes = [read_events(path).events.size for path in sys.argv[1:3]]
try:
    read_events(sys.argv[3])
    error = None
except EventFileError as e:
    error = str(e)
print(json.dumps({{"sizes": sizes, "error": error}}))
"""
    run = subprocess.run(
        [sys.executable, "-c", code, str(dat), str(evz), str(aedat)], capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["sizes"] == [read_events(dat).events.size, 100]
    assert out["error"].startswith(f"{aedat}: LZ4-compressed AEDAT4 files need the Python package 'lz4'")
