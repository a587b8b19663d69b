"""Crafted hostile event files: each is refused with one line naming the file and what is wrong, before it can
read another file, hang on a special file or allocate beyond what it stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import synthetic_events
from hostile import N, external, holding, huge_chunks, linked, soft_link, virtual, write_dsec

from mem_core.corpus import Corpus, CorpusError, CorpusWriter
from mem_core.events import SensorSize
from mem_core.io import EventFileError, aedat4, describe, evz, hdf5, nbin, npz, prophesee, read_events

FIFO_GRACE_S = 15


@pytest.fixture
def fifo(tmp_path) -> Iterator[Path]:
    """A FIFO that a helper process opens for writing after ``FIFO_GRACE_S``: a reader blocked on it (HDF5 holds the
    GIL while it waits) then gets an empty file and the test fails instead of hanging."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    unblock = f"import os, time; time.sleep({FIFO_GRACE_S}); os.close(os.open({str(path)!r}, os.O_WRONLY))"
    helper = subprocess.Popen([sys.executable, "-c", unblock])
    yield path
    helper.kill()
    helper.wait()


# ------------------------------------------------------------------------------------------ HDF5 indirection


def test_h5_column_stored_in_another_file_is_refused_not_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    path = write_dsec(tmp_path / "events.h5", {"p": external(secret)})
    with pytest.raises(EventFileError, match=r"events\.h5: refused: dataset events/p keeps its data in external files"):
        read_events(path)
    events, _ = read_events(path, follow_links=True)  # the user's opt-in
    np.testing.assert_array_equal(events["p"], np.frombuffer(secret.read_bytes()[:N], np.uint8) > 0)


def test_h5_external_link_to_a_fifo_is_refused_without_opening_it(tmp_path, fifo):
    path = tmp_path / "events.h5"
    with h5py.File(path, "w") as f:
        f["events"] = h5py.ExternalLink(str(fifo), "/events")
    with pytest.raises(EventFileError, match=r"events\.h5: refused: /events is an external link"):
        describe(path)


def test_h5_virtual_dataset_with_a_fifo_source_is_refused_without_opening_it(tmp_path, fifo):
    path = write_dsec(tmp_path / "events.h5", {"x": virtual(fifo)})
    with pytest.raises(EventFileError, match=r"refused: dataset events/x is a virtual dataset"):
        read_events(path)


def test_h5_soft_link_is_refused_unless_links_are_followed(tmp_path):
    path = write_dsec(tmp_path / "events.h5", {"t": soft_link})
    with pytest.raises(EventFileError, match=r"refused: /events/t is a soft link"):
        read_events(path)
    events, sensor = read_events(path, follow_links=True)
    np.testing.assert_array_equal(events["t"], np.arange(N))
    assert sensor == SensorSize(480, 640)


# ------------------------------------------------------------------------------------------ corpus shards


def corpus_with_shard_column(root: Path, name: str, replace: Callable[[h5py.File, str], None]) -> Corpus:
    """A one-recording corpus whose shard column ``name`` was replaced by ``replace(file, name)``."""
    with CorpusWriter(root, min_free_bytes=0) as writer:
        writer.add_recording("a", synthetic_events(100), SensorSize(32, 48))
    with h5py.File(root / "shard-00000.h5", "r+") as f:
        del f[name]
        replace(f, name)
    return Corpus(root)


def test_shard_column_linked_to_a_fifo_is_refused_without_opening_it(tmp_path, fifo):
    link = linked(h5py.ExternalLink(str(fifo), "/t"))
    corpus = corpus_with_shard_column(tmp_path / "c", "t", lambda f, name: link(f, name, "<i8"))
    with pytest.raises(CorpusError, match=r"shard-00000\.h5: refused shard \(/t is an external link"):
        corpus.events(0)


def test_shard_column_stored_in_another_file_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(bytes(range(100)))

    corpus = corpus_with_shard_column(tmp_path / "c", "p", lambda f, name: external(secret, 100)(f, name, "u1"))
    assert "refused shard (dataset p keeps its data in external files" in corpus.check()["shard-00000.h5"]


# ------------------------------------------------------------------------------------------ special files


def test_fifo_named_like_an_event_file_is_refused_without_blocking(tmp_path, fifo):
    path = tmp_path / "x.dat"
    fifo.rename(path)
    with pytest.raises(EventFileError, match=r"x\.dat: not a regular file \(a FIFO\)"):
        describe(path)


