"""``mem record``: stream a live source into a corpus, continuously, until told to stop.

Durability comes from the corpus writer: it commits at least every ``flush_interval_s`` while events arrive, and
this loop commits on quiet heartbeats too, so a SIGKILL loses at most the last second. A recording stops cleanly
on Ctrl-C / SIGTERM (a second Ctrl-C forces it), after ``duration_s`` of the source's time, when the source ends,
when the corpus disk
gets below ``min_free_bytes`` free, or when the source fails for good; everything committed stays readable. The
session is one recording cut into segments (every ``segment_minutes``, and whenever a shard is full). When the
source's stream starts over (a restarted publisher's clock goes back, or its sensor changes) the recording goes on
as a new session, said in one line on stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.text import Text

from mem_core.corpus import Corpus, CorpusFullError, CorpusWriter, prepare_corpus_dir
from mem_core.events import SensorSize
from recorders.base import LiveSource, RecorderError
from recorders.config import RecordConfig
from recorders.corpus_replay import CorpusReplaySource
from recorders.publish import EventPublisher
from recorders.sources import open_source


@dataclass(frozen=True)
class RecordResult:
    """How a recording went: ``events`` delivered by the source, ``stored`` committed to the corpus."""

    out: Path
    name: str  # the first session; ``sessions`` has them all
    events: int
    stored: int
    seconds: float
    stop_reason: str  # duration | interrupted | stopped | source ended | disk full | source failed
    segments: int
    reconnects: int
    published: int
    publish_dropped: int
    error: str | None = None
    behind_s: float = 0.0  # how far the source's event time had fallen behind the wall clock at the end
    source_s: float = 0.0  # the source's time recorded (its events' clock; ``seconds`` is the wall clock's)
    sessions: tuple[str, ...] = ()  # one, and one more each time the source's stream started over

    @property
    def lag_warning(self) -> str | None:
        """A warning when the source could not keep up (a slow machine, a cold compile cache, a saturated link)."""
        if self.behind_s <= max(0.5, 0.1 * self.seconds):
            return None
        return (
            f"the source fell {self.behind_s:.1f} s behind real time in {self.seconds:.1f} s of recording: events "
            "were produced slower than they happened (is the machine busy?)"
        )

    @property
    def ok(self) -> bool:
        return self.error is None


def _corpus_bytes(root: Path) -> int:
    """Bytes of the corpus's shards and manifest (not the writer's hidden lock and ballast files)."""
    return sum(e.stat().st_size for e in os.scandir(root) if e.is_file() and not e.name.startswith("."))


PLAIN_EVERY_S = 5.0  # a progress line this often when stderr is no terminal (a log file, a pipe)


class _Status:
    """Progress on stderr while recording: the source's time recorded (of ``--duration``), events, events/s,
    corpus size and the reconnection state. On a terminal one transient line redrawn four times a second; elsewhere
    a plain line every ``PLAIN_EVERY_S``, so a log or a pipe shows the recording going too."""

    def __init__(self, enabled: bool, out: Path, name: str, duration_s: float | None) -> None:
        self._console = Console(stderr=True, highlight=False)
        terminal = self._console.is_terminal
        self._live = Live(console=self._console, transient=True, auto_refresh=False) if enabled and terminal else None
        self._plain = enabled and not terminal
        self._out, self.name, self._duration_s = out, name, duration_s
        self._last = (time.monotonic(), 0)
        self._size, self._size_time = 0, 0.0

    def __enter__(self) -> _Status:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._live is not None:
            self._live.stop()

    def update(self, total: int, source_s: float, source: LiveSource) -> None:
        now = time.monotonic()
        if not (self._live or self._plain) or now - self._last[0] < (0.25 if self._live else PLAIN_EVERY_S):
            return
        rate = (total - self._last[1]) / (now - self._last[0])
        self._last = (now, total)
        if now - self._size_time >= 1.0:
            self._size, self._size_time = _corpus_bytes(self._out), now
        of = "" if self._duration_s is None else f" of {self._duration_s:g}"
        progress = f"{source_s:.1f}{of} s  {total:,} events  {rate / 1e6:.2f} Mev/s  {self._size / 1e6:,.1f} MB"
        waiting = getattr(source, "connected", True) is False
        if self._plain:
            line = f"recording {self.name}: {progress}{'  waiting for the camera to come back' if waiting else ''}"
            self._console.print(line, soft_wrap=True)
            return
        line = Text.assemble(("● REC ", "bold red"), f"{self.name}  {progress}")
        if waiting:
            line.append("  waiting for the camera to come back…", style="yellow")
        self._live.update(line, refresh=True)

    def say(self, line: str) -> None:
        """One line on stderr (above the live line on a terminal), progress shown or not."""
        self._console.print(line, soft_wrap=True, highlight=False, markup=False)


class _Signals:
    """SIGINT/SIGTERM set ``stop`` (a second SIGINT raises KeyboardInterrupt); only in the main thread."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop, self.reason = stop, None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.reason = f"interrupted ({signal.Signals(signum).name})"
        self.stop.set()

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _taken_sessions(out: Path) -> set[str]:
    """The session names taken in the corpus at ``out`` (none when there is no corpus yet)."""
    return {r.session for r in Corpus(out).recordings} if (out / "manifest.json").exists() else set()


