"""What a folder of event files holds, before it is ingested: ``mem inspect FOLDER`` (a folder without a corpus
manifest).

Each file is described by ``mem_core.io.describe`` (format, events, sensor, time range). The readers decode whole
files, so what is read is capped: a file over ``max_file_bytes`` is named with its format (found from its first
bytes) and size but not decoded, and only the first ``max_files`` files are described; the summary says how many
were left out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mem_core.io import EventFileError, describe, detect_format

EVENT_SUFFIXES = (".dat", ".bin", ".bs2", ".raw", ".aedat4", ".npz", ".h5", ".hdf5", ".evz")
MAX_FILE_BYTES = 256 << 20  # a file larger than this is not decoded (`mem inspect FILE` decodes it)
MAX_FILES = 200


def event_files(root: Path) -> list[Path]:
    """The event files under ``root`` (by extension, searched recursively), in a fixed order."""
    return [path for path in sorted(root.rglob("*")) if path.suffix.lower() in EVENT_SUFFIXES and path.is_file()]


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
