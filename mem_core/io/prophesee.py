"""Prophesee files: the ``%`` text header they share, ``.dat`` (decoded CD events) and EVT 2.0 / 3.0 ``.raw``.

``.dat``: header lines ``% key value``, then two bytes (event type: 0 = Event2d or 12 = EventCD, event size: 8),
then 8-byte records: little-endian u32 ``t`` (us, wraps at 2^32) and u32 ``w`` with ``x = w & 0x3FFF``,
``y = (w >> 14) & 0x3FFF``, ``p = (w >> 28) & 1``. The header is required: the records carry no checksum, so
it is what tells a recording from any other bytes (N-Cars and Prophesee's tools always write one). Geometry from
``% Width``/``% Height`` or ``% geometry WxH``; without one N-Cars' 120 x 100 (width x height) when the events
fit, else the smallest sensor that holds them.

``.raw``: header with ``% evt 2.0`` / ``% evt 3.0`` (or ``% format EVT2;...``/``EVT3;...``, newer files end the
header with ``% end``), then EVT words (see ``evt.py``). Geometry from ``% geometry``/``% format``; old files
without one get the sensor of the camera named by ``% plugin_name`` when the events fit, else it is inferred.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numba
import numpy as np

from mem_core.events import EVENT_DTYPE, SensorSize, infer_sensor, sensor_problem
from mem_core.io.base import EventFile, EventFileError, check_on_sensor, read_bytes, sort_plausible
from mem_core.io.evt import decode_evt2, decode_evt3

NCARS_SENSOR = SensorSize(100, 120)
DAT_RECORD = np.dtype([("t", "<u4"), ("w", "<u4")])
DAT_CD_TYPES = (0, 12)  # Event2d, EventCD
DAT_MAX_XY = (1 << 14) - 1
# Camera plugins named in old .raw headers without geometry, most specific first.
PLUGIN_SENSORS = (
    ("gen41", SensorSize(720, 1280)),
    ("imx636", SensorSize(720, 1280)),
    ("genx320", SensorSize(320, 320)),
    ("gen3", SensorSize(480, 640)),
)
_PRINTABLE = re.compile(rb"[\x20-\x7e\t\r]*")


def parse_header(buf: bytes, path: Path | None = None) -> tuple[dict[str, str], int]:
    """``% key value`` lines at the start of ``buf`` -> (lower-cased keys -> values, offset of the data).

    A line counts as header only when it is printable text, so binary data that happens to start with ``%``
    is not swallowed. With ``path`` an unterminated header line raises ``EventFileError``; without (sniffing a
    file's first bytes) the header read so far is returned.
    """
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(buf) and buf[pos] == ord("%"):
        end = buf.find(b"\n", pos)
        if end < 0:
            if path is not None:
                raise EventFileError(path, "truncated: the '%' header ends without a newline")
            break
        line = buf[pos + 1 : end]
        if _PRINTABLE.fullmatch(line) is None:
            break
        pos = end + 1
        text = line.decode("ascii").strip()
        if text == "end":
            break
        key, _, value = text.partition(" ")
        fields.setdefault(key.lower(), value.strip())
    return fields, pos


def raw_encoding(header: dict[str, str]) -> str | None:
    """``"evt2"``, ``"evt3"``, another lower-cased encoding name, or ``None`` when the header names none."""
    if "evt" in header:
        return "evt" + header["evt"].replace(".0", "").replace(".", "")
    if "format" in header:
        return header["format"].split(";")[0].strip().lower() or None
    return None


def header_sensor(path: Path, header: dict[str, str]) -> SensorSize | None:
    """The geometry a header declares (``geometry``, ``format ...;height=;width=``, ``Width``/``Height``)."""
    try:
        if "geometry" in header:
            width, height = header["geometry"].lower().split("x")
        else:
            options = dict(kv.split("=", 1) for kv in header.get("format", "").split(";")[1:] if "=" in kv)
            fields = options if "width" in options and "height" in options else header
            if "width" not in fields or "height" not in fields:
                return None
            width, height = fields["width"], fields["height"]
        sensor = SensorSize(int(height), int(width))
    except ValueError as e:
        raise EventFileError(path, f"corrupt header: unreadable sensor geometry ({e})") from e
    if (problem := sensor_problem(sensor)) is not None:
        raise EventFileError(path, f"corrupt header: {problem}")
    return sensor


def _sensor(path: Path, events: np.ndarray, header: dict[str, str], default: SensorSize | None) -> SensorSize:
    declared = header_sensor(path, header)
    if declared is not None:
        check_on_sensor(path, events, declared, "the file header")
        return declared
    inferred = infer_sensor(events)
    if default is not None and inferred.height <= default.height and inferred.width <= default.width:
        return default
    return inferred


@numba.njit(cache=True, nogil=True)
def _decode_dat(t32, w, out):
    """Fill ``out`` from the record columns, in file order.

    The 32-bit clock is unwrapped: a jump back by more than 2^31 us is a wrap, smaller ones are disorder.
    """
    offset = 0
    prev = np.int64(t32[0]) if t32.size else 0
    for i in range(t32.size):
        t = np.int64(t32[i])
        if t < prev - (1 << 31):
            offset += 1 << 32
        prev = t
        word = w[i]
        out[i].t = t + offset
        out[i].x = word & 0x3FFF
        out[i].y = (word >> 14) & 0x3FFF
        out[i].p = (word >> 28) & 1


def read_dat(path: Path) -> EventFile:
    """Decode a Prophesee / N-Cars ``.dat`` file (timestamps unwrapped across the 2^32 us counter wrap)."""
    buf = read_bytes(path)
    header, pos = parse_header(buf, path)
    if not pos:
        raise EventFileError(path, f"not a Prophesee .dat file: no '%' header (starts with {buf[:12]!r})")
    version = header.get("version", "2")
    major = re.fullmatch(r"([0-9]{1,9})(\..*)?", version)  # str.isdigit() takes "²", int() refuses 5000 digits
    if major is None or int(major.group(1)) < 2:
        raise EventFileError(path, f"unsupported .dat version {version[:20]!r} (only version 2 is supported)")
    if len(buf) < pos + 2:
        raise EventFileError(path, "truncated: the header is not followed by the event type and size bytes")
    ev_type, ev_size = buf[pos], buf[pos + 1]
    if ev_type not in DAT_CD_TYPES:
        raise EventFileError(path, f"unsupported .dat event type {ev_type} (CD events are type 0 or 12)")
    if ev_size != DAT_RECORD.itemsize:
        raise EventFileError(path, f"corrupt: .dat event size {ev_size}, expected {DAT_RECORD.itemsize}")
    pos += 2
    body = len(buf) - pos
    if body % DAT_RECORD.itemsize:
        whole = body // DAT_RECORD.itemsize
        # the whole records before the cut are sound (tonic reads them): say how to keep them, without changing the
        # user's file; a partial record is never guessed at
        keep = f"{path.stem}-whole{path.suffix}"
        recover = f"head -c {pos + whole * DAT_RECORD.itemsize} {shlex.quote(str(path))} > {shlex.quote(keep)}"
        raise EventFileError(
            path,
            f"truncated: {body} bytes of events is not a whole number of {DAT_RECORD.itemsize}-byte records "
            f"({body % DAT_RECORD.itemsize} trailing bytes after {whole} whole records); "
            f"to read those records, keep them in a new file: {recover}",
        )
    rec = np.frombuffer(buf, dtype=DAT_RECORD, offset=pos)
    events = np.empty(len(rec), dtype=EVENT_DTYPE)
    _decode_dat(rec["t"], rec["w"], events)
    events = sort_plausible(path, events)
    return EventFile(events, _sensor(path, events, header, NCARS_SENSOR))


def write_dat(path: Path, events: np.ndarray, sensor: SensorSize) -> None:
    """Write a version-2 CD ``.dat`` with ``% Width``/``% Height``; ``ValueError`` for what it cannot hold.

    Limits: 0 <= t[0] < 2^32 us, gaps between events < 2^31 us (so the reader can unwrap the 32-bit counter),
    x, y < 2^14.
    """
    if events.size:
        t = events["t"].astype(np.int64)
        if t[0] < 0 or t[0] >= 1 << 32:
            raise ValueError(f".dat needs the first timestamp in [0, 2^32) us, got {int(t[0])}")
        gap = int(np.diff(t).max()) if t.size > 1 else 0
        if gap >= 1 << 31:
            raise ValueError(f".dat cannot hold a gap of {gap} us between events (the 32-bit clock would be ambiguous)")
        if max(sensor.width, sensor.height) - 1 > DAT_MAX_XY:
            raise ValueError(f".dat holds coordinates < 2^14, got a {sensor.width}x{sensor.height} sensor")
    rec = np.empty(events.size, dtype=DAT_RECORD)
    rec["t"] = events["t"].astype(np.int64) & 0xFFFFFFFF
    rec["w"] = events["x"].astype(np.uint32) | events["y"].astype(np.uint32) << 14 | events["p"].astype(np.uint32) << 28
    header = (
        f"% Data file containing CD events.\n% Version 2\n% Width {sensor.width}\n% Height {sensor.height}\n"
    ).encode("ascii")
    with path.open("wb") as f:
        f.write(header + bytes([12, DAT_RECORD.itemsize]))
        f.write(rec.tobytes())


def read_raw(path: Path) -> EventFile:
    """Decode a Prophesee EVT 2.0 or EVT 3.0 ``.raw`` file (encoding named by its header)."""
    buf = read_bytes(path)
    header, pos = parse_header(buf, path)
    encoding = raw_encoding(header)
    if encoding not in ("evt2", "evt3"):
        found = f"'{encoding}'" if encoding else "none"
        raise EventFileError(path, f"unsupported Prophesee .raw encoding {found} (EVT 2.0 and EVT 3.0 are supported)")
    word = np.dtype("<u4" if encoding == "evt2" else "<u2")
    body = len(buf) - pos
    if body % word.itemsize:
        raise EventFileError(
            path,
            f"truncated: {body} bytes of {encoding.upper()} data is not a whole number of {word.itemsize}-byte words",
        )
    words = np.frombuffer(buf, dtype=word, offset=pos)
    events, beyond_x, time_back = decode_evt2(words) if encoding == "evt2" else decode_evt3(words)
    if beyond_x:
        raise EventFileError(path, f"corrupt: {beyond_x} vector events beyond x = 2047, the EVT 3.0 coordinate limit")
    if time_back:
        raise EventFileError(path, f"corrupt: {time_back} time-high words step back in time without wrapping around")
    events = sort_plausible(path, events)
    plugin = header.get("plugin_name", "").lower()
    default = next((s for key, s in PLUGIN_SENSORS if key in plugin), None)
    return EventFile(events, _sensor(path, events, header, default))