def _free_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first not in ``taken``."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}-{k}"
    return name


class _Sessions:
    """The sessions of one ``mem record``: the first, then one more each time the source's stream starts over, its
    clock going back (a restarted publisher counts from its own start again) or its sensor changing. Each begins at
    its first events."""

    def __init__(self, writer: CorpusWriter, source: LiveSource, config: RecordConfig, name: str, started: str) -> None:
        self.writer, self.source, self.config, self.started = writer, source, config, started
        self.first = name
        self.names: list[str] = []
        self._taken = _taken_sessions(config.out) | {name}
        self._sensor: SensorSize | None = None

    def begin(self) -> None:
        name = self.first if not self.names else _free_name(self.first, self._taken)
        metadata = {**self.source.metadata, "start_utc": self.started, "source": self.config.source}
        self.writer.begin_recording(name, self.source.sensor, metadata=metadata)
        self.names.append(name)
        self._taken.add(name)
        self._sensor = SensorSize(*self.source.sensor)

    def start_over(self, batch: np.ndarray) -> str | None:
        """Why ``batch`` cannot continue the open session (in words), or None when it can."""
        if not self.names:
            return None
        sensor = SensorSize(*self.source.sensor)
        if sensor != self._sensor:
            return (
                f"its sensor changed from {self._sensor.width}x{self._sensor.height} to {sensor.width}x{sensor.height}"
            )
        t_last = self.writer.last_time
        if t_last is not None and int(batch["t"][0]) < t_last:
            return f"its clock went back from t={t_last} to t={int(batch['t'][0])} us"
        return None

    def next(self, why: str) -> str:
        """End the open session and begin the next; the line that says so."""
        self.writer.end_recording()
        self.started = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.begin()
        return f"{self.config.source} started over ({why}): recording goes on as session {self.names[-1]}"


def _check_corpus_source(source: CorpusReplaySource, out: Path) -> None:
    """Refuse a corpus replay that cannot be recorded: into the corpus itself, or over several sensor sizes (a
    recording has one sensor)."""
    if source.root.resolve() == out.resolve():
        raise RecorderError(f"{out}: cannot record a corpus into itself (--out names the replayed corpus)")
    if len(source.sensors) > 1:
        sizes = ", ".join(f"{s.width}x{s.height}" for s in sorted(source.sensors))
        raise RecorderError(
            f"{source.root}: its recordings lie on {len(source.sensors)} sensor sizes ({sizes}) and a recording has "
            "one: record one recording (CORPUS:RECORDING)"
        )


def run(config: RecordConfig, *, source: LiveSource | None = None, stop: threading.Event | None = None) -> RecordResult:
    """Record ``config.source`` (or the given ``source``) into ``config.out`` until a stop condition; never raises
    for a full disk or a failed source (see ``RecordResult.stop_reason`` / ``error``)."""
    stop = stop if stop is not None else threading.Event()
    prepare_corpus_dir(config.out)  # an existing file or a path too long is one line, before a source opens
    if config.name is not None and config.name in _taken_sessions(config.out):
        raise RecorderError(f"{config.out}: already holds a session named {config.name!r}; choose another --name")
    if source is None:
        source = open_source(config.source, speed=config.speed, loop=config.loop)
    with contextlib.ExitStack() as stack:
        stack.enter_context(source)
        if isinstance(source, CorpusReplaySource):
            _check_corpus_source(source, config.out)
        publisher = stack.enter_context(EventPublisher(config.publish)) if config.publish else None
        started = datetime.now(UTC)
        base = f"{source.metadata.get('kind', 'rec')}-{started:%Y%m%d-%H%M%S}"
        name = config.name or _free_name(base, _taken_sessions(config.out))
        writer = stack.enter_context(
            CorpusWriter(
                config.out,
                provenance={"tool": "mem record", "source": config.source},
                flush_interval_s=config.flush_interval_s,
                shard_max_events=config.shard_max_events,
                min_free_bytes=config.min_free_bytes,
            )
        )
        sessions = _Sessions(writer, source, config, name, started.isoformat(timespec="milliseconds"))
        if source.sensor is not None:  # (a tcp:// source knows its sensor from its first batch: recorded from there)
            sessions.begin()
        clock = _Clock(config.speed)
        with _Signals(stop) as signals, _Status(config.status, config.out, name, config.duration_s) as status:
            total, reason, error = _record_loop(config, source, writer, publisher, stop, status, clock, sessions)
        if reason == "stopped" and signals.reason:
            reason = signals.reason
    corpus = Corpus(config.out)
    recorded = [r for r in corpus.recordings if r.session in sessions.names]
    return RecordResult(
        out=config.out,
        name=name,
        events=total,
        stored=sum(r.n_events for r in recorded),
        seconds=clock.seconds(),
        stop_reason=reason,
        segments=len(recorded),
        reconnects=getattr(source, "reconnects", 0),
        published=publisher.sent if publisher else 0,
        publish_dropped=publisher.dropped if publisher else 0,
        error=error,
        behind_s=clock.behind_s,
        source_s=min(clock.event_s, config.duration_s or np.inf),
        sessions=tuple(sessions.names) or (name,),
    )


