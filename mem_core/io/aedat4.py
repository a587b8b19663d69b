"""iniVation AEDAT4 (``.aedat4``): decoded in-process, every size and offset checked before it is used.

Layout (AEDAT 4.0 as DV and dv-processing write it): the version line ``#!AER-DAT4.0\\r\\n``; an int32 size and
an IOHeader flatbuffer (compression, byte position of the file data table or -1, an XML description of the
streams); packets, each an 8-byte header (int32 stream id, int32 size) and a size-prefixed flatbuffer compressed
as one LZ4 frame, one ZSTD frame or not at all; in a cleanly closed file, the compressed file data table (one entry
per packet) last. An event packet (``EVTS``) holds a vector of 16-byte structs: int64 timestamp (us), int16 x,
int16 y, bool polarity.

Why not dv-processing: on a damaged LZ4 frame its decompression loop calls ``LZ4F_decompress`` again on input
that made it fail and never advances (the interpreter spins for good), and it unpacks packet flatbuffers without
verifying them; a child process killed after a timeout would contain that, at 0.3 s of interpreter start-up and a
.npy round trip per file (0.1-0.2 Mev/s on small files). Here the packet headers are chained from the header to
the data table (or the end of the file), each packet is decompressed by lz4 / zstandard with a bound on its output,
its flatbuffer offsets are checked, and the data table must agree with the packets: time and memory are linear in
the file size, and a damaged file is refused with an ``EventFileError`` saying what is wrong. Payloads carry no
checksum, so damaged event values are caught only as far as they break the time order or leave the sensor.
dv-processing stays the reference: the tests compare with it on the real sample and on files it writes.

Speed: the data table declares each packet's event count, so the result is allocated once, from the declared counts
(bounded by the file's size), and each packet is decompressed into a buffer of exactly its declared size and
converted straight into its place, with the checks (time order, sensor) in the same pass. A file without a table (a
killed writer) is decompressed whole first to count its events. lz4 and zstandard are imported when a file needs them.
"""

from __future__ import annotations

import importlib
import re
import struct
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numba
import numpy as np

from mem_core.errors import MissingPackage
from mem_core.events import EVENT_DTYPE, SensorSize, sensor_problem
from mem_core.io.base import EventFile, EventFileError, check_on_sensor, read_bytes, sort_plausible

MAGIC = b"#!AER-DAT4.0\r\n"
COMPRESSIONS = {0: "none", 1: "lz4", 2: "lz4", 3: "zstd", 4: "zstd"}  # IOHeader codes (2, 4: high levels)
# A packet may decompress to at most this many bytes per stored byte (LZ4's own limit is about 255) and to at most
# MAX_PACKET_BYTES (4 M events; dv-processing writes at most 10 000 per packet): a damaged size field cannot ask for
# gigabytes. All packets together may decompress to MAX_FILE_EXPANSION x the file's size: camera recordings compress
# 2-5x, regular synthetic streams up to ~60x with ZSTD, and a 1.6 MB file of LZ4 packets held 24 M events (0.9 GB).
MAX_EXPANSION = 256
MAX_PACKET_BYTES = 64 << 20
MAX_FILE_EXPANSION = 64
# Bytes of an event packet besides its events (size prefix, identifier, root table, vtable, vector length, padding:
# about 40): a packet decompresses to at most 16 bytes per declared event plus this.
PACKET_FRAMING_BYTES = 1024
U16, I32, U32, I64 = (struct.Struct(f) for f in ("<H", "<i", "<I", "<q"))
_STREAM_ID = re.compile(r"[0-9]{1,9}")  # packet headers hold stream ids as int32
# One event as dv-processing stores it (the flatbuffer struct dv.Event, 8-byte aligned).
DV_EVENT = np.dtype({"names": ["t", "x", "y", "p"], "formats": ["<i8", "<i2", "<i2", "u1"], "itemsize": 16})


class _Damage(Exception):
    """What is wrong with the file; ``read_aedat4`` turns it into an ``EventFileError`` naming the file."""


class _Packet(NamedTuple):
    stream: int
    start: int  # byte offset of the packet's data, after its 8-byte header
    size: int


# A packet's compressed bytes and the most it may decompress to, and a description for errors -> its flatbuffer.
Decompress = Callable[[memoryview, int, str], "bytes | memoryview"]


class _Header(NamedTuple):
    compression: str  # a value of COMPRESSIONS
    table_at: int  # -1 when the writer never closed the file
    streams: dict[int, ET.Element]
    first_packet: int


