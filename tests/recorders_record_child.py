"""``mem record --source sim`` without the CLI's start-up cost, as a child process for tests/test_record.py.

    python recorders_record_child.py OUT NAME    # records the simulator in real time until SIGINT/SIGTERM/SIGKILL

On a clean stop it prints the ``RecordResult`` as one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from recorders.config import RecordConfig
from recorders.record import run


def main(out: str, name: str) -> None:
    result = run(RecordConfig(source="sim", out=Path(out), name=name, min_free_bytes=0, status=False))
    print(json.dumps(dataclasses.asdict(result), default=str), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
