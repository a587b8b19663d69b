"""The device a command runs on, as the user names it (``--device``, a config's ``device``): ``auto``, ``cpu``,
``cuda`` or ``cuda:N``. A name that is none of them, or a GPU this machine does not have, is a ``ConfigError`` in one
line, never torch's traceback.

``device_problem`` reads the name alone (no torch: ``mem serve`` on a board checks its options without it);
``pick_device`` also asks torch what the machine has.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mem_core.errors import ConfigError

if TYPE_CHECKING:
    import torch

_NAME = re.compile(r"(auto|cpu|cuda)(:\d{1,3})?")


def device_problem(name: object) -> str | None:
    """Why ``name`` names no device, or None: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or (match[2] and match[1] != "cuda"):
        return f"device {name!r} is none of auto, cpu, cuda, cuda:N"
    return None


def pick_device(name: str = "auto") -> torch.device:
    """The torch device ``name`` names on this machine (``auto``: the first GPU where there is one, else the CPU)."""
    import torch

    if (problem := device_problem(name)) is not None:
        raise ConfigError(problem)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device {name!r}: this machine has no CUDA GPU that torch can use (try cpu)")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device {name!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    return device
