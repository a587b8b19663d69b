"""``snapshot_corpus``: a corpus's committed recordings at one moment, as a corpus of its own that shares the shards.

A shard is never written again once its writer closed it or died (a writer re-opening a corpus starts a new shard,
``format``), so a snapshot taken while no writer holds the corpus can share the shard files: hard links, or copies
where the two folders are on different file systems. Recordings committed or taken out later leave it alone.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mem_core.corpus.folder import prepare_corpus_dir, take_writer_lock
from mem_core.corpus.format import MANIFEST, CorpusError, load_manifest, parse_manifest, write_manifest
from mem_core.corpus.reader import Corpus

SNAPSHOT_OF = "snapshot_of"  # the provenance key naming the corpus (resolved path) a snapshot was taken of


def snapshot_corpus(root: str | os.PathLike, dest: str | os.PathLike, provenance: dict[str, Any]) -> Corpus:
    """The recordings ``root`` holds now, as a new corpus at ``dest``; its last provenance entry is ``provenance``
    with ``snapshot_of`` (``root`` resolved). ``CorpusError`` while a writer holds ``root`` or when ``dest`` holds a
    corpus already; an ``OSError`` from the file system as it is."""
    root, dest = Path(root), Path(dest)
    prepare_corpus_dir(dest)
    if (dest / MANIFEST).exists():
        raise CorpusError(f"{dest}: holds a corpus already; a snapshot goes into a new folder")
    lock = take_writer_lock(root)  # no writer may commit while the shards are shared
    try:
        manifest = load_manifest(root)
        _, recordings = parse_manifest(manifest, str(root / MANIFEST))  # a damaged manifest is not passed on
        used = {r.shard for r in recordings}
        for name in sorted(used):
            try:
                os.link(root / name, dest / name)
            except OSError:  # another file system, or one without hard links
                shutil.copyfile(root / name, dest / name)
    finally:
        os.close(lock)
    entry = {
        "opened_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        **provenance,
        SNAPSHOT_OF: str(root.resolve()),
    }
    manifest.pop("journal", None)  # (applied: the snapshot is its manifest alone)
    write_manifest(
        dest,
        {
            **manifest,
            "provenance": [*manifest.get("provenance", []), entry],
            "shards": [e for e in manifest["shards"] if e["file"] in used],
        },
    )
    return Corpus(dest)
