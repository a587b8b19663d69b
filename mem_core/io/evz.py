"""MEM's packed event file ``.evz``: lossless, about 2.3 bytes per N-Cars event (a ``.dat`` takes 8), for shipping
datasets over thin links.

Layout (little-endian): a 35-byte header, then one raw LZMA2 stream to the end of the file.

=======  =====  =========================================================================================
bytes    type   field
=======  =====  =========================================================================================
0..7            magic ``MEMEVZ\\x00`` and the format version (1)
8..11    u16 2  sensor width, height (0 x 0 only for an empty recording of unknown geometry)
12..19   u64    event count ``n``
20..27   i64    first timestamp (us; 0 when empty)
28..30   u8 3   bytes per time step ``k`` (0..8), bytes per x and per y (1 or 2)
31..34   u32    CRC-32 of header bytes 0..30 followed by the decompressed payload
=======  =====  =========================================================================================

The payload is columns of byte planes, least significant plane first: the ``n - 1`` time steps ``t[i] - t[i-1]``
(``k`` planes), x, y (1 or 2 planes each), then the polarities as bits (``np.packbits``, little bit order). Each
plane holds one kind of byte, which LZMA2 predicts better than interleaved records (on N-Cars 2.27 against 2.83 bytes
an event for 5-byte records of the same fields). The stream is LZMA2 preset 9e with ``lc = 0, pb = 0`` (no context
from byte values or positions: 0.9 % smaller on N-Cars) and a dictionary no larger than the payload (``dict_size``):
preset 9's 64 MiB dictionary made small files 24x slower to write for the same size. The reader sizes its dictionary
by the same rule, so it is not stored.

Reading trusts nothing: the declared payload must fit what LZMA2 can expand the stored stream to
(``MAX_EXPANSION``) before anything is allocated, the stream must end exactly at the payload's end, the checksum
must match, times are checked as they are unpacked and coordinates against the declared sensor.
"""

from __future__ import annotations

import lzma
import struct
import zlib
from pathlib import Path

import numba
import numpy as np

from mem_core.events import EVENT_DTYPE, MAX_ABS_TIME_US, SensorSize, sensor_problem, validate_events
from mem_core.io.base import EventFile, EventFileError, check_on_sensor, read_bytes

MAGIC = b"MEMEVZ\x00"
VERSION = 1
EXTENSION = ".evz"
HEADER = struct.Struct("<7sBHHQqBBBI")
# LZMA2 expands at most ~6,900:1 (2 MiB chunks of one repeated byte measured 6,850:1): no stream of that many
# bytes can hold a larger payload, whatever it encodes.
MAX_EXPANSION = 8192
MIN_DICT_BYTES = 4096  # liblzma's smallest dictionary
MAX_DICT_BYTES = 64 << 20  # preset 9's: a larger one finds little more in event data and costs memory to read
_PRESET = 9 | lzma.PRESET_EXTREME
_MAX_STEP_TOP_BYTE = 0x40  # a larger eighth byte makes a step > 2^62 + 2^56, more than two valid times differ


def dict_size(payload_bytes: int) -> int:
    """The LZMA2 dictionary of a payload: the smallest power of two that holds it, within liblzma's range and 64 MiB."""
    return min(max(MIN_DICT_BYTES, 1 << max(payload_bytes - 1, 0).bit_length()), MAX_DICT_BYTES)


def payload_bytes(n: int, step_bytes: int, x_bytes: int, y_bytes: int) -> int:
    """Bytes of the decompressed payload of ``n`` events."""
    return max(n - 1, 0) * step_bytes + n * (x_bytes + y_bytes) + (n + 7) // 8


def _planes(values: np.ndarray, count: int) -> bytes:
    """The ``count`` low byte planes of unsigned little-endian ``values``, least significant first."""
    per_value = values.dtype.itemsize
    return np.ascontiguousarray(values.view(np.uint8).reshape(-1, per_value)[:, :count].T).tobytes()  # (count, n)


def _byte_width(largest: int) -> int:
    return (largest.bit_length() + 7) // 8


def write_evz(path: Path, events: np.ndarray, sensor: SensorSize) -> None:
    """Write ``events`` recorded on ``sensor`` as ``.evz``; ``ValueError`` for invalid events or sensor.

    Any valid ``EVENT_DTYPE`` recording round-trips exactly. ``mem_core.io.write_events(path, ...)`` does the same
    and makes the file appear atomically.
    """
    path = Path(path)
    if (events.size or sensor != (0, 0)) and (problem := sensor_problem(sensor)) is not None:
        raise ValueError(f"{path}: {problem}")
    validate_events(events, sensor if events.size else None)
    n = int(events.size)
    t = events["t"].astype("<i8")
    steps = np.diff(t).astype("<u8")  # >= 0: the events are sorted
    x, y = events["x"].astype("<u2"), events["y"].astype("<u2")
    widths = (
        _byte_width(int(steps.max())) if steps.size else 0,
        max(1, _byte_width(int(x.max()))) if n else 1,
        max(1, _byte_width(int(y.max()))) if n else 1,
    )
    payload = b"".join(
        (
            _planes(steps, widths[0]),
            _planes(x, widths[1]),
            _planes(y, widths[2]),
            np.packbits(events["p"], bitorder="little").tobytes(),
        )
    )
    fields = (MAGIC, VERSION, sensor.width, sensor.height, n, int(t[0]) if n else 0, *widths)
    head = HEADER.pack(*fields, 0)[:-4]
    stream = lzma.compress(payload, format=lzma.FORMAT_RAW, filters=_filters(len(payload), _PRESET))
    with path.open("wb") as f:
        f.write(head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + stream)


