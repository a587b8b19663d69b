"""A corpus writer run as a child process by tests/test_corpus.py (it gets killed, or its disk "fills up").

    python corpus_writer_child.py ROOT stream   # two labelled samples, then a live recording appended forever
    python corpus_writer_child.py ROOT fsize    # same, but the file-size limit is cut so shard writes fail (EFBIG)

The live stream is ``live_events(start, n)``: event i has t = 10 i, so the parent can rebuild any prefix.
"""

from __future__ import annotations

import json
import resource
import signal
import sys

import numpy as np

from mem_core.corpus import CorpusFullError, CorpusWriter
from mem_core.events import SensorSize, make_events

SENSOR = SensorSize(32, 48)
BATCH = 20_000


def live_events(start: int, n: int) -> np.ndarray:
    """Events ``[start, start + n)`` of the deterministic live stream."""
    i = np.arange(start, start + n)
    return make_events(10 * i, i % SENSOR.width, (i // SENSOR.width) % SENSOR.height, i % 2)


def sample_events(k: int) -> np.ndarray:
    """The ``k``-th labelled sample written before the live stream."""
    return live_events(1000 * k, 500 + k)


def main(root: str, mode: str) -> None:
    writer = CorpusWriter(root, provenance={"by": "corpus_writer_child"}, flush_interval_s=0.02, min_free_bytes=0)
    for k in range(2):
        writer.add_recording(f"sample{k}", sample_events(k), SENSOR, label=k)
    writer.begin_recording("live", SENSOR, metadata={"source": "child"})
    writer.append(live_events(0, BATCH))
    writer.flush()
    if mode == "fsize":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        limit = max(p.stat().st_size for p in writer.root.glob("shard-*.h5")) + (1 << 20) + 100_000
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    done = BATCH
    while True:
        try:
            writer.append(live_events(done, BATCH))
        except CorpusFullError as e:
            print(json.dumps({"error": type(e).__name__, "errno": e.errno, "message": str(e)}), flush=True)
            writer.close()
            return
        done += BATCH


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