@pytest.mark.parametrize(
    "read",
    [
        read_events,
        nbin.read_bin,
        prophesee.read_dat,
        prophesee.read_raw,
        npz.read_npz,
        hdf5.read_dsec,
        aedat4.read_aedat4,
        evz.read_evz,
    ],
)
def test_every_reader_refuses_a_link_to_a_device(tmp_path, read):
    path = tmp_path / "x.dat"
    path.symlink_to("/dev/null")  # /dev/zero would never end: a reader must not even start
    with pytest.raises(EventFileError, match=r"x\.dat: not a regular file \(a character device\)"):
        read(path)


def test_a_link_to_a_regular_file_is_read_as_that_file(tmp_path):
    target = write_dsec(tmp_path / "real.h5")
    (tmp_path / "link.h5").symlink_to(target)
    np.testing.assert_array_equal(read_events(tmp_path / "link.h5").events, read_events(target).events)


def test_corpus_manifest_or_shard_that_is_no_regular_file_is_refused(tmp_path, fifo):
    root = tmp_path / "c"
    corpus = corpus_with_shard_column(root, "p", lambda f, name: f.create_dataset(name, data=np.zeros(100, "u1")))
    (root / "shard-00000.h5").unlink()
    (root / "shard-00000.h5").symlink_to("/dev/null")
    with pytest.raises(CorpusError, match=r"shard-00000\.h5: cannot open shard \(not a regular file \(a character"):
        corpus.events(0)
    (root / "manifest.json").unlink()
    fifo.rename(root / "manifest.json")
    with pytest.raises(CorpusError, match=r"manifest\.json: corrupt corpus manifest \(not a regular file \(a FIFO"):
        Corpus(root)


# ------------------------------------------------------------------------------------------ bombs


def test_h5_with_chunks_far_larger_than_its_data_is_refused_before_reading(tmp_path):
    path = write_dsec(tmp_path / "events.h5", {"p": huge_chunks})
    assert path.stat().st_size < 200_000
    with pytest.raises(EventFileError, match=r"refused: dataset events/p comes in chunks of \(33554432,\) elements"):
        read_events(path)


def test_shard_with_chunks_far_larger_than_a_window_is_refused(tmp_path):
    corpus = corpus_with_shard_column(tmp_path / "c", "x", lambda f, name: huge_chunks(f, name, "<u2"))
    with pytest.raises(CorpusError, match=r"shard-00000\.h5: refused shard \(dataset x comes in chunks of"):
        corpus.window(0, 0, 10)


def test_aedat4_expanding_far_beyond_any_recording_is_refused(tmp_path):
    import dv_processing as dv

    config = dv.io.MonoCameraWriter.EventOnlyConfig("test", (64, 48), dv.CompressionType.LZ4)
    writer = dv.io.MonoCameraWriter(str(tmp_path / "bomb.aedat4"), config)
    store = dv.EventStore()
    for _ in range(100_000):  # one event over and over: LZ4 packs 1.6 MB of them into a few kilobytes
        store.push_back(0, 0, 0, False)
    writer.writeEvents(store)
    del writer  # closing writes the data table
    size = (tmp_path / "bomb.aedat4").stat().st_size
    assert size * aedat4.MAX_FILE_EXPANSION < 100_000 * 16
    with pytest.raises(
        EventFileError,
        match=rf"bomb\.aedat4: corrupt: the event packets decompress to more than 64 x the file's {size} bytes",
    ):
        read_events(tmp_path / "bomb.aedat4")


# ------------------------------------------------------------------------------------------ values beyond their types


def write_npz(path: Path, **columns) -> Path:
    """An N-ImageNet .npz whose fields take the dtypes of the given columns."""
    data = np.zeros(len(columns["t"]), dtype=[(k, np.asarray(v).dtype) for k, v in columns.items()])
    for k, v in columns.items():
        data[k] = v
    np.savez(path, event_data=data)
    return path


