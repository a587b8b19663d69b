"""The corpus folder a writer works in: made (or refused in one line) and held by one writer at a time."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mem_core.corpus.format import MANIFEST, CorpusError

NOT_CORPORA = (("config.json", "a run"), ("model.json", "an export"))  # what a corpus is not written into


def prepare_corpus_dir(root: Path) -> None:
    """Create the corpus directory ``root`` (with its parents) if needed; ``CorpusError`` in one line when it cannot
    be one (an existing file, a path too long, no permission)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CorpusError(f"{root}: exists and is not a directory, so it cannot hold a corpus") from None
    except OSError as e:
        raise CorpusError(f"{root}: cannot hold a corpus ({e.strerror or e})") from None
    for name, what in NOT_CORPORA:  # (a corpus written there went in among a run's or an export's files)
        if (root / name).exists() and not (root / MANIFEST).exists():
            raise CorpusError(f"{root}: holds {what} ({name}), not a corpus: give the corpus a folder of its own")


def take_writer_lock(root: Path) -> int:
    """The corpus ``root``'s writer lock (an ``flock`` on ``.writer.lock``, released by the kernel if its holder
    dies), as a descriptor to ``os.close`` when done; ``CorpusError`` while another writer holds it."""
    fd = os.open(root / ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CorpusError(f"{root}: another CorpusWriter has this corpus open") from None
    return fd
