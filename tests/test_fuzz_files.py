"""Fuzzing the file boundaries with mutants of real files: each is refused with the project's own error naming the
file, or read as valid data - within a time and a memory bound.

Mutants (seeded, a fixed number per file) of every event format (real recordings from ../shared/data, plus the
.npz, DSEC .h5 and .evz layouts written here), of a corpus (its shards and its manifest) and of model files (an export,
a finetune run's checkpoint and config): truncations at several points, bit flips in the header and anywhere,
garbage behind a valid header, absurd declared sizes (sensor geometry, array shapes, HDF5 dimensions, event
counts, model dimensions). Hostile families are crafted rather than mutated: files that point outside themselves
(HDF5 external storage, soft and external links, virtual datasets, of FIFOs and devices among others), chunk bombs,
values their fields cannot hold, FIFOs, devices and sockets named like event files, corpora with such shards or
with consistent but impossible values; every one of them must be refused. Each family is read in a child process
(this file run as a script) under an address-space limit of what the child holds after its imports plus
``BUDGET_BYTES``, and a timeout: a hang, a crash, a MemError or any exception other than the project's own fails
the test naming the mutant.
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
import re
import resource
import shutil
import struct
import subprocess
import sys
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

SEED = 17
BUDGET_BYTES = 1 << 30  # memory a reader may take beyond the child's baseline (imports, numba, torch)
MUTANT_SECONDS = 20.0  # the time bound per mutant
BATCH_TIMEOUT_S = 150
ABSURD = [2**62, 2**31, -1, 0, 1e308, "x", None, [], {}, True]


# ------------------------------------------------------------------------------------------ mutations


def truncations(data: bytes, header: int) -> Iterator[tuple[str, bytes]]:
    """Cuts inside and right after the header, and at several points of the body."""
    points = {1, header // 2, header - 1, header, header + 1, header + 3}
    points |= {int(len(data) * f) for f in (0.1, 0.5, 0.9)} | {len(data) - 1}
    for n in sorted(p for p in points if 0 < p < len(data)):
        yield f"cut at {n}", data[:n]


def flips(data: bytes, lo: int, hi: int, rng: random.Random, count: int, bits: int) -> Iterator[tuple[str, bytes]]:
    """``count`` mutants with ``bits`` random bit flips each in ``data[lo:hi]``."""
    for k in range(count):
        out = bytearray(data)
        for _ in range(bits):
            i = rng.randrange(lo, min(hi, len(data)))
            out[i] ^= 1 << rng.randrange(8)
        yield f"{bits} flips in [{lo}, {hi}) #{k}", bytes(out)


def garbage(data: bytes, header: int, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """The header followed by random bytes (as long as the real body, and a short run)."""
    for n in (len(data) - header, 64):
        yield f"header + {n} random bytes", data[:header] + rng.randbytes(n)


def mutants(
    data: bytes, header: int, rng: random.Random, extra: list[tuple[str, bytes]] = (), flipped: int = 6
) -> list[tuple[str, bytes]]:
    """The standard mutant set of a file whose header ends at ``header``, plus format-specific ones."""
    return [
        *truncations(data, header),
        *flips(data, 0, max(header, 16), rng, flipped, 3),
        *flips(data, 0, len(data), rng, flipped, 8),
        *garbage(data, header, rng),
        *extra,
    ]


def replace(data: bytes, old: bytes, new: bytes) -> bytes:
    assert old in data, old
    return data.replace(old, new, 1)


def prophesee_header_end(data: bytes) -> int:
    pos = 0
    while data[pos : pos + 1] == b"%":
        pos = data.index(b"\n", pos) + 1
    return pos


def json_mutants(value: dict, rng: random.Random, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` copies of ``value``, each with one random leaf replaced by an absurd value, or removed."""
    leaves: list[tuple] = []

    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
        if items is None:
            leaves.append(path)
            return
        for key, child in items:
            walk(child, (*path, key))

    walk(value, ())
    for _ in range(count):
        path = rng.choice(leaves)
        out = copy.deepcopy(value)
        parent = out
        for key in path[:-1]:
            parent = parent[key]
        new = rng.choice([*ABSURD, "remove"])
        if new == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = new if new != "remove" else None
        yield f"{'/'.join(map(str, path))} = {new!r}", out


# ------------------------------------------------------------------------------------------ the mutant sets