def read_aedat4(path: Path) -> EventFile:
    """Decode the event stream of an AEDAT4 file; ``EventFileError`` for anything damaged or missing."""
    data = read_bytes(path)
    try:
        header = _read_header(data)
        stream, sensor = _event_stream(header.streams)
        packets, missing = _chain_packets(data, header)
        decompress = _decompressor(header.compression)
        counts = None
        if header.table_at >= 0:
            counts = _check_table(data, header, packets, decompress)
            counts = [n for n, p in zip(counts, packets, strict=True) if p.stream == stream]
        elif missing:
            warnings.warn(
                f"{path}: the last packet is cut ({missing} bytes missing), as a writer that was killed leaves it: "
                f"read the {len(packets)} whole packets",
                stacklevel=2,
            )
        events, seen = _read_events(data, [p for p in packets if p.stream == stream], counts, decompress)
    except _Damage as e:
        raise EventFileError(path, str(e)) from None
    except MissingPackage as e:
        raise EventFileError(path, str(e)) from None
    _, x_max, y_max, stepped_back = seen
    if stepped_back:
        events = sort_plausible(path, events)
    if events.size and (x_max >= sensor.width or y_max >= sensor.height):
        check_on_sensor(path, events, sensor, "the AEDAT4 stream info")
    return EventFile(events, sensor)


# ------------------------------------------------------------------------------------------ file structure


def dv_processing_events(path: Path) -> np.ndarray:
    """dv-processing's own decoding of an AEDAT4 file, as its structured array (timestamp, x, y, polarity): the
    reference the tests and ``mem bench aedat4`` compare ``read_aedat4`` with. Only for sound files: dv-processing
    can hang on damaged ones (see the module docstring)."""
    import dv_processing as dv

    recording = dv.io.MonoCameraRecording(str(path))
    batches = []
    while (batch := recording.getNextEventBatch()) is not None:
        batches.append(batch.numpy())
    return np.concatenate(batches)


def _read_header(data: bytes) -> _Header:
    """The version line, the IOHeader (compression, data table position) and the streams it declares."""
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise _Damage(f"truncated: the file ends inside the AEDAT4 version line ({len(data)} bytes)")
        raise _Damage(f"not an AEDAT 4.0 file (starts with {data[: len(MAGIC)]!r})")
    if len(data) < len(MAGIC) + 4:
        raise _Damage(f"truncated: the file ends inside the AEDAT4 header ({len(data)} bytes)")
    (size,) = struct.unpack_from("<i", data, len(MAGIC))
    first_packet = len(MAGIC) + 4 + size
    if size <= 0 or first_packet > len(data):
        raise _Damage(f"corrupt: AEDAT4 header size {size} does not fit the {len(data)}-byte file")
    fb = data[len(MAGIC) + 4 : first_packet]
    root = _root(fb, b"IOHE", "the IOHeader", size_prefixed=False)
    compression = _scalar(fb, root, 0, I32, 0, "the IOHeader")
    if compression not in COMPRESSIONS:
        raise _Damage(f"corrupt: unknown compression type {compression} in the IOHeader")
    table_at = _scalar(fb, root, 1, I64, -1, "the IOHeader")
    if 0 <= table_at < first_packet:
        raise _Damage(f"corrupt: the IOHeader places the data table at byte {table_at}, inside the header")
    if table_at >= len(data):
        raise _Damage(
            f"truncated: the file ends at byte {len(data)} but its data table starts at byte {table_at} "
            f"(at least {table_at - len(data) + 1} bytes missing at the end)"
        )
    info = _string(fb, root, 2, "the IOHeader")
    return _Header(COMPRESSIONS[compression], table_at, _streams(info), first_packet)


def _streams(info: bytes) -> dict[int, ET.Element]:
    """Stream id -> its XML node, from the IOHeader's info (``<dv><node name="outInfo"><node name="0">...``)."""
    try:
        root = ET.fromstring(info.rstrip(b"\0"))
    except ET.ParseError as e:
        raise _Damage(f"corrupt: the IOHeader's stream description is not XML ({e})") from None
    out = root.find("node[@name='outInfo']")
    streams = {}
    for node in out if out is not None else []:
        name = node.get("name", "")
        if _STREAM_ID.fullmatch(name) is None:  # str.isdigit() takes "²", and int() refuses 5000 digits
            raise _Damage(f"corrupt: stream name {name[:20]!r} in the IOHeader is not a stream id")
        streams[int(name)] = node
    return streams


