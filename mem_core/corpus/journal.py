"""The manifest of a corpus being written and its journal: each commit appends what changed as one JSON line
(fsynced), so a commit costs the change, not the corpus; the journal is folded into the manifest once it outgrows it,
and on close (see ``mem_core.corpus.format`` for what a reader makes of them)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mem_core.corpus.format import (
    FORMAT_VERSION,
    JOURNAL,
    JOURNAL_NAME,
    MANIFEST,
    CorpusError,
    fsync_path,
    load_manifest,
    parse_manifest,
    write_manifest,
)

MIN_FOLD_BYTES = 1 << 16  # a journal is folded into the manifest once larger than it, and than this
SHARD_FILE = re.compile(r"shard-(\d+)\.h5$")  # any shard file on disk, whether the manifest names it or not


class ManifestJournal:
    """The manifest of the corpus at ``root`` (``manifest``: the dict readers get, entries changed in place) and the
    changes not yet committed. A failed write is ``fail(exc, path)``, the error the writer stops with."""

    def __init__(
        self, root: Path, provenance: dict[str, Any] | None, fail: Callable[[BaseException, Path], CorpusError]
    ) -> None:
        self.root = root
        self._fail = fail
        shards_on_disk = [int(m.group(1)) for p in root.iterdir() if (m := SHARD_FILE.fullmatch(p.name))]
        if (root / MANIFEST).exists():
            self.manifest = load_manifest(root)
            parse_manifest(self.manifest, str(root / MANIFEST))  # refuse to extend a damaged manifest
        elif shards_on_disk:
            raise CorpusError(f"{root}: holds shard files but no {MANIFEST}; refusing to start a new corpus over them")
        else:
            self.manifest = {"format_version": FORMAT_VERSION, "provenance": [], "shards": [], "recordings": []}
        self.manifest["format_version"] = FORMAT_VERSION  # (a version 1 corpus gets a journal from now on)
        self.next_shard = max(shards_on_disk, default=-1) + 1
        entry = {"opened_utc": datetime.now(UTC).isoformat(timespec="seconds"), **(provenance or {})}
        try:
            json.dumps(entry)
        except (TypeError, ValueError) as e:
            raise ValueError(f"provenance must be JSON-serialisable: {e}") from e
        self.manifest["provenance"].append(entry)
        # What changed since the last commit: shard entries by file, recording entries by name (the same dicts the
        # manifest holds), names taken out.
        self._shards: dict[str, dict[str, Any]] = {}
        self._recordings: dict[str, dict[str, Any]] = {}
        self._removed: list[str] = []
        self._fd: int | None = None  # opened at the first commit after a fold
        self._journal_bytes = 0
        self._manifest_bytes = 0

    def shard_changed(self, entry: dict[str, Any]) -> None:
        self._shards[entry["file"]] = entry

    def recording_changed(self, entry: dict[str, Any]) -> None:
        self._recordings[entry["name"]] = entry

    def recording_removed(self, name: str) -> None:
        self._recordings.pop(name, None)
        self._removed.append(name)

    def commit(self) -> None:
        """Append what changed since the last commit as one line and fsync it; fold once the journal outgrows the
        manifest, so a reader's fold stays as cheap as reading the manifest."""
        change = {
            "shards": list(self._shards.values()),
            "removed": self._removed,
            "recordings": list(self._recordings.values()),
        }
        change = {key: entries for key, entries in change.items() if entries}
        if not change:
            return
        line = (json.dumps(change) + "\n").encode()
        path = self.root / JOURNAL.format(self.manifest["journal"])
        try:
            if self._fd is None:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                fsync_path(self.root)  # its name as durable as its lines
            rest = memoryview(line)
            while rest:
                rest = rest[os.write(self._fd, rest) :]
            os.fsync(self._fd)
        except OSError as e:  # a line cut short here is one a reader leaves out: no newline
            raise self._fail(e, path) from e
        self._journal_bytes += len(line)
        self._forget_changes()
        if self._journal_bytes > max(self._manifest_bytes, MIN_FOLD_BYTES):
            self.fold()

    def fold(self) -> None:
        """Write the whole manifest (atomically), naming a new, empty journal, then remove the journals it holds."""
        self.close()
        self.manifest["journal"] = self.manifest.get("journal", 0) + 1
        try:
            self._manifest_bytes = write_manifest(self.root, self.manifest)
            for path in self.root.iterdir():  # the one folded in and any a crash left: the new one starts empty
                if JOURNAL_NAME.fullmatch(path.name):
                    path.unlink(missing_ok=True)
        except OSError as e:
            raise self._fail(e, self.root / MANIFEST) from e
        self._journal_bytes = 0
        self._forget_changes()

    def close(self) -> None:
        """Close the journal file (the next commit opens it again)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _forget_changes(self) -> None:
        self._shards, self._recordings, self._removed = {}, {}, []