def event_file_mutants(data_dir: Path, work: Path) -> list[tuple[str, bytes, str]]:
    """(description, bytes, file name) for every event format."""
    from mem_core.events import SensorSize, make_events
    from mem_core.io import write_events

    rng = random.Random(SEED)
    gen = np.random.default_rng(SEED)
    n = 2000
    events = make_events(
        np.sort(gen.integers(0, 10**6, n)), gen.integers(0, 640, n), gen.integers(0, 480, n), gen.integers(0, 2, n)
    )
    written = {
        s: write_events(work / f"written{s}", events, SensorSize(480, 640)).read_bytes()
        for s in (".npz", ".h5", ".evz")
    }
    dat = sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[0].read_bytes()
    evt2 = (data_dir / "fixtures" / "prophesee_evt2_sample.raw").read_bytes()
    evt3 = (data_dir / "fixtures" / "prophesee_evt3_sample.raw").read_bytes()
    aedat4 = (data_dir / "fixtures" / "inivation_sample.aedat4").read_bytes()
    npz, h5, evz = written[".npz"], written[".h5"], written[".evz"]
    sets = {
        "ncars.dat": (
            dat,
            prophesee_header_end(dat) + 2,
            [
                (
                    "huge geometry",
                    replace(dat, b"% Version 2\n", b"% Version 2\n% Width 4294967295\n% Height 4294967295\n"),
                ),
                ("zero geometry", replace(dat, b"% Version 2\n", b"% Version 2\n% Width 0\n% Height 0\n")),
                ("no header", dat[prophesee_header_end(dat) + 2 :]),
            ],
        ),
        "nmnist.bs2": ((data_dir / "nmnist-small" / "1.bs2").read_bytes(), 0, []),
        "sample.bin": ((data_dir / "fixtures" / "nmnist_sample.bin").read_bytes(), 0, []),
        "evt2.raw": (
            evt2,
            prophesee_header_end(evt2),
            [
                ("huge geometry", replace(evt2, b"% evt 2.0\n", b"% evt 2.0\n% geometry 99999999x99999999\n")),
            ],
        ),
        "evt3.raw": (
            evt3,
            prophesee_header_end(evt3),
            [
                ("huge format geometry", replace(evt3, b"% evt 3.0\n", b"% format EVT3;height=4294967295;width=1\n")),
            ],
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
            for kind, written in _aedat4_written_by_dv(work, events).items()
        },
        "written.npz": (
            npz,
            npz.index(b"\n", npz.index(b"NUMPY")) + 1,
            [
                ("huge declared shape", _npz_with_huge_shape(npz)),
            ],
        ),
        "written.h5": (
            h5,
            2048,
            [
                ("huge declared dims", _h5_with_huge_dims(work)),
                ("huge geometry attributes", _h5_with_geometry(work, events, 2**31)),
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
    out = []
    for name, (data, header, extra) in sets.items():
        for label, content in mutants(data, header, rng, extra):
            out.append((f"{name}: {label}", content, name))
    return out


def _aedat4_written_by_dv(work: Path, events: np.ndarray) -> dict[str, bytes]:
    """``events`` written by dv-processing in 4 packets, uncompressed (flatbuffers as stored) and with ZSTD."""
    import dv_processing as dv

    out = {}
    for kind in ("NONE", "ZSTD"):
        path = work / f"dv-{kind}.aedat4"
        writer = dv.io.MonoCameraWriter(
            str(path), dv.io.MonoCameraWriter.EventOnlyConfig("fuzz", (640, 480), getattr(dv.CompressionType, kind))
        )
        for part in np.array_split(events, 4):
            store = dv.EventStore()
            for t, x, y, p in part.tolist():
                store.push_back(t, x, y, bool(p))
            writer.writeEvents(store)
        del writer  # closing writes the data table
        out[kind] = path.read_bytes()
    return out


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


def _npz_with_huge_shape(npz: bytes) -> bytes:
    """The .npz with its array header declaring 10^13 events (a valid archive: the CRC matches the new bytes)."""
    with zipfile.ZipFile(io.BytesIO(npz)) as archive:
        npy = archive.read("event_data.npy")
    shape = re.search(rb"'shape': \(\d+,\), } *", npy).group()
    new = b"'shape': (10000000000000,), }"
    npy = npy.replace(shape, new.ljust(len(shape)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("event_data.npy", npy)
    return out.getvalue()


def _h5_with_huge_dims(work: Path) -> bytes:
    """A DSEC layout whose datasets declare 2^40 events and store none."""
    import h5py

    path = work / "huge.h5"
    with h5py.File(path, "w") as f:
        for name, dtype in (("x", "<u2"), ("y", "<u2"), ("t", "<u4"), ("p", "u1")):
            f.create_dataset(f"events/{name}", shape=(1 << 40,), maxshape=(None,), chunks=(1 << 14,), dtype=dtype)
    return path.read_bytes()


def _h5_with_geometry(work: Path, events: np.ndarray, side: int) -> bytes:
    import h5py

    from mem_core.events import SensorSize
    from mem_core.io import write_events

    path = write_events(work / "geometry.h5", events, SensorSize(480, 640))
    with h5py.File(path, "r+") as f:
        f["events"].attrs["width"] = side
        f["events"].attrs["height"] = side
    return path.read_bytes()


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
        for label, content in mutants(shard, 4096, rng):

            def damage(root: Path, content=content, sealed=sealed) -> None:
                (root / "shard-00000.h5").write_bytes(content)
                if not sealed:  # as a shard whose writer died: opened with SWMR
                    text = (root / "manifest.json").read_text()
                    (root / "manifest.json").write_text(text.replace('"sealed": true', '"sealed": false', 1))

            variant(f"shard-00000.h5 ({'sealed' if sealed else 'left open'}): {label}", damage)
    for label, value in json_mutants(manifest, rng, 24):
        variant(f"manifest: {label}", lambda root, value=value: (root / "manifest.json").write_text(json.dumps(value)))
    for label, content in mutants((base / "manifest.json").read_bytes(), 0, rng):
        variant(f"manifest bytes: {label}", lambda root, content=content: (root / "manifest.json").write_bytes(content))
    huge = copy.deepcopy(manifest)
    huge["shards"][0]["events"] = huge["recordings"][0]["n_events"] = 2**40
    variant(
        "manifest: 2^40 events in shard and recording",
        lambda root: (root / "manifest.json").write_text(json.dumps(huge)),
    )
    return out


def hostile_event_files(work: Path) -> list[tuple[str, Path]]:
    """(description, path) of files crafted to reach outside themselves or beyond their size: HDF5 columns stored
    in other files or devices, linked to a FIFO or mapped from one, chunks far larger than the data, values their
    event fields cannot hold; FIFOs, devices and sockets named like event files. Each must be refused by name."""
    import socket

    import h5py

    fifo, secret, n = work / "fifo", work / "secret.txt", 16
    os.mkfifo(fifo)
    secret.write_bytes(bytes(range(256)))
    columns = {"x": "<u2", "y": "<u2", "t": "<u4", "p": "u1"}

    def external(target, count):
        def make(group, name, dtype):
            group.create_dataset(name, (count,), dtype, external=[(str(target), 0, count * np.dtype(dtype).itemsize)])

        return make

    def virtual(group, name, dtype):
        layout = h5py.VirtualLayout(shape=(n,), dtype=dtype)
        layout[:] = h5py.VirtualSource(str(fifo), name, shape=(n,))
        group.create_virtual_dataset(name, layout)

    def link(target):
        return lambda group, name, dtype: group.__setitem__(name, target)

    def values(dtype, value):
        return lambda group, name, _: group.create_dataset(name, data=np.full(n, value, dtype))

    def plain(group, name, dtype):
        group.create_dataset(name, data=np.arange(n).astype(dtype))

    def events_in_fifo(f):
        del f["events"]
        f["events"] = h5py.ExternalLink(str(fifo), "/events")

    def chunked(group, name, dtype):
        group.create_dataset(name, data=np.arange(n).astype(dtype), chunks=(1 << 25,), maxshape=(None,), compression=1)

    anywhere = {
        "stored in a regular file": external(secret, n),
        "linked to a FIFO": link(h5py.ExternalLink(str(fifo), "/x")),
        "a soft link": link(h5py.SoftLink("/elsewhere")),
        "a virtual dataset of a FIFO": virtual,
        "in chunks of 2^25 elements": chunked,
        "int64 -2^63": values("<i8", -(2**63)),
        "uint64 2^64 - 1": values("<u8", 2**64 - 1),
    }
    coordinates = {"int32 70000": values("<i4", 70_000), "int16 -1": values("<i2", -1)}
    cases = [({name: make}, f"events/{name} {label}") for name in "xyt" for label, make in anywhere.items()]
    cases += [({name: make}, f"events/{name} {label}") for name in "xy" for label, make in coordinates.items()]
    cases += [({"p": make}, f"events/p {label}") for label, make in list(anywhere.items())[:5]]  # p holds any int
    cases.append((dict.fromkeys(columns, external("/dev/zero", 1 << 31)), "every column stored in /dev/zero"))
    out = []
    for special, label in cases:
        path = work / f"hostile-{len(out):03d}.h5"
        with h5py.File(path, "w") as f:
            group = f.create_group("events")
            f.create_dataset("elsewhere", data=np.arange(n))
            for name, dtype in columns.items():
                special.get(name, plain)(group, name, dtype)
        out.append((label, path))
    for label, change in (
        ("t_offset 2^63 - 1", lambda f: f.__setitem__("t_offset", np.int64(2**63 - 1))),
        ("t_offset 2^64 - 1", lambda f: f.__setitem__("t_offset", np.uint64(2**64 - 1))),
        ("t_offset stored in a regular file", lambda f: external(secret, 1)(f, "t_offset", "<i8")),
        ("the events group linked to a FIFO", events_in_fifo),
    ):
        path = work / f"hostile-{len(out):03d}.h5"
        with h5py.File(path, "w") as f:
            for name, dtype in columns.items():
                plain(f.require_group("events"), name, dtype)
            change(f)
        out.append((label, path))
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(work / "socket"))
    listener.close()  # the socket file stays
    for suffix in (".dat", ".bin", ".raw", ".npz", ".h5", ".aedat4", ".evz"):
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
    import h5py

    from mem_core.corpus import CorpusWriter
    from mem_core.io import read_events

    fifo = work / "corpus-fifo"
    os.mkfifo(fifo)
    base = work / "hostile-base"
    with CorpusWriter(base, min_free_bytes=0) as writer:
        events, sensor = read_events(sorted((data_dir / "ncars-dev" / "train" / "cars").glob("*.dat"))[0])
        writer.add_recording("r", events, sensor, label="cars")
    n = events.size

    def replace(name: str, make: Callable[[h5py.File, str], None]) -> Callable[[Path], None]:
        def change(root: Path) -> None:
            with h5py.File(root / "shard-00000.h5", "r+") as f:
                old = f[name][()]
                del f[name]
                make(f, name, old)

        return change

    def virtual(f, name, old):
        layout = h5py.VirtualLayout(shape=old.shape, dtype=old.dtype)
        layout[:] = h5py.VirtualSource(str(fifo), name, shape=old.shape)
        f.create_virtual_dataset(name, layout)

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
        "t linked to a FIFO": replace(
            "t", lambda f, name, old: f.__setitem__(name, h5py.ExternalLink(str(fifo), "/t"))
        ),
        "x stored in /dev/zero": replace(
            "x", lambda f, name, old: f.create_dataset(name, old.shape, old.dtype, external=[("/dev/zero", 0, 2 * n)])
        ),
        "p a virtual dataset of a FIFO": replace("p", virtual),
        "t_index a soft link": replace("t_index", lambda f, name, old: f.__setitem__(name, h5py.SoftLink("/t"))),
        "y in chunks of 2^25 events": replace(
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
        for label, content in mutants(data, header, rng):
            variant(base, name, label, content)
    huge_header = (2**62).to_bytes(8, "little") + (export / "model.safetensors").read_bytes()[8:]
    variant(export, "model.safetensors", "header length 2^62", huge_header)
    return out


# ------------------------------------------------------------------------------------------ the child


def child(kind: str, listing: Path) -> None:
    """Read every mutant listed, printing one JSON line per mutant (and a "start" line before it)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if kind == "events":
        from mem_core.events import sensor_problem, validate_events
        from mem_core.io import read_events

        def read(path: Path) -> None:
            events, sensor = read_events(path)
            validate_events(events, sensor)
            assert events.size == 0 or sensor_problem(sensor) is None, sensor

    elif kind == "corpus":
        from mem_core.corpus import Corpus, CorpusError

        def read(path: Path) -> None:
            with Corpus(path) as corpus:
                problems = corpus.check(full=True)
                for problem in problems.values():
                    raise CorpusError(problem)
                for i in range(len(corpus)):
                    corpus.events(i)

    else:
        import torch

        from mem_core.inference import Predictor

        torch.set_num_threads(1)

        def read(path: Path) -> None:
            Predictor(path).warm_up()  # what mem serve does: model, tokenizer, one window

    from mem_core.errors import MemError

    baseline = _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (baseline + BUDGET_BYTES, baseline + BUDGET_BYTES))
    for i, path in enumerate(json.loads(listing.read_text())):
        print(json.dumps({"start": i}), flush=True)
        started = time.monotonic()
        try:
            read(Path(path))
            outcome, detail = "valid", ""
        except MemError as e:
            named = str(path) in str(e)
            outcome, detail = ("refused" if named else "unnamed"), str(e)[:300]
        except BaseException as e:  # the finding itself: any other exception, a MemoryError included
            outcome, detail = "bad", "".join(traceback.format_exception(e))[-1500:]
        seconds = time.monotonic() - started
        print(json.dumps({"i": i, "outcome": outcome, "detail": detail, "seconds": seconds}), flush=True)


def _address_space() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


# ------------------------------------------------------------------------------------------ the tests


def run_child(kind: str, labels: list[str], paths: list[Path], work: Path) -> dict[str, int]:
    """Run the child on ``paths``; assert every mutant was refused by name or read as valid, in time."""
    listing = work / f"{kind}-mutants.json"
    listing.write_text(json.dumps([str(p) for p in paths]))
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # glibc's per-thread arenas would eat the address space
    command = [sys.executable, __file__, kind, str(listing)]
    try:
        done = subprocess.run(command, capture_output=True, timeout=BATCH_TIMEOUT_S, env=env)
        stdout, stderr = done.stdout, done.stderr if done.returncode else b""
    except subprocess.TimeoutExpired as e:
        stdout, stderr = e.stdout or b"", f"timed out after {BATCH_TIMEOUT_S} s".encode()
    results = [json.loads(line) for line in stdout.decode().splitlines() if '"outcome"' in line]
    if stderr or len(results) != len(paths):
        at = len(results)
        label = labels[at] if at < len(labels) else "after the last mutant"
        pytest.fail(f"{kind}: the child died or hung at mutant {at} ({label}): {stderr.decode()[-1500:]}")
    problems = [
        f"{labels[r['i']]}: {r['outcome']} ({r['seconds']:.1f} s) {r['detail']}"
        for r in results
        if r["outcome"] not in ("refused", "valid") or r["seconds"] > MUTANT_SECONDS
    ]
    assert not problems, "\n".join(problems)
    counts = {"refused": 0, "valid": 0}
    for r in results:
        counts[r["outcome"]] += 1
    return counts


@pytest.mark.slow
def test_event_file_mutants_are_refused_by_name_or_read_as_events(data_dir, tmp_path):
    cases = event_file_mutants(data_dir, tmp_path)
    paths = []
    for k, (_, content, name) in enumerate(cases):
        path = tmp_path / f"m{k:03d}-{name}"
        path.write_bytes(content)
        paths.append(path)
    counts = run_child("events", [label for label, _, _ in cases], paths, tmp_path)
    assert counts["refused"] > len(cases) // 2, counts  # the mutants do damage: most are refused


@pytest.mark.slow
def test_corpus_mutants_are_refused_by_name_or_read_whole(data_dir, tmp_path):
    cases = corpus_mutants(data_dir, tmp_path)
    counts = run_child("corpus", [label for label, _ in cases], [root for _, root in cases], tmp_path)
    assert counts["refused"] > len(cases) // 2, counts


@pytest.mark.slow
def test_hostile_event_files_are_refused_by_name(tmp_path):
    cases = hostile_event_files(tmp_path)
    counts = run_child("events", [label for label, _ in cases], [path for _, path in cases], tmp_path)
    assert counts["refused"] == len(cases), counts


def test_hostile_corpora_are_refused_by_name(data_dir, tmp_path):
    cases = hostile_corpora(data_dir, tmp_path)
    counts = run_child("corpus", [label for label, _ in cases], [root for _, root in cases], tmp_path)
    assert counts["refused"] == len(cases), counts


def test_model_file_mutants_are_refused_by_name_or_load(tmp_path):
    cases = model_mutants(tmp_path)
    counts = run_child("model", [label for label, _ in cases], [root for _, root in cases], tmp_path)
    assert counts["refused"] > len(cases) // 2, counts


if __name__ == "__main__":
    child(sys.argv[1], Path(sys.argv[2]))
