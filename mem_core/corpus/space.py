"""The disk space a corpus writer keeps: free space checked before a write, the file-size limit (``ulimit -f``), and
a ballast file deleted when a write fails for lack of room, so HDF5 can still close the shard."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import shutil
from pathlib import Path

from mem_core.corpus.format import CorpusError, CorpusFullError

# The ballast: 16 MiB, or 1/32 of the free space on a small disk (at least 1 MiB), where 16 MiB took most of the room
# and a recording kept no events.
RESERVE_BYTES = 16 << 20
MIN_RESERVE_BYTES = 1 << 20
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
METADATA_BYTES = 1 << 20  # what HDF5 may add to a shard beyond its events


def full_errno(exc: BaseException) -> int | None:
    """The disk-full errno behind an OSError or an h5py error message (HDF5 reports "errno = 28"), else None."""
    codes = [getattr(exc, "errno", None), *(int(c) for c in re.findall(r"errno = (\d+)", str(exc)))]
    return next((c for c in codes if c in FULL_ERRNOS), None)


class DiskSpace:
    """The room a writer in ``root`` keeps above ``min_free_bytes``, and its ballast (``.reserve``)."""

    def __init__(self, root: Path, min_free_bytes: int) -> None:
        self.root = root
        self.min_free_bytes = min_free_bytes
        self.ballast = root / ".reserve"
        self.free_seen = 0  # free bytes at the last check, less what was written since
        self._folder: int | None = None  # the folder holding the ballast, open: it is deleted there if moved away

    def take_ballast(self) -> None:
        """Write the ballast (refused, ``CorpusError``, when the disk cannot take it)."""
        reserve = min(RESERVE_BYTES, max(shutil.disk_usage(self.root).free // 32, MIN_RESERVE_BYTES))
        self.check(reserve)
        self._folder = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with open(self.ballast, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, reserve)
        self.free_seen = shutil.disk_usage(self.root).free

    def release_ballast(self) -> None:
        """Delete the ballast, in the folder it was written in even when that folder was moved away since (a moved
        labels corpus kept its 16 MB)."""
        folder, self._folder = self._folder, None
        with contextlib.suppress(OSError):  # (the folder itself may be gone)
            if folder is not None:
                os.unlink(self.ballast.name, dir_fd=folder)
            else:
                self.ballast.unlink(missing_ok=True)
        if folder is not None:
            os.close(folder)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` (plus HDF5's metadata) fit above ``min_free_bytes``, by the free space seen at the last
        check less what was written since (no disk query on the append path)."""
        return self.free_seen - nbytes - METADATA_BYTES >= self.min_free_bytes

    def check(self, pending_bytes: int, shard: Path | None = None) -> None:
        """A ``CorpusFullError`` before a write of ``pending_bytes`` that the disk (or, for the open ``shard``,
        ``ulimit -f``) cannot take, a ``CorpusError`` when the folder cannot be looked at (moved or deleted under the
        writer)."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError as e:
            raise self.failure(e, self.root) from e
        self.free_seen = free - pending_bytes  # at most what the write takes (it compresses)
        file_limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if shard is not None and file_limit != resource.RLIM_INFINITY:
            try:
                size = shard.stat().st_size
            except OSError as e:
                raise self.failure(e, shard) from e
            if size + pending_bytes + METADATA_BYTES > file_limit:
                raise CorpusFullError(
                    errno.EFBIG,
                    f"{shard}: {pending_bytes} more bytes would pass the file-size limit of {file_limit} bytes "
                    f"(ulimit -f); {free} bytes free in {self.root}; events committed before are kept",
                )
        if free - pending_bytes < self.min_free_bytes:
            raise CorpusFullError(
                errno.ENOSPC,
                f"{self.root}: only {free} bytes free on its disk ({pending_bytes} to write), below "
                f"min_free_bytes={self.min_free_bytes}; events committed before are kept",
            )

    def failure(self, exc: BaseException, path: Path) -> CorpusError:
        """A failed write to ``path`` as the error to stop with: ``CorpusFullError`` when the disk is full (the
        ballast is then deleted, room for HDF5 to close the shard cleanly), else ``CorpusError``."""
        code = full_errno(exc)
        if code is None:
            return CorpusError(f"{path}: write failed ({exc}); events committed before are kept")
        self.release_ballast()
        try:
            free = f"{shutil.disk_usage(self.root).free} bytes free"
        except OSError as e:
            free = f"free space unknown ({e.strerror or e})"
        return CorpusFullError(
            code, f"{path}: disk full ({os.strerror(code)}), {free} in {self.root}; events committed before are kept"
        )
