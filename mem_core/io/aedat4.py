"""iniVation AEDAT4 (``.aedat4``): decoded by dv-processing in a child interpreter.

Why a child process: on a damaged file (a few corrupted bytes in a compressed packet, or random bytes after
the magic) dv-processing 2.0.4 can spin forever inside one call that holds the GIL, and a native library can
abort the interpreter. The child is killed after a size-dependent timeout and any failure becomes an
``EventFileError``; it costs about 0.3 s of interpreter start-up per file. The magic and the header size are
checked here first, so most non-AEDAT4 files never reach dv-processing.
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from mem_core.events import EVENT_DTYPE, SensorSize
from mem_core.io.base import EventFile, EventFileError, check_on_sensor, sort_by_time

MAGIC = b"#!AER-DAT4.0\r\n"
CHILD = Path(__file__).with_name("_aedat4_child.py")
# Decoding timeout: a fixed allowance plus a slow worst-case rate, so a healthy large file never times out.
TIMEOUT_BASE_S = 60.0
TIMEOUT_S_PER_MB = 1.0


def check_header(path: Path) -> None:
    """Raise ``EventFileError`` unless the file starts with the AEDAT 4.0 magic and a plausible header size."""
    try:
        with path.open("rb") as f:
            head = f.read(len(MAGIC) + 4)
            size = path.stat().st_size
    except OSError as e:
        raise EventFileError(path, f"cannot read the file ({e.strerror or e})") from e
    if len(head) < len(MAGIC) + 4 and (MAGIC + b"\0" * 4).startswith(head[: len(MAGIC)]):
        raise EventFileError(path, "truncated: the file ends inside the AEDAT4 header")
    if not head.startswith(MAGIC):
        raise EventFileError(path, f"not an AEDAT 4.0 file (starts with {head[: len(MAGIC)]!r})")
    (header_size,) = struct.unpack_from("<i", head, len(MAGIC))
    if header_size <= 0 or len(head) + header_size > size:
        raise EventFileError(path, f"corrupt: AEDAT4 header size {header_size} does not fit the {size}-byte file")


def read_aedat4(path: Path, timeout: float | None = None) -> EventFile:
    """Decode the event stream of an AEDAT4 file; ``timeout`` (s) defaults to a size-dependent limit."""
    check_header(path)
    if timeout is None:
        timeout = TIMEOUT_BASE_S + TIMEOUT_S_PER_MB * path.stat().st_size / 1e6
    with tempfile.TemporaryDirectory(prefix="mem-aedat4-") as tmp:
        out = Path(tmp) / "events.npy"
        try:
            proc = subprocess.run(
                [sys.executable, str(CHILD), str(path), str(out)], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            raise EventFileError(
                path, f"dv-processing did not finish decoding within {timeout:.0f} s (damaged file?)"
            ) from e
        if proc.returncode < 0:
            signum = -proc.returncode
            name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
            raise EventFileError(path, f"dv-processing crashed ({name}) decoding the file")
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            raise EventFileError(path, f"dv-processing cannot decode it: {lines[-1] if lines else 'no message'}")
        try:
            geometry = json.loads(proc.stdout.strip().splitlines()[-1])
            sensor = SensorSize(int(geometry["height"]), int(geometry["width"]))
            raw = np.load(out, allow_pickle=False)
        except (IndexError, KeyError, TypeError, ValueError, OSError) as e:
            raise EventFileError(path, f"the dv-processing child gave no usable result ({e!r})") from e
    events = np.empty(raw.size, dtype=EVENT_DTYPE)
    events["t"] = raw["timestamp"]
    events["x"] = raw["x"]
    events["y"] = raw["y"]
    events["p"] = raw["polarity"] > 0
    events = sort_by_time(events)
    check_on_sensor(path, events, sensor, "the AEDAT4 stream info")
    return EventFile(events, sensor)
