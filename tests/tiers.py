"""The two test tiers: ``uv run pytest -m "not slow"`` starts no process, server or training; ``uv run pytest`` runs
everything.

A test is ``slow`` when it is marked so by hand (it takes long for another reason, or starts a process through
product code) or when it uses one of ``SLOW_USES``: in its body, in a fixture it requests, in a function of the
tests it calls (helpers, classes, lambdas, functions it is parametrized with), read from the bytecode by qualified
name. Every test left in the quick tier runs with process starts refused: one that starts a process anyway (through
product code the scan does not read) fails, naming itself.
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import fcntl
import hashlib
import multiprocessing.process
import os
import platform
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

# What a quick test must not use, by qualified name (a module covers everything in it), and why.
SLOW_USES = {
    "subprocess": "starts a process",
    "multiprocessing": "starts a process",
    "concurrent.futures.process": "starts a process",
    "app.live.labelling.TrainingJob": "starts a training process",
    "app.live.server.LiveServer": "starts a live server",
    "app.live.server.serve_live": "starts a live server",
    "app.demo.run": "trains and serves",
    "recorders.record.run": "records in real time",
    "recorders.publish.EventPublisher": "publishes on a socket",
    "mem_core.train.stage.run_stage": "trains",
    "mem_core.train.tokenizer.run": "trains",
    "mem_core.train.pretrain.run": "trains",
    "mem_core.train.finetune.run": "trains",
    "mem_core.train.segment.run": "trains",
    "mem_core.train.experiment.run": "trains",
}

# Bytecode that reads a name, binds one, or reads an attribute of what is on top of the stack.
_GLOBALS = {"LOAD_GLOBAL", "LOAD_NAME"}
_LOCALS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLASSDEREF"}
_STORES = {"STORE_FAST", "STORE_DEREF", "STORE_NAME"}
_ATTRIBUTES = {"LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM"}


def _qualified(obj: object) -> str | None:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else None


def _slow_reason(name: str) -> str | None:
    for prefix, reason in SLOW_USES.items():
        if name == prefix or name.startswith(prefix + "."):
            return reason
    return None


def _folder(obj: object) -> Path | None:
    """The folder of the file that defines ``obj``."""
    file = getattr(sys.modules.get(getattr(obj, "__module__", None) or ""), "__file__", None)
    return Path(file).resolve().parent if file else None


class _Scan:
    """Why a test is slow (``None`` if it is not), remembered per function: tests share fixtures and helpers."""

    def __init__(self, folders: set[Path]) -> None:
        self._folders = folders  # where the tests are: functions defined there are read too
        self._seen: dict[object, str | None] = {}

    def function(self, func: object) -> str | None:
        func = getattr(func, "__func__", func)  # a bound method
        func = getattr(func, "__wrapped__", func)  # a decorated helper (contextmanager)
        code = getattr(func, "__code__", None)
        if code is None:
            return None
        if code not in self._seen:
            self._seen[code] = None  # recursion ends here
            self._seen[code] = self._code(code, getattr(func, "__globals__", {}))
        return self._seen[code]

    def cls(self, cls: type) -> str | None:
        for value in vars(cls).values():
            if (reason := self.function(value)) is not None:
                return reason
        return None

    def _code(self, code: types.CodeType, globals_: dict) -> str | None:
        current: tuple[str, object] | None = None  # the qualified name and object on top of the stack
        imported: tuple[str, object] | None = None  # the module of the last import statement
        local: dict[str, tuple[str, object]] = {}  # names bound to what was on top when they were stored
        for ins in dis.get_instructions(code):
            op, arg = ins.opname, ins.argval
            if op in _GLOBALS:
                obj = globals_.get(arg, getattr(builtins, arg, None))
                current = (_qualified(obj) or arg, obj) if obj is not None else None
            elif op in _LOCALS:
                current = local.get(arg)
            elif op in _STORES:
                if current is not None:
                    local[arg] = current
                current = None
            elif op == "IMPORT_NAME":
                current = imported = (arg, sys.modules.get(arg))
            elif op in _ATTRIBUTES and (base := imported if op == "IMPORT_FROM" else current) is not None:
                attribute = getattr(base[1], arg, None) if base[1] is not None else None
                current = (_qualified(attribute) or f"{base[0]}.{arg}", attribute)
            else:
                current = None
            if current is None:
                continue
            name, obj = current
            if (reason := _slow_reason(name)) is not None:
                return f"{name} {reason}"
            if obj is not None and _folder(obj) in self._folders:
                inner = self.cls(obj) if isinstance(obj, type) else self.function(obj)
                if inner is not None:
                    return f"{getattr(obj, '__qualname__', name)} -> {inner}"
        for const in code.co_consts:  # nested functions, lambdas and comprehensions
            if isinstance(const, types.CodeType) and (reason := self._code(const, globals_)):
                return reason
        return None

    def item(self, item: pytest.Function) -> str | None:
        if (reason := self.function(item.function)) is not None:
            return reason
        for name, definitions in item._fixtureinfo.name2fixturedefs.items():
            for definition in definitions:
                if (reason := self.function(definition.func)) is not None:
                    return f"fixture {name}: {reason}"
        for value in getattr(getattr(item, "callspec", None), "params", {}).values():
            if callable(value) and (reason := self.function(value)) is not None:
                return f"parameter: {reason}"
        return None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: for the whole suite a worker more than the cores this process may use (its long tests wait a good
    part of their time on the processes, servers and windows they start: a fresh clone on 2 cores, 447 s with 2
    workers, 381 s with 3); for the quick tier (``-m "not slow"``), which starts none, a worker per core (each worker
    spends about 15 s of CPU importing and collecting). ``--maxprocesses`` caps it."""
    cores = len(os.sched_getaffinity(0))
    return cores if "not slow" in (config.option.markexpr or "") else cores + 1


