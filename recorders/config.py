"""What ``mem record`` and ``mem ingest`` do, as dataclasses (light to import: the CLI shows their defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mem_core.configuration import ConfigError, Interval, check_ranges

POSITIVE, AT_LEAST_0 = Interval(0, lo_open=True), Interval(0)

SPECS = (  # recorders.sources
    "camera[:SERIAL], sim, sim:fast, synthetic[:MEV_S], tcp://HOST:PORT, dv+tcp://HOST:PORT, "
    "a corpus directory (CORPUS[:RECORDING]) or an event file"
)


@dataclass(frozen=True)
class RecordConfig:
    """What ``mem record`` does; ``source`` is any ``recorders.sources.open_source`` string (``SPECS``)."""

    source: str
    out: Path
    name: str | None = None  # session name; default "<kind>-<UTC start time>"
    duration_s: float | None = None
    segment_minutes: float | None = None
    publish: str | None = None  # ZMQ endpoint (or PORT) to publish the events on
    speed: float = 1.0  # file replay and simulator pacing; 0 = as fast as possible
    loop: bool = False  # file replay starts over at the end
    flush_interval_s: float = 1.0
    min_free_bytes: int = 256 << 20
    shard_max_events: int = 1 << 26
    status: bool = True  # live status line on stderr (only when it is a terminal)

    def __post_init__(self) -> None:
        ranges = {"duration_s": POSITIVE, "segment_minutes": POSITIVE, "speed": AT_LEAST_0}
        check_ranges(self, {**ranges, "flush_interval_s": AT_LEAST_0, "min_free_bytes": AT_LEAST_0})
        check_ranges(self, {"shard_max_events": Interval(1)})
        if self.name is not None and (not self.name or "/" in self.name):  # "/" separates a session's segments
            raise ConfigError(f"name must be a non-empty session name without '/', got {self.name!r}")
        if self.publish is not None:
            from recorders.base import RecorderError
            from recorders.publish import normalize_address  # ZMQ: imported only when publishing

            try:
                normalize_address(self.publish)
            except RecorderError as e:
                raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class IngestConfig:
    """What ``mem ingest`` does: ``paths`` (files or folders, recursive) into the corpus ``out``."""

    paths: tuple[Path, ...]
    out: Path
    dataset: str | None = None  # walk this dataset's layout under each path and keep its labels
    workers: int = 1  # reader processes; 1 reads in this process
    progress: bool = True  # progress bar on stderr (only when it is a terminal)
    min_free_bytes: int = 256 << 20
    flush_interval_s: float = 1.0  # commit (shard + manifest) at least this often
    follow_links: bool = False  # read HDF5 data a file keeps elsewhere (``mem_core.io.read_events``)

    def __post_init__(self) -> None:
        check_ranges(self, {"workers": Interval(1), "flush_interval_s": AT_LEAST_0, "min_free_bytes": AT_LEAST_0})