def _event_stream(streams: dict[int, ET.Element]) -> tuple[int, SensorSize]:
    """The event stream (the one named ``events`` if there are several) and its sensor size."""
    candidates = [sid for sid, node in sorted(streams.items()) if _attr(node, "typeIdentifier") == "EVTS"]
    if not candidates:
        raise _Damage(f"the recording has no event stream (streams: {sorted(streams) or 'none'})")
    named = [sid for sid in candidates if _attr(streams[sid], "originalOutputName") == "events"]
    stream = (named or candidates)[0]
    info = streams[stream].find("node[@name='info']")
    try:
        sensor = SensorSize(int(_attr(info, "sizeY")), int(_attr(info, "sizeX")))
    except (TypeError, ValueError):
        raise _Damage(f"corrupt: no sensor size (sizeX, sizeY) in the info of event stream {stream}") from None
    if (problem := sensor_problem(sensor)) is not None:
        raise _Damage(f"corrupt: event stream {stream}: {problem}")
    return stream, sensor


def _attr(node: ET.Element | None, key: str) -> str | None:
    found = None if node is None else node.find(f"attr[@key='{key}']")
    return None if found is None else (found.text or "").strip()


def _chain_packets(data: bytes, header: _Header) -> tuple[list[_Packet], int]:
    """Packet headers from the first packet to the data table (or the end of the file): the packets, and how
    many bytes the last one lacks when the file ends inside it (0 when it does not)."""
    end = header.table_at if header.table_at >= 0 else len(data)
    packets: list[_Packet] = []
    at = header.first_packet
    while at < end:
        if end - at < 8:
            return packets, _cut_inside(data, header, at, f"the packet header at byte {at}", 8 - (end - at))
        stream, size = struct.unpack_from("<ii", data, at)
        if stream not in header.streams or size <= 0:
            raise _Damage(
                f"corrupt: packet header at byte {at} (stream {stream}, {size} bytes) "
                f"{'has no data' if size <= 0 else 'names a stream the header does not declare'}"
            )
        if at + 8 + size > end:
            return packets, _cut_inside(
                data, header, at, f"the packet at byte {at} ({size} bytes)", at + 8 + size - end
            )
        packets.append(_Packet(stream, at + 8, size))
        at += 8 + size
    return packets, 0


def _cut_inside(data: bytes, header: _Header, at: int, what: str, missing: int) -> int:
    """A packet that runs past its end: damage when the data table follows it, a cut tail when nothing does."""
    if header.table_at >= 0:
        raise _Damage(f"corrupt: {what} runs {missing} bytes into the data table at byte {header.table_at}")
    return missing


def _check_table(data: bytes, header: _Header, packets: list[_Packet], decompress: Decompress) -> list[int]:
    """The number of elements the data table declares for each packet; it must list exactly the chained packets
    (offset, stream, size)."""
    where = f"the data table at byte {header.table_at}"
    raw = memoryview(data)[header.table_at :]
    fb = decompress(raw, min(MAX_EXPANSION * len(raw), MAX_PACKET_BYTES), where)
    root = _root(fb, b"FTAB", where)
    start, count = _vector(fb, root, 0, 4, where)
    if count != len(packets):
        raise _Damage(f"corrupt: {where} lists {count} packets, the file holds {len(packets)}")
    counts = []
    for k, packet in enumerate(packets):
        entry = _table(fb, start + 4 * k, where)
        offset = _scalar(fb, entry, 0, I64, 0, where)
        info = _field(fb, entry, 1, 8, where)
        listed = (offset, *(struct.unpack_from("<ii", fb, info) if info is not None else (0, 0)))
        if listed != (packet.start, packet.stream, packet.size):
            raise _Damage(
                f"corrupt: {where} lists packet {k} at byte {listed[0]} (stream {listed[1]}, {listed[2]} bytes), "
                f"the file has it at byte {packet.start} (stream {packet.stream}, {packet.size} bytes)"
            )
        counts.append(_scalar(fb, entry, 2, I64, 0, where))
    return counts


# ------------------------------------------------------------------------------------------ packets


