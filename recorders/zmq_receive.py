"""Receiving one ZMQ message within a frame count and a byte total, for every socket that reads from a peer it does
not trust (the live server's control socket, the ``tcp://`` events source).

libzmq's ``MAXMSGSIZE`` bounds each frame, not how many frames a message has, and ``recv_multipart`` copies a whole
message before anything can look at it: one control request of 400 frames of 1 MiB grew ``mem serve`` by 800 MB and
kept it. Here a message is read frame by frame without copying, each frame released as soon as the message is known
to be too large, and the memory such a message took is handed back to the system.

libzmq itself still holds a whole multipart message before its first frame can be read (it delivers messages
atomically), so what a message costs while it arrives is bounded by the peer's frame size limit on sockets that set
one, not by these limits; afterwards nothing of it is kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import zmq


def recv_bounded(socket: zmq.Socket, max_frames: int, max_bytes: int) -> list[zmq.Frame] | None:
    """The frames of the next message on ``socket`` (which must have one waiting), or None when it has more than
    ``max_frames`` frames or ``max_bytes`` bytes in all: then the rest of it is read and dropped, frame by frame."""
    frames: list[zmq.Frame] | None = []
    size = 0
    while True:
        frame = socket.recv(copy=False)
        if frames is not None:
            size += len(frame)
            if len(frames) == max_frames or size > max_bytes:
                frames = None  # the frames kept so far go with the list
            else:
                frames.append(frame)
        if not frame.more:
            if frames is None:
                give_back_memory()
            return frames


def give_back_memory() -> None:
    """Return the heap memory freed since to the system (glibc's ``malloc_trim``; elsewhere nothing): the frames of a
    large message come back from libzmq's allocations, which glibc otherwise keeps for the process."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    libc = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
