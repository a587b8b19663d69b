"""Files a user names by path (a config, a run's JSON and checkpoints, an export's weights), read the way the event
readers read theirs: a regular file only, opened without blocking and checked on the open descriptor
(``open_regular``: a FIFO blocked its reader for good while it held the GIL, ``/dev/zero`` never
ends), and never more bytes than a bound that the file's size is checked against before a byte is read. And the
temporary file an atomic write renames into place, made with the permissions the user's umask gives.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO


class NotRegularFile(OSError):
    """A path that is (or links to) a FIFO, a device, a socket or a directory where a regular file is read.

    A FIFO blocks whoever opens it until a writer comes (``mem inspect`` hung on one), and a device such as
    ``/dev/zero`` never ends (a reader filled the memory): readers open regular files only.
    """

    def __init__(self, mode: int) -> None:
        kinds = (
            (stat.S_ISDIR, "a directory"),
            (stat.S_ISFIFO, "a FIFO"),
            (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"),
        )
        super().__init__(f"not a regular file ({next((k for test, k in kinds if test(mode)), 'of an unknown kind')})")


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` (symlinks resolved) opened for reading; ``NotRegularFile`` unless it is a regular file, other
    ``OSError``s as the system raises them. Opened without blocking and checked on the open descriptor, so a FIFO
    put in the file's place after a check cannot block the open either."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(mode)
    return os.fdopen(fd, "rb")


def check_regular(path: str | os.PathLike) -> None:
    """``open_regular``'s checks alone, for a library that opens the file by name itself (h5py)."""
    open_regular(path).close()


def os_problem(error: OSError) -> str:
    """An ``OSError`` met opening or reading a file, as a reason: missing, not a regular file, or what the OS said."""
    if isinstance(error, FileNotFoundError):
        return "no such file or directory"
    if isinstance(error, NotRegularFile):
        return str(error)
    return f"cannot read the file ({error.strerror or error})"


class FileTooLarge(OSError):
    """A regular file larger than what its reader takes."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes ({size} bytes)")


def open_bounded(path: str | os.PathLike, limit: int) -> BinaryIO:
    """``path`` opened for reading as ``open_regular`` opens it, refused with ``FileTooLarge`` when it holds more
    than ``limit`` bytes; other ``OSError``s as the system raises them."""
    f = open_regular(path)
    size = os.fstat(f.fileno()).st_size
    if size > limit:
        f.close()
        raise FileTooLarge(size, limit)
    return f


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (a file that grows while it is read is
    refused too); errors as ``open_bounded``'s."""
    with open_bounded(path, limit) as f:
        # what the file holds and a byte more: read(limit + 1) would allocate the whole limit before reading a byte
        data = f.read(os.fstat(f.fileno()).st_size + 1)
        while len(data) <= limit and (more := f.read(min(1 << 20, limit + 1 - len(data)))):
            data += more  # the file grows while it is read
    if len(data) > limit:
        raise FileTooLarge(len(data), limit)
    return data


def file_problem(error: OSError) -> str:
    """Why a file could not be read, as the reason of a one-line error: missing, not a regular file, too large, or
    what the system said."""
    return str(error) if isinstance(error, FileTooLarge) else os_problem(error)


def temp_beside(path: str | os.PathLike) -> tuple[int, Path]:
    """A new empty file ``.<name>.<random>.tmp`` beside ``path``, open for writing (descriptor, path), to rename over
    ``path`` once written. Its mode is what the umask leaves of 0666, as for any file the user makes (``mkstemp``
    makes 0600: a run or an export written by one user could not be read by another)."""
    path = Path(path)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
