"""Fuzzing the file boundaries: damaged and hostile files of every format the registry reads, corpora (shards and
manifests) and model files (an export, a finetune run's checkpoint and config) are each refused with the project's
own error naming the file, or read as valid data - within a time and a memory bound (``damaged_files.ChildReader``:
every file is read in a child process under an address-space limit).

The mutant sources: seeded byte mutants (truncations at several points, bit flips in the header and anywhere,
garbage behind a valid header), absurd declared sizes (sensor geometry, array shapes, HDF5 dimensions, event counts,
model dimensions), hypothesis-drawn bytes (random bytes behind a format's magic, cuts and damage anywhere in a real
file) and hand-built hostile files (``hostile.py``) that point outside themselves (HDF5 external storage, soft and
external links, virtual datasets, of FIFOs and devices among others), chunk bombs, values their fields cannot hold,
FIFOs, devices and sockets named like event files, corpora with such shards or with consistent but impossible values:
every hostile one must be refused.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from damaged_files import ChildReader
from hostile import (
    DSEC_COLUMNS,
    dat_with_geometry,
    dsec_declaring,
    dsec_with_geometry,
    external,
    filled,
    huge_chunks,
    linked,
    npz_declaring,
    soft_link,
    virtual,
    write_dsec,
    write_with_dv,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutants import byte_mutants, json_mutants

from mem_core.events import SensorSize, make_events
from mem_core.io import detect_format, registry, write_events

SEED = 17
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # the reader bounds time


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def event_reader(work) -> Iterator[ChildReader]:
    with ChildReader("events", work) as reader:
        yield reader


def write(work: Path, name: str, content: bytes) -> Path:
    """``content`` in a file of ``work`` with the extension of ``name`` (``x.aedat4`` or ``.aedat4``)."""
    path = work / f"case.{name.rsplit('.', 1)[-1]}"
    path.write_bytes(content)
    return path


# ------------------------------------------------------------------------------------------ event files


def replace(data: bytes, old: bytes, new: bytes) -> bytes:
    assert old in data, old
    return data.replace(old, new, 1)


def prophesee_header_end(data: bytes) -> int:
    pos = 0
    while data[pos : pos + 1] == b"%":
        pos = data.index(b"\n", pos) + 1
    return pos


Original = tuple[
    bytes, int, list[tuple[str, bytes]]
]  # the file's bytes, where its header ends, format-specific mutants


@pytest.fixture(scope="module")
def originals(data_dir, work) -> dict[str, Original]:
    """A file of every format the registry reads (real recordings from ../shared/data, and the .npz, DSEC .h5, .evz
    and dv-processing AEDAT4 layouts written here) by name, with the mutants only its format has."""
    rng = random.Random(SEED)
    gen = np.random.default_rng(SEED)
    n = 2000
    events = make_events(
        np.sort(gen.integers(0, 10**6, n)), gen.integers(0, 640, n), gen.integers(0, 480, n), gen.integers(0, 2, n)
    )
    sensor = SensorSize(480, 640)
    npz, h5, evz = (write_events(work / f"written{s}", events, sensor).read_bytes() for s in (".npz", ".h5", ".evz"))
    dat = sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[0].read_bytes()
    evt2 = (data_dir / "fixtures" / "prophesee_evt2_sample.raw").read_bytes()
    evt3 = (data_dir / "fixtures" / "prophesee_evt3_sample.raw").read_bytes()
    aedat4 = (data_dir / "fixtures" / "inivation_sample.aedat4").read_bytes()
    return {
        "ncars.dat": (
            dat,
            prophesee_header_end(dat) + 2,
            [
                ("huge geometry", dat_with_geometry(dat, 4294967295, 4294967295)),
                ("zero geometry", dat_with_geometry(dat, 0, 0)),
                ("no header", dat[prophesee_header_end(dat) + 2 :]),
            ],
        ),
        "nmnist.bs2": ((data_dir / "nmnist-small" / "1.bs2").read_bytes(), 0, []),
        "sample.bin": ((data_dir / "fixtures" / "nmnist_sample.bin").read_bytes(), 0, []),
        "evt2.raw": (
            evt2,
            prophesee_header_end(evt2),
            [("huge geometry", replace(evt2, b"% evt 2.0\n", b"% evt 2.0\n% geometry 99999999x99999999\n"))],
        ),
        "evt3.raw": (
            evt3,
            prophesee_header_end(evt3),
            [("huge format geometry", replace(evt3, b"% evt 3.0\n", b"% format EVT3;height=4294967295;width=1\n"))],
        ),
        "sample.aedat4": (
            aedat4,
            18,
            [
                ("huge header size", aedat4[:14] + (2**31 - 1).to_bytes(4, "little") + aedat4[18:]),
                ("negative header size", aedat4[:14] + (2**32 - 5).to_bytes(4, "little") + aedat4[18:]),
                # dv-processing 2.0.4 spins for good in its LZ4 loop on this one
                ("8 zero bytes in the first LZ4 packet", aedat4[:2835] + bytes(8) + aedat4[2843:]),
                *_aedat4_structure_mutants(aedat4, rng),
            ],
        ),
        **{
            f"dv-{kind.lower()}.aedat4": (written, 18, _aedat4_structure_mutants(written, rng))
            for kind in ("NONE", "ZSTD")  # flatbuffers as stored, and compressed
            for written in [write_with_dv(work / f"dv-{kind}.aedat4", events, sensor, kind, 4).read_bytes()]
        },
        "written.npz": (
            npz,
            npz.index(b"\n", npz.index(b"NUMPY")) + 1,
            [("huge declared shape", npz_declaring(npz, 10**13))],
        ),
        "written.h5": (
            h5,
            2048,
            [
                ("huge declared dims", dsec_declaring(work / "huge.h5", 1 << 40).read_bytes()),
                (
                    "huge geometry attributes",
                    dsec_with_geometry(write_events(work / "geometry.h5", events, sensor), 2**31, 2**31).read_bytes(),
                ),
            ],
        ),
        "aertb.h5": ((data_dir / "fixtures" / "nmnist_two_class.h5").read_bytes(), 2048, []),
        "written.evz": (
            evz,
            35,
            [
                ("huge declared count", evz[:12] + (2**63).to_bytes(8, "little") + evz[20:]),
                ("huge geometry", evz[:8] + bytes([255] * 4) + evz[12:]),
            ],
        ),
    }


def _aedat4_structure_mutants(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """Packet headers (stream id, size) and the IOHeader's data table position set to absurd or nearby values."""
    header_end = 18 + int.from_bytes(data[14:18], "little")
    packets, at = [], header_end
    while at + 8 <= len(data):
        stream, size = struct.unpack_from("<ii", data, at)
        if not 0 <= stream <= 16 or size <= 0 or at + 8 + size > len(data):
            break  # past the last packet: the data table
        packets.append(at)
        at += 8 + size
    table_at = at.to_bytes(8, "little")
    out = []
    for packet in rng.sample(packets, min(3, len(packets))):
        (size,) = struct.unpack_from("<i", data, packet + 4)
        for value in (2**31 - 1, 0, -1, size + 1, size - 1):
            content = data[: packet + 4] + value.to_bytes(4, "little", signed=True) + data[packet + 8 :]
            out.append((f"packet at {packet}: size {value}", content))
        for value in (7, -1):
            content = data[:packet] + value.to_bytes(4, "little", signed=True) + data[packet + 4 :]
            out.append((f"packet at {packet}: stream {value}", content))
    position = data.index(table_at, 14, header_end)
    for value in (-1, 2**62, header_end, packets[len(packets) // 2] + 3):
        content = data[:position] + value.to_bytes(8, "little", signed=True) + data[position + 8 :]
        out.append((f"data table position {value}", content))
    return out


# ------------------------------------------------------------------------------------------ corpora


def corpus_mutants(data_dir: Path, work: Path) -> list[tuple[str, Path]]:
    """(description, corpus directory): damaged shards (sealed and left open) and manifests."""
    from mem_core.corpus import CorpusWriter
    from mem_core.io import read_events

    rng = random.Random(SEED)
    base = work / "corpus-base"
    with CorpusWriter(base, min_free_bytes=0) as writer:
        for k, path in enumerate(sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[:4]):
            events, sensor = read_events(path)
            writer.add_recording(f"r{k}", events, sensor, label="cars")
            if k == 1:
                writer.rotate()
    manifest = json.loads((base / "manifest.json").read_text())
    out: list[tuple[str, Path]] = []

    def variant(label: str, change: Callable[[Path], None]) -> None:
        root = work / f"corpus-{len(out):03d}"
        shutil.copytree(base, root)
        change(root)
        out.append((label, root))

    shard = (base / "shard-00000.h5").read_bytes()
    for sealed in (True, False):
        for label, content in byte_mutants(shard, 4096, rng):

            def damage(root: Path, content=content, sealed=sealed) -> None:
                (root / "shard-00000.h5").write_bytes(content)
                if not sealed:  # as a shard whose writer died: opened with SWMR
                    text = (root / "manifest.json").read_text()
                    (root / "manifest.json").write_text(text.replace('"sealed": true', '"sealed": false', 1))

            variant(f"shard-00000.h5 ({'sealed' if sealed else 'left open'}): {label}", damage)
    for label, value in json_mutants(manifest, rng, 24):
        variant(f"manifest: {label}", lambda root, value=value: (root / "manifest.json").write_text(json.dumps(value)))
    for label, content in byte_mutants((base / "manifest.json").read_bytes(), 0, rng):
        variant(f"manifest bytes: {label}", lambda root, content=content: (root / "manifest.json").write_bytes(content))
    huge = copy.deepcopy(manifest)
    huge["shards"][0]["events"] = huge["recordings"][0]["n_events"] = 2**40
    variant(
        "manifest: 2^40 events in shard and recording",
        lambda root: (root / "manifest.json").write_text(json.dumps(huge)),
    )
    return out


# ------------------------------------------------------------------------------------------ model files


def model_mutants(work: Path) -> list[tuple[str, Path]]:
    """(description, export or run directory): damaged exports, checkpoints and run configs."""
    import torch

    from mem_core.configuration import to_dict
    from mem_core.models import MEMViT, TokenizerConfig, ViTConfig
    from mem_core.representation import InputSpec
    from mem_core.runs.export import export_random
    from mem_core.runs.rundir import RunDir

    rng = random.Random(SEED)
    arch = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, drop_path=0.0)
    tok = TokenizerConfig(img_size=32, num_layers=2, num_tokens=16, hidden_dim=8, codebook_dim=8, num_resnet_blocks=1)
    spec = InputSpec(size=(32, 32), n_max=2000)
    export = export_random(work / "export-base", architecture=arch, input_spec=spec, tokenizer=tok)
    run = RunDir.create(work / "run-base", "finetune", {"model": to_dict(arch), "input": to_dict(spec)}, resume=False)
    run.write_json("classes.json", {"classes": ["a", "b", "c"]})
    torch.manual_seed(SEED)
    run.save_checkpoint({"model": MEMViT(arch, 3).state_dict(), "epoch": 0}, best=True)
    out: list[tuple[str, Path]] = []

    def variant(base: Path, name: str, label: str, content: bytes) -> None:
        root = work / f"model-{len(out):03d}"
        shutil.copytree(base, root)
        (root / name).write_bytes(content)
        out.append((f"{name}: {label}", root))

    for base, name in ((export, "model.json"), (export, "tokenizer.json"), (run.path, "config.json")):
        for label, value in json_mutants(json.loads((base / name).read_text()), rng, 10):
            variant(base, name, label, json.dumps(value).encode())
    meta = json.loads((export / "model.json").read_text())
    for key, value in (("depth", 2**31), ("embed_dim", 2**40), ("img_size", 2**20), ("num_heads", 0)):
        huge = copy.deepcopy(meta)
        huge["architecture"][key] = value
        variant(export, "model.json", f"architecture {key} = {value}", json.dumps(huge).encode())
    for base, name in ((export, "model.safetensors"), (export, "tokenizer.safetensors"), (run.path, "best.pt")):
        data = (base / name).read_bytes()
        header = 8 + int.from_bytes(data[:8], "little") if name.endswith(".safetensors") else 512
        for label, content in byte_mutants(data, header, rng):
            variant(base, name, label, content)
    huge_header = (2**62).to_bytes(8, "little") + (export / "model.safetensors").read_bytes()[8:]
    variant(export, "model.safetensors", "header length 2^62", huge_header)
    return out


# ------------------------------------------------------------------------------------------ hostile files


def hostile_event_files(work: Path) -> list[tuple[str, Path]]:
    """(description, path) of files crafted to reach outside themselves or beyond their size: HDF5 columns stored
    in other files or devices, linked to a FIFO or mapped from one, chunks far larger than the data, values their
    event fields cannot hold; FIFOs, devices and sockets named like event files. Each must be refused by name."""
    fifo, secret = work / "fifo", work / "secret.txt"
    os.mkfifo(fifo)
    secret.write_bytes(bytes(range(256)))
    anywhere = {
        "stored in a regular file": external(secret),
        "linked to a FIFO": linked(h5py.ExternalLink(str(fifo), "/x")),
        "a soft link": soft_link,
        "a virtual dataset of a FIFO": virtual(fifo),
        "in chunks of 2^25 elements": huge_chunks,
        "int64 -2^63": filled(-(2**63), "<i8"),
        "uint64 2^64 - 1": filled(2**64 - 1, "<u8"),
    }
    coordinates = {"int32 70000": filled(70_000, "<i4"), "int16 -1": filled(-1, "<i2")}
    cases = [({name: make}, f"events/{name} {label}") for name in "xyt" for label, make in anywhere.items()]
    cases += [({name: make}, f"events/{name} {label}") for name in "xy" for label, make in coordinates.items()]
    cases += [({"p": make}, f"events/p {label}") for label, make in list(anywhere.items())[:5]]  # p holds any int
    cases.append((dict.fromkeys(DSEC_COLUMNS, external("/dev/zero", 1 << 31)), "every column stored in /dev/zero"))
    out = [(label, write_dsec(work / f"hostile-{k:03d}.h5", special)) for k, (special, label) in enumerate(cases)]

    def events_in_fifo(f):
        del f["events"]
        f["events"] = h5py.ExternalLink(str(fifo), "/events")

    for label, change in (
        ("t_offset 2^63 - 1", lambda f: f.__setitem__("t_offset", np.int64(2**63 - 1))),
        ("t_offset 2^64 - 1", lambda f: f.__setitem__("t_offset", np.uint64(2**64 - 1))),
        ("t_offset stored in a regular file", lambda f: external(secret, 1)(f, "t_offset", "<i8")),
        ("the events group linked to a FIFO", events_in_fifo),
    ):
        path = write_dsec(work / f"hostile-{len(out):03d}.h5")
        with h5py.File(path, "r+") as f:
            change(f)
        out.append((label, path))
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(work / "socket"))
    listener.close()  # the socket file stays
    for suffix in sorted(registry.extensions()):
        for label, target in (
            ("a FIFO", fifo),
            ("/dev/zero", "/dev/zero"),
            ("/dev/urandom", "/dev/urandom"),
            ("a socket", work / "socket"),
        ):
            path = work / f"special-{len(out):03d}{suffix}"
            path.symlink_to(target)
            out.append((f"{suffix} linking to {label}", path))
    return out


