"""What ``mem record`` and ``mem ingest`` do, as dataclasses: each field with a ``Help`` is a command option, its
type, default, bounds and help declared here once (light to import: the CLI shows their defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from mem_core.errors import ConfigError
from mem_core.fields import AT_LEAST_0, AT_LEAST_1, POSITIVE, Help, Speed, check_fields
from mem_core.limits import MIN_FREE_BYTES

SPECS = (  # recorders.sources
    "camera[:SERIAL], sim, sim:fast, synthetic[:MEV_S], tcp://HOST:PORT, dv+tcp://HOST:PORT, "
    "a corpus directory (CORPUS[:RECORDING]) or an event file"
)
SIM_SOURCES = "sim: the sim dataset's 128 x 128 camera; sim:fast: a 640 x 480 load test (about 100 Mev/s)."
SOURCE_HELP = f"{SPECS} (a file or corpus is replayed once, over and over with --loop). {SIM_SOURCES}"
LOOP_HELP = "Replay a file or corpus over and over instead of once."  # mem record and mem serve alike
MIN_FREE_HELP = "Stop before the disk has less than this free."
CORPUS_HELP = "Corpus directory (created, or appended to)."


@dataclass(frozen=True)
class RecordConfig:
    """What ``mem record`` does; ``source`` is any ``recorders.sources.open_source`` string (``SPECS``)."""

    source: Annotated[str, Help(SOURCE_HELP)]
    out: Annotated[Path, Help(CORPUS_HELP)]
    name: Annotated[str | None, Help("Session name (default: <kind>-<UTC time>).")] = None
    duration_s: Annotated[
        float | None,
        POSITIVE,
        Help(
            "Stop after this many seconds of the source's time (its events' clock): with --speed 0 a file or the "
            "simulator records that much of its time however fast it runs; a camera's time is the wall clock's.",
            flag="--duration",
        ),
    ] = None
    segment_minutes: Annotated[float | None, POSITIVE, Help("Start a new segment (shard) every M minutes.")] = None
    publish: Annotated[str | None, Help("Also publish the events over ZMQ: tcp://127.0.0.1:PORT or PORT.")] = (
        None  # ZMQ endpoint (or PORT)
    )
    speed: Annotated[Speed, Help("File replay / simulator speed: 1 = real time, 0 = as fast as possible.")] = 1.0
    loop: Annotated[bool, Help(LOOP_HELP, flag="--loop/--no-loop")] = False
    flush_interval_s: Annotated[float, AT_LEAST_0] = 1.0
    min_free_bytes: Annotated[int, AT_LEAST_0, Help(MIN_FREE_HELP)] = MIN_FREE_BYTES
    shard_max_events: Annotated[int, AT_LEAST_1] = 1 << 26
    status: bool = True  # progress on stderr: a live line on a terminal, a plain line every 5 s elsewhere

    def __post_init__(self) -> None:
        check_fields(self)
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

    paths: Annotated[
        tuple[Path, ...],
        Help("Event files, folders (searched recursively) or corpora (each recording kept with its label)."),
    ]
    out: Annotated[Path, Help(CORPUS_HELP)]
    dataset: Annotated[str | None, Help("Read PATHS as this dataset's layout and keep labels: ncars, nmnist, ...")] = (
        None
    )
    workers: Annotated[
        int, AT_LEAST_0, Help("Reader processes (0 = read in this process, as evaluate's --workers).")
    ] = 0
    progress: bool = True  # progress bar on stderr (only when it is a terminal)
    min_free_bytes: Annotated[int, AT_LEAST_0, Help(MIN_FREE_HELP)] = MIN_FREE_BYTES
    flush_interval_s: Annotated[float, AT_LEAST_0] = 1.0  # commit (shard + manifest) at least this often
    follow_links: Annotated[
        bool,
        Help(
            "Also read HDF5 data a file keeps elsewhere (soft and external links, external storage, virtual "
            "datasets), refused by default: such a file can name any file on the machine."
        ),
    ] = False

    def __post_init__(self) -> None:
        check_fields(self)