class _Clock:
    """Recording time, which starts when the source first delivers events (not while a camera opens or a compiler
    warms up), and how far the source's event time lags the wall clock (at ``speed`` x real time; 0 = unpaced)."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.start: float | None = None  # wall time of the first events
        self._t_first: int | None = None  # the first event's time since the source's clock last started over
        self._resumed = 0.0  # wall time of that event
        self._before_s = 0.0  # the source's time recorded before its clock last started over
        self.event_s = 0.0  # the source's time recorded: from the first event to the newest
        self.behind_s = 0.0

    def events(self, batch, now: float) -> None:
        if self.start is None:
            self.start = now
        if self._t_first is None:
            self._t_first, self._resumed = int(batch["t"][0]), now
        self.event_s = self._before_s + (int(batch["t"][-1]) - self._t_first) / 1e6
        if self.speed > 0:
            self.behind_s = max(0.0, now - self._resumed - (self.event_s - self._before_s) / self.speed)

    def start_over(self) -> None:
        """The source's clock started over: the time recorded so far counts, and the next events count on from it."""
        self._before_s, self._t_first = self.event_s, None

    def seconds(self, now: float | None = None) -> float:
        return 0.0 if self.start is None else (now if now is not None else time.monotonic()) - self.start

    def within(self, batch: np.ndarray, duration_s: float) -> np.ndarray:
        """The events of ``batch`` less than ``duration_s`` after the first event recorded."""
        return batch[: np.searchsorted(batch["t"], self._t_first + round((duration_s - self._before_s) * 1e6))]

    def recorded(self, duration_s: float, now: float, quiet: bool) -> bool:
        """Whether ``duration_s`` of the source's time is recorded: its events' own clock, so ``speed`` 0 records that
        much of a file or the simulation however fast it goes. A paced source that is ``quiet`` (a heartbeat: nothing
        waiting) also stops once the wall clock has run ``duration_s / speed``: a camera whose scene went still sends
        no events to count. Only when quiet, because while the recorder was busy (the first write loads a numba kernel,
        for seconds on a busy machine) a camera or a DV stream kept its events waiting, and they belong to the recording."""
        if self.event_s >= duration_s:
            return True
        return quiet and self.speed > 0 and self.seconds(now) >= duration_s / self.speed


def _record_loop(
    config: RecordConfig,
    source: LiveSource,
    writer: CorpusWriter,
    publisher: EventPublisher | None,
    stop: threading.Event,
    status: _Status,
    clock: _Clock,
    sessions: _Sessions,
) -> tuple[int, str, str | None]:
    """Append batches until a stop condition: (events delivered, stop reason, error message or None).
    ``duration_s`` (the source's time) and segments count from the first events; a session not begun yet (a source
    that did not know its sensor) begins at the first events, and the next one when the stream starts over."""
    segment_s = None if config.segment_minutes is None else config.segment_minutes * 60
    segment_start = last_flush = time.monotonic()
    total = flushed = 0
    try:
        for batch in source:
            now = time.monotonic()
            quiet = not batch.size
            if batch.size:
                if clock.start is None:
                    segment_start = now
                if why := sessions.start_over(batch):
                    status.say(sessions.next(why))
                    status.name = sessions.names[-1]
                    clock.start_over()
                    segment_start = now
                clock.events(batch, now)
                if config.duration_s is not None:
                    batch = clock.within(batch, config.duration_s)
            if batch.size:
                if not sessions.names:  # the first events of a source that did not know its sensor
                    sessions.begin()
                writer.append(batch)  # commits by itself at least every flush_interval_s
                total += batch.size
                if publisher is not None:
                    publisher.publish(batch, source.sensor)
            elif total > flushed and now - last_flush >= config.flush_interval_s:
                writer.flush()  # a quiet source: nothing calls append, so commit here
                flushed, last_flush = total, now
            if stop.is_set():
                return total, "stopped", None
            if config.duration_s is not None and clock.recorded(config.duration_s, now, quiet):
                return total, "duration", None
            if segment_s is not None and now - segment_start >= segment_s:
                writer.rotate()
                segment_start = now
            status.update(total, clock.event_s, source)
    except CorpusFullError as e:
        return total, "disk full", str(e)
    except RecorderError as e:
        return total, "source failed", str(e)
    return total, "stopped" if stop.is_set() else "source ended", None