def _decompressor(compression: str) -> Decompress:
    """How packets of ``compression`` decompress, with a bound on their size; its package (lz4, zstandard) imported
    here, when a file needs it: a machine that reads other files does without them."""
    if compression == "lz4":
        frame = _package("lz4.frame", "lz4", "LZ4")

        def lz4(raw: memoryview, limit: int, what: str) -> bytes:
            # decompress_chunk reads the file's bytes in place (LZ4FrameDecompressor copies its input first)
            try:
                out, used, end = frame.decompress_chunk(frame.create_decompression_context(), raw, max_length=limit)
            except RuntimeError as e:  # lz4 reports a damaged frame as a RuntimeError
                raise _Damage(f"corrupt: {what} does not decompress ({e})") from None
            if not end or used != len(raw):
                raise _Damage(
                    f"corrupt: {what} ends before its LZ4 frame does (cut or damaged), "
                    f"or decompresses to more than {limit} bytes"
                )
            return out

        return lz4
    if compression == "zstd":
        zstandard = _package("zstandard", "zstandard", "ZSTD")
        decoder = zstandard.ZstdDecompressor()

        def zstd(raw: memoryview, limit: int, what: str) -> bytes:
            try:
                declared = zstandard.frame_content_size(raw)
                if declared > limit:
                    raise _Damage(f"corrupt: {what} declares {declared} bytes decompressed, more than {limit}")
                return decoder.decompress(raw, max_output_size=limit, allow_extra_data=False)
            except zstandard.ZstdError as e:
                raise _Damage(f"corrupt: {what} does not decompress ({e})") from None

        return zstd
    return lambda raw, limit, what: raw


