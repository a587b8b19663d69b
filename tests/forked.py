"""``mem ARGS`` in a process of its own without paying torch's and timm's import (about 5 s of CPU a process).

A refusal is tested where a command must not hang or must end with one line and exit status 2: that needs a process
of its own (a FIFO opened by a loader blocks holding the GIL; the exit status is the process's), not a fresh
interpreter. ``mem_forked`` forks the command from a server process that imported the ``mem`` command line once
(``multiprocessing``'s forkserver, one per pytest worker); each command still runs alone, from ``main()`` with its
argv, its stdout and stderr in files. Every command keeps one test that starts it as a user does
(``python -m app.cli``, in test_cli_stages, test_export, test_ingest, ...).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PRELOAD = ["app.cli", "torch", "timm", "mem_core.train.evaluate", "mem_core.train.finetune", "mem_core.runs.export"]
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def _command(argv: list[str], out: str, err: str, cwd: str | None, env: dict[str, str] | None) -> None:
    """The child: ``mem ARGV`` with stdout and stderr written to ``out`` and ``err`` (its exit status: SystemExit's)."""
    for fd, name in ((1, out), (2, err)):
        file = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    from app.cli import main

    sys.argv = ["mem", *argv]
    main()


def mem_forked(
    *args: str, timeout: float = 120, cwd: str | Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``mem ARGS`` in a forked process: its exit status, stdout and stderr; the test fails when it does not end
    within ``timeout`` s (a hang), and the process is killed."""
    with tempfile.TemporaryDirectory(prefix="mem-forked-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        process = _context.Process(
            target=_command, args=(list(args), out, err, None if cwd is None else str(cwd), env)
        )  # not a daemon: a command may start processes of its own (loader workers)
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            pytest.fail(f"mem {' '.join(a[:60] for a in args)} did not end within {timeout:g} s")
        return subprocess.CompletedProcess(
            ["mem", *args], process.exitcode, Path(out).read_text(), Path(err).read_text()
        )
