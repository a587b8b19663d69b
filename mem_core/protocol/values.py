"""The value types of header fields shared by the topics: numbers within bounds, lists of a fixed length,
endpoints. A value that also crosses another boundary (a speed, a window, epochs) has its type in
``mem_core.fields``; class names are ``mem_core.schema``'s."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictInt

from mem_core.fields import Range
from mem_core.limits import MAX_IMAGE_SIDE, MAX_IPC_PATH, MAX_SENSOR_SIDE
from mem_core.schema import Text


def between(lo: float, hi: float) -> Any:
    """A finite number in [lo, hi] (``fields.Range``, as the configs bound theirs)."""
    return Annotated[float, Range(lo, hi)]


def ints(lo: int, hi: int) -> Any:
    """An integer (not a bool, not a float) in [lo, hi]."""
    return Annotated[StrictInt, Range(lo, hi)]


def sized(item: Any, n: int) -> Any:
    """A JSON list of exactly ``n`` values of ``item``."""
    return Annotated[list[item], Field(min_length=n, max_length=n)]


Side = ints(0, MAX_SENSOR_SIDE)
ImageSide = ints(1, MAX_IMAGE_SIDE)


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is not one a client can connect to (``tcp://HOST:PORT`` or ``ipc://PATH``), or None."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        return None if 0 < len(path) <= MAX_IPC_PATH and "\x00" not in path else "expected ipc://PATH (1-107 bytes)"
    match = re.fullmatch(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}):(\d{1,5})", endpoint)
    if match is None:
        return "expected tcp://HOST:PORT or ipc://PATH"
    if not 1 <= int(match[2]) <= 65535:
        return f"port {match[2]} is outside 1..65535"
    return None


def _endpoint(value: str) -> str:
    problem = endpoint_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Endpoint = Annotated[Text, AfterValidator(_endpoint)]