def _sources_digest(folders: set[Path]) -> str:
    """What the tier of every test follows from: the sources in ``folders`` and the Python reading them."""
    digest = hashlib.sha256(sys.version.encode())
    for folder in sorted(folders):
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


_CACHE_KEY = "mem/test-tiers"
PACKAGES = ("app", "mem_core", "recorders", "bench")  # what the tests call: the scan reads names defined there

# The order of the files is pytest-xdist's (``--dist loadfile``: whole files, the ones with most tests first), which
# leaves the long end-to-end files (few tests each) for last, mostly beside short ones. Measured on 2 cores against
# running the longest files first: long files side by side take 20-35 % more CPU each (torch's steps compete for the
# cores and caches), more than the idle tail costs (whole runs: 419 s in this order; 431, 444 and 500 s with the
# longest first). The label loop alone first (it streams a camera in real time): the workers ended within 21 s of each
# other, but its pretraining ran beside the others' first tests with cold kernel caches (41 s against 14): 421 s.


@pytest.hookimpl(tryfirst=True)  # before -m deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The scan reads the bytecode of every test and fixture (about 5 s a process); its verdicts are kept in pytest's
    # cache for sources that did not change since (every file under tests/ and the packages, digested). One process
    # scans at a time: the workers of a run wait for the first one's verdicts instead of each reading the same bytecode
    tests = {Path(item.path).resolve().parent for item in items}
    cache = getattr(config, "cache", None)
    digest = _sources_digest(tests | {config.rootpath / name for name in PACKAGES})
    with _one_scan_at_a_time(cache):
        kept = cache.get(_CACHE_KEY, {}) if cache is not None else {}
        fresh = isinstance(kept, dict) and kept.get("digest") == digest and isinstance(kept.get("reasons"), dict)
        known: dict[str, str | None] = kept["reasons"] if fresh else {}
        scan = _Scan(tests)
        reasons = dict(known)  # a run of some files keeps the verdicts on the others
        for item in items:
            if not isinstance(item, pytest.Function) or item.get_closest_marker("slow") is not None:
                continue
            reason = known[item.nodeid] if item.nodeid in known else scan.item(item)
            reasons[item.nodeid] = reason
            if reason is not None:
                item.add_marker(pytest.mark.slow(reason=reason))
        if cache is not None and reasons != known:
            cache.set(_CACHE_KEY, {"digest": digest, "reasons": reasons})


@contextlib.contextmanager
def _one_scan_at_a_time(cache) -> Iterator[None]:
    """Hold a lock in pytest's cache folder (none without a cache: ``-p no:cacheprovider``)."""
    if cache is None:
        yield
        return
    with open(cache.mkdir("mem-test-tiers") / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ------------------------------------------------------------------------------------------ the quick tier's guard

_running: list[tuple[str, bool]] = []  # (node id, in the quick tier) of the test running now (nested: pytester)
_started: dict[str, list[str]] = {}  # node id -> the process starts it was refused
_STARTS = [(subprocess.Popen, "__init__"), (multiprocessing.process.BaseProcess, "start"), (os, "fork")]
_saved = pytest.StashKey[list]()
_HINT = "mark it @pytest.mark.slow, or add what started it to SLOW_USES in tests/tiers.py"


class ProcessInQuickTest(RuntimeError):
    """A test of the quick tier started a process."""


def _refusing(what: str, start):
    def guarded(*args, **kwargs):
        if _running and _running[-1][1]:
            test = _running[-1][0]
            _started.setdefault(test, []).append(what)
            raise ProcessInQuickTest(f"{test} is in the quick tier and started a process ({what}): {_HINT}")
        return start(*args, **kwargs)

    return guarded


def pytest_configure(config: pytest.Config) -> None:
    # platform.processor() runs `uname -p` the first time it is asked (h5py asks on import) and keeps the answer:
    # asked here, before the guard, no quick test starts that process
    platform.processor()
    config.stash[_saved] = [(owner, name, getattr(owner, name)) for owner, name in _STARTS]
    for owner, name, start in config.stash[_saved]:
        setattr(owner, name, _refusing(f"{getattr(owner, '__name__', owner)}.{name}", start))


def pytest_unconfigure(config: pytest.Config) -> None:
    for owner, name, start in config.stash.get(_saved, []):
        setattr(owner, name, start)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _running.append((item.nodeid, item.get_closest_marker("slow") is None))
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    started = _started.pop(item.nodeid, None)
    if started and report.passed:  # the code under test caught the refusal
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} is in the quick tier and started a process ({', '.join(started)}): {_HINT}"
    return report
