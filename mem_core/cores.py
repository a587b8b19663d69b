"""The cores this process may run on, what its parallel work is shared out from: the loader workers of a training
process, the torch threads of a live Train run. ``os.cpu_count()`` counts the machine's cores, not those a container,
``taskset`` or a scheduler leaves the process, and more busy threads than cores slow every one of them down."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
