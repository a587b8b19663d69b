"""Shared test fixtures (the real-data location, a synthetic event helper) and the test tiers (``tiers.py``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiers import (  # noqa: F401 (hooks: pytest reads them from this module)
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_unconfigure,
    pytest_xdist_auto_num_workers,
)

from mem_core import shared_data_dir
from mem_core.events import SensorSize, make_events

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# The tests' models are tiny: a second thread gains nothing, and beside another busy process torch's threads wait for
# each other (a step of test_models' dVAE: 0.7 s on one thread, 20 s on two). Under pytest-xdist (the suite's
# default: a worker per core) the processes the tests start take one thread too, as a user's would with
# OMP_NUM_THREADS=1; run alone (-n 0) they keep torch's default.
torch.set_num_threads(1)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data`` (or ``$MEM_DATA``). Missing data fails under CI and skips elsewhere."""
    path = shared_data_dir()
    if not path.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real event data not found at {path} (set MEM_DATA)")
        pytest.skip(f"real event data not found at {path}")
    return path


SMALL_SENSOR = SensorSize(32, 48)


def synthetic_events(n: int, sensor: SensorSize = SMALL_SENSOR, seed: int = 0, t0: int = 0) -> np.ndarray:
    """``n`` sorted random events on ``sensor`` (the one synthetic-event helper of the suite)."""
    rng = np.random.default_rng(seed)
    t = t0 + np.sort(rng.integers(0, 100 * max(n, 1), n))
    return make_events(t, rng.integers(0, sensor.width, n), rng.integers(0, sensor.height, n), rng.integers(0, 2, n))


@pytest.fixture
def events_factory():
    return synthetic_events


@pytest.fixture
def small_disk(monkeypatch):
    """``small_disk(folder, size)``: from now on the disk seems to hold ``size`` bytes, minus what ``folder`` holds."""
    real = shutil.disk_usage

    def limit(folder: Path, size: int) -> None:
        def usage(path):
            used = sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0
            return real(path)._replace(free=size - used)

        monkeypatch.setattr(shutil, "disk_usage", usage)

    return limit