def _filters(payload: int, preset: int | None = None) -> list[dict]:
    lzma2 = {"id": lzma.FILTER_LZMA2, "dict_size": dict_size(payload)}
    if preset is not None:
        lzma2 = {**lzma2, "preset": preset, "lc": 0, "pb": 0}
    return [lzma2]


def read_evz(path: Path) -> EventFile:
    """Decode an ``.evz`` file; ``EventFileError`` naming what is wrong for anything damaged."""
    data = read_bytes(path)
    if len(data) < HEADER.size:
        if data.startswith(MAGIC) or MAGIC.startswith(data):
            raise EventFileError(path, f"truncated: the file ends inside the {HEADER.size}-byte .evz header")
        raise EventFileError(path, f"not an .evz file (starts with {data[:8]!r})")
    magic, version, width, height, n, t0, *widths, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EventFileError(path, f"not an .evz file (starts with {data[:8]!r})")
    if version != VERSION:
        raise EventFileError(path, f".evz version {version}, this reader reads version {VERSION}")
    sensor = SensorSize(height, width)
    _check_header(path, n, t0, sensor, *widths)
    stream = memoryview(data)[HEADER.size :]
    size = payload_bytes(n, *widths)
    if size > MAX_EXPANSION * len(stream):
        raise EventFileError(
            path,
            f"corrupt: {n} events need {size} bytes, more than LZMA2 can expand the {len(stream)}-byte stream to",
        )
    payload = decompress(path, stream, size, n)
    if zlib.crc32(payload, zlib.crc32(data[: HEADER.size - 4])) != crc:
        raise EventFileError(path, "corrupt: the checksum does not match the header and the events")
    events = np.empty(n, EVENT_DTYPE)
    bad = _unpack(np.frombuffer(payload, np.uint8), n, *widths, t0, MAX_ABS_TIME_US, events)
    if bad >= 0:
        raise EventFileError(path, f"corrupt: the time of event {bad} lies beyond +-2^61 us")
    check_on_sensor(path, events, sensor, "the .evz header")
    return EventFile(events, sensor)


def _check_header(path: Path, n: int, t0: int, sensor: SensorSize, step: int, x: int, y: int) -> None:
    """Raise ``EventFileError`` for header values no writer produces."""
    if step > 8 or not (1 <= x <= 2 and 1 <= y <= 2):
        raise EventFileError(
            path, f"corrupt: bytes per time step {step} (0..8), per x {x}, per y {y} (1 or 2) in the header"
        )
    if (n or sensor != (0, 0)) and (problem := sensor_problem(sensor)) is not None:
        raise EventFileError(path, f"corrupt: {problem}")
    if abs(t0) > MAX_ABS_TIME_US:
        raise EventFileError(path, f"corrupt: first timestamp {t0} us lies beyond +-2^61 us")


def decompress(path: Path, stream: memoryview, size: int, n: int) -> bytes:
    """Exactly ``size`` payload bytes from the LZMA2 ``stream``, which must end where they do."""
    decoder = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_filters(size))
    try:
        payload = decoder.decompress(stream, max_length=size)
        # The payload may be whole before the stream's end mark is read: read on, one byte at most.
        beyond = decoder.decompress(b"", max_length=1) if len(payload) == size and not decoder.eof else b""
    except lzma.LZMAError as e:
        raise EventFileError(path, f"corrupt: the LZMA2 stream does not decode ({e})") from None
    if beyond:
        raise EventFileError(path, f"corrupt: the stream holds more than the {size} bytes of the {n} events declared")
    if len(payload) < size or not decoder.eof:
        raise EventFileError(
            path,
            f"truncated or corrupt: the stream ends after {len(payload)} of the {size} bytes that {n} events need"
            + ("" if len(payload) < size else ", without its end mark"),
        )
    if decoder.unused_data:
        raise EventFileError(path, f"corrupt: {len(decoder.unused_data)} bytes follow the end of the stream")
    return payload


@numba.njit(cache=True, nogil=True)
def _unpack(buf, n, step_bytes, x_bytes, y_bytes, t0, t_bound, out):
    """Fill ``out`` from the payload's planes -> -1, or the first event whose time passes +-``t_bound``."""
    m = max(n - 1, 0)
    at_x = m * step_bytes
    at_y = at_x + n * x_bytes
    at_p = at_y + n * y_bytes
    t = np.int64(t0)
    for i in range(n):
        if i:
            step = np.int64(0)
            for j in range(step_bytes):
                b = buf[j * m + i - 1]
                if j == 7 and b > _MAX_STEP_TOP_BYTE:
                    return i
                step |= np.int64(b) << (8 * j)
            t += step  # t <= 2^61 and step < 2^62: no int64 overflow before the check
            if t > t_bound:
                return i
        out[i].t = t
        x = np.int64(buf[at_x + i])
        if x_bytes == 2:
            x |= np.int64(buf[at_x + n + i]) << 8
        y = np.int64(buf[at_y + i])
        if y_bytes == 2:
            y |= np.int64(buf[at_y + n + i]) << 8
        out[i].x = x
        out[i].y = y
        out[i].p = (buf[at_p + (i >> 3)] >> (i & 7)) & 1
    return -1
