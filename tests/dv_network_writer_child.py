"""A dv-processing ``NetworkWriter`` streaming known events, as a child process for tests (DV's TCP output stand-in).

    python dv_network_writer_child.py PORT   # serves 120 x 100 events on 127.0.0.1:PORT until killed

Batch k (every 10 ms once a client is connected) holds 100 events: t = 10 000 k + 100 i, x = (7 i + k) % 120,
y = (3 i + k) % 100, polarity i % 2, for i = 0..99; ``expected_batch`` in the tests computes the same.
"""

from __future__ import annotations

import sys
import time

import dv_processing as dv


def main(port: int) -> None:
    stream = dv.io.Stream.EventStream(0, "events", "DVXplorer_test", (120, 100))
    writer = dv.io.NetworkWriter("127.0.0.1", port, stream)
    print("listening", flush=True)
    k = 0
    while True:
        if writer.getClientCount() == 0:
            time.sleep(0.005)
            continue
        store = dv.EventStore()
        for i in range(100):
            store.push_back(10_000 * k + 100 * i, (7 * i + k) % 120, (3 * i + k) % 100, bool(i % 2))
        writer.writeEvents(store)
        k += 1
        time.sleep(0.01)


if __name__ == "__main__":
    main(int(sys.argv[1]))