def hostile_corpora(data_dir: Path, work: Path) -> list[tuple[str, Path]]:
    """(description, corpus directory) of corpora crafted as ``hostile_event_files`` are, plus values a recording
    cannot hold written with valid checksums. Each must be refused by name."""
    from mem_core.corpus import CorpusWriter
    from mem_core.io import read_events

    fifo = work / "corpus-fifo"
    os.mkfifo(fifo)
    base = work / "hostile-base"
    with CorpusWriter(base, min_free_bytes=0) as writer:
        events, sensor = read_events(sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[0])
        writer.add_recording("r", events, sensor, label="cars")

    def column(name: str, make: Callable[[h5py.File, str, np.ndarray], None]) -> Callable[[Path], None]:
        """The shard's column ``name`` made anew by ``make(file, name, old values)``."""

        def change(root: Path) -> None:
            with h5py.File(root / "shard-00000.h5", "r+") as f:
                old = f[name][()]
                del f[name]
                make(f, name, old)

        return change

    def edit(name: str, value: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
        def change(root: Path) -> None:
            with h5py.File(root / "shard-00000.h5", "r+") as f:
                f[name][:] = value(f[name][()])

        return change

    def swap(name: str, target) -> Callable[[Path], None]:
        def change(root: Path) -> None:
            (root / name).unlink()
            (root / name).symlink_to(target)

        return change

    changes = {
        "t linked to a FIFO": column(
            "t", lambda f, name, old: linked(h5py.ExternalLink(str(fifo), "/t"))(f, name, old.dtype)
        ),
        "x stored in /dev/zero": column("x", lambda f, name, old: external("/dev/zero", old.size)(f, name, old.dtype)),
        "p a virtual dataset of a FIFO": column("p", lambda f, name, old: virtual(fifo, old.shape)(f, name, old.dtype)),
        "t_index a soft link": column("t_index", lambda f, name, old: linked(h5py.SoftLink("/t"))(f, name, old.dtype)),
        "y in chunks of 2^25 events": column(
            "y", lambda f, name, old: f.create_dataset(name, data=old, chunks=(1 << 25,), maxshape=(None,))
        ),
        "x beyond the sensor": edit("x", lambda x: x + 5000),
        "polarity 7": edit("p", lambda p: np.full_like(p, 7)),
        "time reversed": edit("t", lambda t: t[::-1]),
        "the shard linking to /dev/zero": swap("shard-00000.h5", "/dev/zero"),
        "the manifest a FIFO": swap("manifest.json", fifo),
    }
    out = []
    for label, change in changes.items():
        root = work / f"hostile-corpus-{len(out):03d}"
        shutil.copytree(base, root)
        change(root)
        out.append((label, root))
    return out


# ------------------------------------------------------------------------------------------ the tests


def test_the_mutants_come_from_a_file_of_every_format_the_registry_reads(originals, work):
    formats = {detect_format(write(work, name, data)) for name, (data, _, _) in originals.items()}
    assert formats == set(registry.formats())


def test_event_file_mutants_are_refused_by_name_or_read_as_events(originals, event_reader, work):
    rng = random.Random(SEED)
    cases = []
    for name, (data, header, extra) in originals.items():
        for label, content in [*byte_mutants(data, header, rng), *extra]:
            path = work / f"m{len(cases):03d}-{name}"
            path.write_bytes(content)
            cases.append((f"{name}: {label}", path))
    counts = event_reader.check(cases)
    assert counts["refused"] > len(cases) // 2, counts  # the mutants do damage: most are refused


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


def read_or_refused(reader: ChildReader, path: Path) -> None:
    outcome = reader.read(path)
    assert outcome.fine, outcome


@FUZZ
@given(
    prefix=st.sampled_from(PREFIXES),
    tail=st.binary(max_size=2048),
    suffix=st.sampled_from(sorted(registry.extensions())),
)
def test_random_bytes_are_read_or_refused(event_reader, work, prefix, tail, suffix):
    read_or_refused(event_reader, write(work, suffix, prefix + tail))


@FUZZ
@given(data=st.data())
def test_truncated_real_files_are_read_or_refused(originals, event_reader, work, data):
    name = data.draw(st.sampled_from(sorted(originals)))
    content = originals[name][0]
    cut = data.draw(st.integers(0, len(content) - 1))
    read_or_refused(event_reader, write(work, name, content[:cut]))


@FUZZ
@given(data=st.data())
def test_damaged_real_files_are_read_or_refused(originals, event_reader, work, data):
    name = data.draw(st.sampled_from(sorted(originals)))
    content = bytearray(originals[name][0])
    for _ in range(data.draw(st.integers(1, 16))):
        content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
    read_or_refused(event_reader, write(work, name, bytes(content)))


@FUZZ
@given(data=st.data())
def test_cut_or_damaged_aedat4_is_read_or_refused(originals, event_reader, work, data):
    """AEDAT4 cut or damaged in any part (header, packet headers, LZ4 frames, data table)."""
    content = bytearray(originals["sample.aedat4"][0])
    if data.draw(st.booleans()):
        content = content[: data.draw(st.integers(0, len(content) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
    read_or_refused(event_reader, write(work, ".aedat4", bytes(content)))


def test_hostile_event_files_are_refused_by_name(event_reader, tmp_path):
    cases = hostile_event_files(tmp_path)
    counts = event_reader.check(cases)
    assert counts["refused"] == len(cases), counts


def test_corpus_mutants_are_refused_by_name_or_read_whole(data_dir, tmp_path):
    cases = corpus_mutants(data_dir, tmp_path)
    with ChildReader("corpus", tmp_path) as reader:
        counts = reader.check(cases)
    assert counts["refused"] > len(cases) // 2, counts


def test_hostile_corpora_are_refused_by_name(data_dir, tmp_path):
    cases = hostile_corpora(data_dir, tmp_path)
    with ChildReader("corpus", tmp_path) as reader:
        counts = reader.check(cases)
    assert counts["refused"] == len(cases), counts


def test_model_file_mutants_are_refused_by_name_or_load(tmp_path):
    cases = model_mutants(tmp_path)
    with ChildReader("model", tmp_path) as reader:
        counts = reader.check(cases)
    assert counts["refused"] > len(cases) // 2, counts
