"""The one harness for "a damaged file is read as valid data or refused by name": ``ChildReader`` reads each file
it is given in a child process (this file run as a script) under an address-space limit of what the child holds
after its imports plus ``BUDGET_BYTES``, and a time bound per file. A hang, a crash, a ``MemoryError`` or any
exception other than the project's own refusal naming the file is a finding, reported with the file's label.

Its mutant sources: seeded byte mutants (``mutants.byte_mutants``, ``json_mutants``), hypothesis-drawn bytes (the tests
draw them and hand each file to the same child) and hand-built hostile files (``hostile.py``).
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

BUDGET_BYTES = 1 << 30  # memory a reader may take beyond the child's baseline (imports, numba, torch)
READ_SECONDS = 20.0  # the time bound per file
START_SECONDS = 300.0  # the child's imports on a loaded machine (torch for models)
KINDS = ("events", "corpus", "model")


# ------------------------------------------------------------------------------------------ the reading child


class Outcome(NamedTuple):
    """``valid``, ``refused`` (by name), or a finding: ``unnamed`` (a refusal that names no file), ``bad`` (any
    other exception), ``hung`` (past ``READ_SECONDS``), ``died`` (the child ended)."""

    outcome: str
    detail: str
    seconds: float

    @property
    def fine(self) -> bool:
        return self.outcome in ("valid", "refused") and self.seconds <= READ_SECONDS


class ChildReader:
    """Reads files of one ``kind`` in a child process that outlives them: ``read(path)`` sends the path, waits up to
    ``READ_SECONDS`` for the outcome, and starts a new child after one that hung or died."""

    def __init__(self, kind: str, work: Path) -> None:
        assert kind in KINDS, kind
        self.kind, self.work = kind, work
        self._child: subprocess.Popen | None = None
        self._stderr = work / f"{kind}-reader.stderr"

    def read(self, path: Path) -> Outcome:
        child = self._child or self._start()
        child.stdin.write(f"{json.dumps(str(path))}\n".encode())
        child.stdin.flush()
        line = self._line(READ_SECONDS)
        if line is None:
            self.close()
            return Outcome("hung", f"no outcome within {READ_SECONDS} s", READ_SECONDS)
        if not line:
            self.close()
            return Outcome("died", self._stderr.read_text(errors="replace")[-1500:], 0.0)
        return Outcome(**json.loads(line))

    def check(self, cases: list[tuple[str, Path]]) -> dict[str, int]:
        """Read every case; assert each was read as valid data or refused by name, in time. Counts per outcome."""
        outcomes = [(label, self.read(path)) for label, path in cases]
        problems = [f"{label}: {o.outcome} ({o.seconds:.1f} s) {o.detail}" for label, o in outcomes if not o.fine]
        assert not problems, f"{self.kind}: " + "\n".join(problems)
        counts = {"refused": 0, "valid": 0}
        for _, o in outcomes:
            counts[o.outcome] += 1
        return counts

    def __enter__(self) -> ChildReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child.stdin.close()
            self._child.stdout.close()
            self._child = None

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}  # glibc's arenas eat address space
        with self._stderr.open("wb") as stderr:
            self._child = subprocess.Popen(
                [sys.executable, __file__, self.kind],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
            )
        ready = self._line(START_SECONDS)
        if ready != "ready\n":
            self.close()
            raise AssertionError(
                f"the {self.kind} reader did not start: {self._stderr.read_text(errors='replace')[-1500:]}"
            )
        return self._child

    def _line(self, timeout: float) -> str | None:
        """The child's next line, ``""`` when it ended, ``None`` when it said nothing within ``timeout``."""
        if not select.select([self._child.stdout], [], [], timeout)[0]:
            return None
        return self._child.stdout.readline().decode()


def _reader(kind: str):
    """What the child does with a path of ``kind``, and the refusal it accepts."""
    from mem_core.errors import MemError

    if kind == "events":
        from mem_core.events import sensor_problem, validate_events
        from mem_core.io import EventFileError, read_events

        def read(path: Path) -> None:
            events, sensor = read_events(path)
            validate_events(events, sensor)
            assert events.size == 0 or sensor_problem(sensor) is None, sensor

        return read, EventFileError
    if kind == "corpus":
        from mem_core.corpus import Corpus, CorpusError

        def read(path: Path) -> None:
            with Corpus(path) as corpus:
                for problem in corpus.check(full=True).values():
                    raise CorpusError(problem)
                for i in range(len(corpus)):
                    corpus.events(i)

        return read, MemError
    import torch

    from mem_core.inference import Predictor

    torch.set_num_threads(1)
    return (lambda path: Predictor(path).warm_up()), MemError  # what mem serve does: model, tokenizer, one window


def child(kind: str) -> None:
    """Read each path given on stdin (a JSON string a line), printing one JSON outcome a line."""
    read, refusal = _reader(kind)
    baseline = _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (baseline + BUDGET_BYTES, baseline + BUDGET_BYTES))
    print("ready", flush=True)
    for line in sys.stdin:
        path = json.loads(line)
        started = time.monotonic()
        try:
            read(Path(path))
            outcome, detail = "valid", ""
        except refusal as e:
            outcome, detail = ("refused" if path in str(e) else "unnamed"), str(e)[:300]
        except BaseException as e:  # the finding itself: any other exception, a MemoryError included
            outcome, detail = "bad", "".join(traceback.format_exception(e))[-1500:]
        seconds = time.monotonic() - started
        print(json.dumps({"outcome": outcome, "detail": detail, "seconds": seconds}), flush=True)


def _address_space() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


if __name__ == "__main__":
    child(sys.argv[1])
