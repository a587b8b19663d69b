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
"""

from __future__ import annotations

import re
import struct
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import lz4.frame
import numba
import numpy as np
import zstandard

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
        if header.table_at >= 0:
            _check_table(data, header, packets)
        elif missing:
            warnings.warn(
                f"{path}: the last packet is cut ({missing} bytes missing), as a writer that was killed leaves it: "
                f"read the {len(packets)} whole packets",
                stacklevel=2,
            )
        parts = _event_parts(data, [p for p in packets if p.stream == stream], header.compression)
    except _Damage as e:
        raise EventFileError(path, str(e)) from None
    events = sort_plausible(path, np.concatenate(parts) if parts else np.empty(0, EVENT_DTYPE))
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


def _check_table(data: bytes, header: _Header, packets: list[_Packet]) -> None:
    """The data table must list exactly the chained packets (offset, stream, size)."""
    where = f"the data table at byte {header.table_at}"
    fb = _decompress(memoryview(data)[header.table_at :], header.compression, where)
    root = _root(fb, b"FTAB", where)
    start, count = _vector(fb, root, 0, 4, where)
    if count != len(packets):
        raise _Damage(f"corrupt: {where} lists {count} packets, the file holds {len(packets)}")
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


# ------------------------------------------------------------------------------------------ packets


def _decompress(raw: memoryview, compression: str, what: str) -> bytes:
    """The flatbuffer stored in ``raw``, its decompressed size bounded by ``MAX_EXPANSION`` and ``MAX_PACKET_BYTES``."""
    limit = min(MAX_EXPANSION * len(raw), MAX_PACKET_BYTES)
    try:
        if compression == "lz4":
            decoder = lz4.frame.LZ4FrameDecompressor()
            out = decoder.decompress(raw, max_length=limit)
            if not decoder.eof or decoder.unused_data:
                raise _Damage(
                    f"corrupt: {what} ends before its LZ4 frame does (cut or damaged), "
                    f"or decompresses to more than {limit} bytes"
                )
            return out
        if compression == "zstd":
            declared = zstandard.frame_content_size(raw)
            if declared > limit:
                raise _Damage(f"corrupt: {what} declares {declared} bytes decompressed, more than {limit}")
            return zstandard.ZstdDecompressor().decompress(raw, max_output_size=limit, allow_extra_data=False)
    except (RuntimeError, zstandard.ZstdError) as e:  # lz4 reports a damaged frame as a RuntimeError
        raise _Damage(f"corrupt: {what} does not decompress ({e})") from None
    return raw.tobytes()


def _event_parts(data: bytes, packets: list[_Packet], compression: str) -> list[np.ndarray]:
    """The events of ``packets`` as ``EVENT_DTYPE`` arrays, each packet's flatbuffer let go once copied; ``_Damage``
    when they decompress to more than ``MAX_FILE_EXPANSION`` x the file's size."""
    parts, left = [], MAX_FILE_EXPANSION * len(data)
    for packet in packets:
        flat = _events(data, packet, compression)
        left -= flat.nbytes
        if left < 0:
            raise _Damage(
                f"corrupt: the event packets decompress to more than {MAX_FILE_EXPANSION} x the file's "
                f"{len(data)} bytes (camera recordings compress 2-5x)"
            )
        parts.append(np.empty(flat.size, EVENT_DTYPE))
        _copy_events(flat, parts[-1])
    return parts


def _events(data: bytes, packet: _Packet, compression: str) -> np.ndarray:
    """The events of one ``EVTS`` packet (fields t, x, y, p), a view into its decompressed flatbuffer."""
    fb = _decompress(
        memoryview(data)[packet.start : packet.start + packet.size], compression, f"the packet at byte {packet.start}"
    )
    where = f"the event packet at byte {packet.start}"
    start, count = _vector(fb, _root(fb, b"EVTS", where), 0, DV_EVENT.itemsize, where)
    return np.frombuffer(fb, dtype=DV_EVENT, count=count, offset=start)


@numba.njit(cache=True, nogil=True)
def _copy_events(src, dst):
    """dv-processing's event structs into ``EVENT_DTYPE`` records (one pass: numpy would take one per field)."""
    for i in range(src.size):
        dst[i].t = src[i].t
        dst[i].x = src[i].x
        dst[i].y = src[i].y
        dst[i].p = src[i].p != 0


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
        raise _Damage(f"corrupt: {where} is not a {identifier.decode()} flatbuffer (found {fb[at + 4 : at + 8]!r})")
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