def _package(module: str, package: str, compression: str) -> ModuleType:
    """``import module``; ``MissingPackage`` naming ``package`` when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingPackage(
            f"{compression}-compressed AEDAT4 files need the Python package {package!r}, which is not installed ({e})"
        ) from e


def _read_events(
    data: bytes, packets: list[_Packet], counts: list[int] | None, decompress: Decompress
) -> tuple[np.ndarray, np.ndarray]:
    """The events of ``packets`` as one ``EVENT_DTYPE`` array, and what ``_convert`` saw of them.

    ``counts`` (from the data table) size the array before any packet is decompressed; without them every packet is
    decompressed first to count its events. ``_Damage`` when the events would take more than ``MAX_FILE_EXPANSION`` x
    the file's size, or a packet holds another number of events than the table declares.
    """
    budget = MAX_FILE_EXPANSION * len(data)
    flats: list[np.ndarray | None] | None = None
    if counts is None:
        flats, left = [], budget
        for packet in packets:
            flats.append(_events(data, packet, decompress, min(MAX_EXPANSION * packet.size, MAX_PACKET_BYTES)))
            left -= flats[-1].nbytes
            if left < 0:
                break
        counts = [flat.size for flat in flats]
    for n, packet in zip(counts, packets, strict=True):
        if not 0 <= DV_EVENT.itemsize * n <= min(MAX_EXPANSION * packet.size, MAX_PACKET_BYTES):
            raise _Damage(
                f"corrupt: the data table declares {n} events in the {packet.size}-byte packet at byte {packet.start}"
            )
    if DV_EVENT.itemsize * sum(counts) > budget:
        raise _Damage(
            f"corrupt: the event packets decompress to more than {MAX_FILE_EXPANSION} x the file's "
            f"{len(data)} bytes (camera recordings compress 2-5x)"
        )
    events = np.empty(sum(counts), EVENT_DTYPE)
    seen = np.array([np.iinfo(np.int64).min, 0, 0, 0])  # the last time, x max, y max, whether time stepped back
    at = 0
    for k, packet in enumerate(packets):
        if flats is None:
            flat = _events(data, packet, decompress, DV_EVENT.itemsize * counts[k] + PACKET_FRAMING_BYTES)
        else:
            flat, flats[k] = flats[k], None  # let each packet go once converted
        if flat.size != counts[k]:
            raise _Damage(
                f"corrupt: the data table declares {counts[k]} events in the packet at byte {packet.start}, "
                f"it holds {flat.size}"
            )
        _convert(flat, events[at : at + flat.size], seen)
        at += flat.size
    return events, seen


def _events(data: bytes, packet: _Packet, decompress: Decompress, limit: int) -> np.ndarray:
    """The events of one ``EVTS`` packet (fields t, x, y, p), a view into its flatbuffer of at most ``limit`` bytes."""
    fb = decompress(
        memoryview(data)[packet.start : packet.start + packet.size], limit, f"the packet at byte {packet.start}"
    )
    where = f"the event packet at byte {packet.start}"
    start, count = _vector(fb, _root(fb, b"EVTS", where), 0, DV_EVENT.itemsize, where)
    return np.frombuffer(fb, dtype=DV_EVENT, count=count, offset=start)


@numba.njit(cache=True, nogil=True)
def _convert(src, dst, seen):
    """dv-processing's event structs into ``EVENT_DTYPE`` records in one pass (numpy would take one per field), noting
    in ``seen`` (carried from packet to packet) what the checks need: the last time, the largest x and y (as the
    unsigned values stored), and whether the time ever stepped back."""
    t_last, x_max, y_max, back = seen[0], seen[1], seen[2], seen[3]
    for i in range(src.size):
        t = src[i].t
        x = np.int64(src[i].x) & 0xFFFF
        y = np.int64(src[i].y) & 0xFFFF
        if t < t_last:
            back = 1
        t_last = t
        x_max = max(x_max, x)
        y_max = max(y_max, y)
        dst[i].t = t
        dst[i].x = x
        dst[i].y = y
        dst[i].p = src[i].p != 0
    seen[0], seen[1], seen[2], seen[3] = t_last, x_max, y_max, back


# ------------------------------------------------------------------------------------------ flatbuffers


def _unpack(kind: struct.Struct, fb: bytes, at: int, where: str) -> int:
    if at < 0 or at + kind.size > len(fb):
        raise _Damage(f"corrupt: an offset in {where} points outside it (byte {at} of {len(fb)})")
    return kind.unpack_from(fb, at)[0]


def _root(fb: bytes, identifier: bytes, where: str, size_prefixed: bool = True) -> int:
    """The root table of a flatbuffer whose file identifier must be ``identifier``.

    Packets and the data table are size-prefixed (a uint32 byte count first): the count must match.
    """
    at = 0
    if size_prefixed:
        if (declared := _unpack(U32, fb, 0, where)) != len(fb) - 4:
            raise _Damage(f"corrupt: {where} says it holds {declared} bytes, it holds {len(fb) - 4}")
        at = 4
    if fb[at + 4 : at + 8] != identifier:
        found = bytes(fb[at + 4 : at + 8])
        raise _Damage(f"corrupt: {where} is not a {identifier.decode()} flatbuffer (found {found!r})")
    return _table(fb, at, where)


def _table(fb: bytes, at: int, where: str) -> int:
    """The table that the offset stored at ``at`` points to, its vtable checked."""
    table = at + _unpack(U32, fb, at, where)
    vtable = table - _unpack(I32, fb, table, where)
    vsize = _unpack(U16, fb, vtable, where)
    if vsize < 4 or vsize % 2 or vtable + vsize > len(fb):
        raise _Damage(f"corrupt: {where} has a flatbuffer vtable of {vsize} bytes at byte {vtable}")
    return table


def _field(fb: bytes, table: int, index: int, size: int, where: str) -> int | None:
    """Byte position of field ``index`` (``size`` bytes) of ``table``, None when the field is absent."""
    vtable = table - _unpack(I32, fb, table, where)
    if 4 + 2 * index >= _unpack(U16, fb, vtable, where):
        return None
    offset = _unpack(U16, fb, vtable + 4 + 2 * index, where)
    if offset == 0:
        return None
    if offset + size > _unpack(U16, fb, vtable + 2, where) or table + offset + size > len(fb):
        raise _Damage(f"corrupt: field {index} of a table in {where} lies outside the table")
    return table + offset


def _scalar(fb: bytes, table: int, index: int, kind: struct.Struct, default: int, where: str) -> int:
    at = _field(fb, table, index, kind.size, where)
    return default if at is None else _unpack(kind, fb, at, where)


def _vector(fb: bytes, table: int, index: int, item: int, where: str) -> tuple[int, int]:
    """(byte position of the first element, element count) of a vector field; (0, 0) when absent."""
    at = _field(fb, table, index, 4, where)
    if at is None:
        return 0, 0
    start = at + _unpack(U32, fb, at, where)
    count = _unpack(U32, fb, start, where)
    if start + 4 + count * item > len(fb):
        raise _Damage(f"corrupt: {where} declares {count} elements, more than its {len(fb)} bytes hold")
    return start + 4, count


def _string(fb: bytes, table: int, index: int, where: str) -> bytes:
    start, count = _vector(fb, table, index, 1, where)
    return fb[start : start + count]
