"""What a folder of event files holds, before it is ingested: ``mem inspect FOLDER`` (a folder without a corpus
manifest).

Each file is described by ``mem_core.io.describe`` (format, events, sensor, time range). The readers decode whole
files, so what is read is capped: a file over ``max_file_bytes`` is named with its format (found from its first
bytes) and size but not decoded, and only the first ``max_files`` files are described; the summary says how many
were left out.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from mem_core.files import NotRegularFile
from mem_core.io import EventFileError, describe, detect_format

EVENT_SUFFIXES = (".dat", ".bin", ".bs2", ".raw", ".aedat4", ".npz", ".h5", ".hdf5", ".evz")
MAX_FILE_BYTES = 256 << 20  # a file larger than this is not decoded (`mem inspect FILE` decodes it)
MAX_FILES = 200


def event_files(root: Path) -> list[Path]:
    """The event files under ``root`` (by extension, searched recursively), in a fixed order."""
    return found_files(root)[0]


def found_files(root: Path) -> tuple[list[Path], list[dict[str, str]]]:
    """The event files under ``root`` (``event_files``), and the other paths named as one that are no file to read,
    each ``{"path", "reason"}``: a link to nowhere or round in a loop, a FIFO, a device, a socket."""
    files, others = [], []
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() in EVENT_SUFFIXES:
            reason = _no_file(path)
            if reason is None:
                files.append(path)
            elif reason:
                others.append({"path": str(path), "reason": reason})
    return files, others


def _no_file(path: Path) -> str | None:
    """Why ``path`` is no regular file; None when it is one, "" for a folder (its files are found on their own)."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link in a loop"
        if isinstance(e, FileNotFoundError) and path.is_symlink():
            return f"a symbolic link to nowhere ({os.readlink(path)})"
        return (e.strerror or str(e)).lower()  # (removed while listed, no permission)
    if stat.S_ISREG(mode):
        return None
    return "" if stat.S_ISDIR(mode) else str(NotRegularFile(mode))


def describe_folder(
    root: str | os.PathLike,
    *,
    max_files: int | None = None,
    max_file_bytes: int | None = None,
    follow_links: bool = False,
) -> dict[str, Any]:
    """``{"root", "event_files", "files", "not_described", "max_file_bytes"}``: each of the first ``max_files``
    (default ``MAX_FILES``) event files as ``describe`` gives it plus ``path`` (relative to ``root``), ``bytes`` and
    ``format``; ``"decoded": False`` for a file over ``max_file_bytes`` (default ``MAX_FILE_BYTES``), ``"error"`` for
    one that cannot be read; ``follow_links`` as for ``mem_core.io.read_events``."""
    root = Path(root)
    max_files = MAX_FILES if max_files is None else max_files
    max_file_bytes = MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
    found = event_files(root)
    files = []
    for path in found[:max_files]:
        row: dict[str, Any] = {"path": str(path.relative_to(root))}
        try:
            row["bytes"] = path.stat().st_size
            row["format"] = detect_format(path)  # from the first bytes
            row["decoded"] = row["bytes"] <= max_file_bytes
            if row["decoded"]:
                row.update(describe(path, follow_links=follow_links))
        except EventFileError as e:
            row["error"] = e.reason
        except OSError as e:  # a link to nowhere, a file removed while listed
            row["error"] = e.strerror or str(e)
        files.append(row)
    return {
        "root": str(root),
        "event_files": len(found),
        "files": files,
        "not_described": len(found) - len(files),
        "max_file_bytes": max_file_bytes,
    }
