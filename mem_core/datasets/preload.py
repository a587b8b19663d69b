"""Samples stored one per file, decoded once into memory for the epochs that read them again.

A training epoch reads every sample of its split, and every epoch reads them all again: decoding a 100 ms N-Cars
``.dat`` file costs about half of what cutting, augmenting and collating its window does, and an LZMA-packed ``.evz``
file about four times that (docs/BENCHMARKS.md), so a loader whose workers decode files at every epoch feeds a GPU at a
fraction of its rate. ``preload`` reads the files a loader will use once, in threads (file reads and LZMA decompression
release the GIL), into arrays of 256 samples each; the loader's worker processes, forked after it, share its pages.
Sources that are no files (a corpus reads its shards in slices, the simulator draws its samples) are left as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mem_core.cores import usable_cores
from mem_core.datasets.base import EventSource, FileSource
from mem_core.datasets.unlabeled import JoinedSource

CHUNK_SAMPLES = 256  # decoded and joined at a time: memory holds the samples once, and the newest chunk twice


class PreloadedSource(EventSource):
    """``source`` with the samples ``indices`` held in memory (arrays of their events, each holding a chunk of them,
    and where each sample is); any other sample is read from ``source`` as before."""

    def __init__(self, source: EventSource, indices: np.ndarray, chunks: list[np.ndarray], where: np.ndarray) -> None:
        self.source = source
        self.name, self.sensor, self.classes, self.labels = source.name, source.sensor, source.classes, source.labels
        self.chunks, self.where = chunks, where  # where: (len(indices), 3) chunk, first event, end
        self.slot = np.full(len(source), -1, dtype=np.int64)
        self.slot[indices] = np.arange(len(indices))

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self.chunks)

    def load(self, index: int) -> np.ndarray:
        k = int(self.slot[index])
        if k < 0:
            return self.source.load(index)
        chunk, lo, hi = (int(v) for v in self.where[k])
        # a copy: what the loader does to a window (augmentation) must never reach the preloaded events
        return self.chunks[chunk][lo:hi].copy()

    def mask(self, index: int) -> np.ndarray | None:
        return self.source.mask(index)

    @property
    def mask_classes(self) -> list[str]:
        return self.source.mask_classes


def preload(
    source: EventSource,
    indices: np.ndarray,
    budget_bytes: int,
    threads: int = 0,
    say: Callable[[str], None] | None = None,
) -> EventSource:
    """``source`` with the samples ``indices`` decoded into memory when it reads files (``FileSource``, or sources
    joined of them) and they take at most ``budget_bytes``; ``source`` itself otherwise, given up as soon as the
    samples decoded so far say the rest would not fit. ``threads``: 0 is one per usable core. ``say`` hears one line
    of what was held when it took a moment, or why the files are read at every epoch."""
    if budget_bytes <= 0 or len(indices) == 0:
        return source
    if isinstance(source, JoinedSource):
        return _preload_joined(source, indices, budget_bytes, threads, say)
    if not isinstance(source, FileSource):
        return source
    started = time.perf_counter()
    indices = np.asarray(indices, dtype=np.int64)
    chunks, where, held = [], [], 0
    with ThreadPoolExecutor(max_workers=threads or usable_cores()) as pool:
        for first in range(0, len(indices), CHUNK_SAMPLES):
            windows = list(pool.map(source.load, indices[first : first + CHUNK_SAMPLES].tolist()))
            ends = np.cumsum([len(w) for w in windows])
            where += [(len(chunks), end - len(w), end) for w, end in zip(windows, ends, strict=True)]
            chunks.append(np.concatenate(windows))
            held += chunks[-1].nbytes
            expected = held * len(indices) / len(where)
            if expected > budget_bytes:
                if say is not None:
                    say(
                        f"{source.name}: {len(indices):,} samples read from their files at every epoch: about "
                        f"{expected / 2**20:,.0f} MiB decoded, over the {budget_bytes / 2**20:,.0f} MiB held in memory"
                        " (data.preload_mib)"
                    )
                return source
    loaded = PreloadedSource(source, indices, chunks, np.asarray(where, dtype=np.int64))
    seconds = time.perf_counter() - started
    if say is not None and seconds >= 1:
        say(
            f"{source.name}: {len(indices):,} samples held in memory ({held / 2**20:,.0f} MiB, read in {seconds:.0f} s)"
        )
    return loaded


def _preload_joined(
    source: JoinedSource, indices: np.ndarray, budget_bytes: int, threads: int, say: Callable[[str], None] | None
) -> JoinedSource:
    """The joined sources each preloaded with their share of ``indices`` and of the budget left."""
    indices = np.asarray(indices, dtype=np.int64)
    parts, left = [], budget_bytes
    for part, lo in source.parts():
        mine = indices[(indices >= lo) & (indices < lo + len(part))] - lo
        loaded = preload(part, mine, left, threads, say)
        if isinstance(loaded, PreloadedSource):
            left -= loaded.nbytes
        parts.append(loaded)
    joined = JoinedSource(parts)
    joined.name = source.name
    return joined
