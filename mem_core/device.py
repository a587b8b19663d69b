"""The device a command runs on, as the user names it (``--device``, a config's ``device``): ``auto``, ``cpu``,
``cuda`` or ``cuda:N``. A name that is none of them, or a GPU this machine does not have, is a ``ConfigError`` in one
line, never torch's traceback.

``mem_core.fields.device_problem`` reads the name alone (no torch: ``mem serve`` on a board and the viewer's config
check it without); ``pick_device`` also asks torch what the machine has.
"""

from __future__ import annotations

import torch

from mem_core.errors import ConfigError
from mem_core.fields import device_problem


def pick_device(name: str = "auto") -> torch.device:
    """The torch device ``name`` names on this machine (``auto``: the first GPU where there is one, else the CPU)."""
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