def dsec_with(path: Path, t_offset: np.generic | None = None, **columns: np.ndarray) -> Path:
    """The small DSEC layout with the given columns (any dtype) and ``t_offset``."""
    return write_dsec(path, {name: holding(values) for name, values in columns.items()}, t_offset)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda p: write_npz(p / "x.npz", x=[1, 2], y=[1, 2], t=np.array([-(2**63), 2**63 - 1]), p=[0, 1]),
            r"x\.npz: corrupt: t spans -9223372036854775808\.\.9223372036854775807, outside",
        ),
        (
            lambda p: write_npz(p / "x.npz", x=[1, 2], y=[1, 2], t=np.array([0, 2**64 - 1], np.uint64), p=[0, 1]),
            r"x\.npz: corrupt: t spans 0\.\.18446744073709551615",
        ),
        (
            lambda p: dsec_with(p / "x.h5", t_offset=np.int64(2**63 - 1)),
            r"x\.h5: corrupt: events/t \+ t_offset spans 9223372036854775807\.\.",
        ),
        (
            lambda p: dsec_with(p / "x.h5", t_offset=np.uint64(2**64 - 1)),
            r"x\.h5: corrupt: events/t \+ t_offset spans 18446744073709551615\.\.",
        ),
        (
            lambda p: dsec_with(p / "x.h5", x=np.full(N, 70_000, np.int32)),
            r"x\.h5: corrupt: events/x spans 70000\.\.70000, outside \[0, 65535\]",
        ),
        (
            lambda p: dsec_with(p / "x.h5", t=np.full(N, 2**64 - 1, np.uint64)),
            r"x\.h5: corrupt: events/t \+ t_offset spans 18446744073709551615",
        ),
    ],
)
def test_values_the_event_dtype_cannot_hold_are_refused_not_wrapped(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(EventFileError, match=message):
        read_events(path)


# ------------------------------------------------------------------------------------------ header fields


def aedat4_with_streams(sample: bytes, old: bytes, new: bytes) -> bytes:
    """The AEDAT4 sample with ``old`` replaced by ``new`` in its IOHeader's XML (the last field of the flatbuffer;
    its length and the header size follow)."""
    size = int.from_bytes(sample[14:18], "little")
    header = sample[18 : 18 + size]
    at = header.index(b"<dv")
    xml = header[at:-1].replace(old, new, 1)
    assert new in xml
    header = header[: at - 4] + len(xml).to_bytes(4, "little") + xml + b"\0"
    return sample[:14] + len(header).to_bytes(4, "little") + header + sample[18 + size :]


@pytest.mark.parametrize("name", ["²".encode(), b"9" * 5000])
def test_aedat4_stream_name_that_is_no_stream_id_is_refused(data_dir, tmp_path, name):
    sample = (data_dir / "fixtures" / "inivation_sample.aedat4").read_bytes()
    path = tmp_path / "x.aedat4"
    path.write_bytes(aedat4_with_streams(sample, b'<node name="2"', b'<node name="' + name + b'"'))
    with pytest.raises(EventFileError, match=r"x\.aedat4: corrupt: stream name '.{1,20}' in the IOHeader is not a"):
        describe(path)


def test_dat_version_of_5000_digits_is_refused(tmp_path):
    path = tmp_path / "x.dat"
    path.write_bytes(b"% Version " + b"9" * 5000 + b"\n% Width 8\n% Height 8\n" + bytes([0, 8]) + bytes(16))
    with pytest.raises(EventFileError, match=r"x\.dat: unsupported \.dat version '.{1,20}' \(only version 2"):
        describe(path)


def test_npz_field_holding_several_values_per_event_is_refused(tmp_path):
    data = np.zeros(4, dtype=[("x", "<u2", (2,)), ("y", "<u2"), ("t", "<i8"), ("p", "?")])
    np.savez(tmp_path / "x.npz", event_data=data)
    with pytest.raises(EventFileError, match=r"x\.npz: 'event_data' must be a 1-D structured array with one value"):
        read_events(tmp_path / "x.npz")


def test_inspect_of_a_path_longer_than_the_system_allows_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from app.cli import app

    result = CliRunner().invoke(app, ["inspect", str(tmp_path / ("a" * 5000))])
    assert isinstance(result.exception, EventFileError)  # what `mem` prints as one line, not an OSError traceback
    assert "File name too long" in str(result.exception)


def test_inspect_and_ingest_read_a_file_that_keeps_data_elsewhere_only_when_asked(tmp_path):
    from typer.testing import CliRunner

    from app.cli import app
    from mem_core.corpus import Corpus
    from recorders.config import IngestConfig
    from recorders.ingest import run

    folder = tmp_path / "in"
    folder.mkdir()
    path = write_dsec(folder / "events.h5", {"t": soft_link})
    refused = CliRunner().invoke(app, ["inspect", str(path)])
    assert isinstance(refused.exception, EventFileError) and "--follow-links reads it" in str(refused.exception)
    shown = CliRunner().invoke(app, ["inspect", str(path), "--json", "--follow-links"])
    assert shown.exit_code == 0 and json.loads(shown.output)["events"] == N
    listed = CliRunner().invoke(app, ["inspect", str(folder), "--json"])
    assert "soft link" in json.loads(listed.output)["files"][0]["error"]

    def ingest(out, **kwargs):
        return run(IngestConfig(paths=(folder,), out=out, progress=False, min_free_bytes=0, **kwargs))

    assert "soft link" in ingest(tmp_path / "plain").failed[0]["reason"]
    assert ingest(tmp_path / "linked", follow_links=True).ok
    np.testing.assert_array_equal(Corpus(tmp_path / "linked").events(0)["t"], np.arange(N))
