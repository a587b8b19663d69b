"""``mem serve``: run a model on the newest events of a live source and publish the results over ZMQ.

The server is a short inference loop (the thread calling ``run``) with its parts beside it, each in its own thread:

- ``reader.SourceReader`` pulls batches from the source into the ring of the newest events
  (``accumulation.Accumulation``), stamping each with its arrival time, and into a recording while one runs; between
  batches it carries out the ``replay_control.ReplayController``'s commands (play, pause, speed, seek, step);
- ``model_slot.ModelSlot`` imports torch and loads the model. The source streams from the start: until the model is
  ready the server publishes the sensor view of every window and ``stats`` saying ``model_state: "loading"``. With
  ``--watch`` it loads a newer export of the model when one appears; a Train run (labelling) loads the model it
  exported the same way. The new model takes over between two windows: the stream, the sockets and the viewers'
  connections stay; ``model.version`` counts the models served;
- ``control.ControlHandler`` answers JSON requests on a REP socket (replay, window, recording, labelling, state).

What each window publishes is ``publishing.WindowPublisher``'s, the state that ``stats`` and replies carry
``state.ServerState``'s.

The loop takes the newest window whenever new events arrived, publishes its ``sensor`` view and, once the model is
loaded, runs the ``Predictor`` and publishes ``hist``, ``tokens``, ``pred``; windows that came and went while it was
busy are counted as skipped, never queued (``stats.LoopStats``); ``stats`` go out every ``stats_interval_s``.

Without a model the server streams the sensor view only (``model_state: "none"``): a viewer can label windows
(``capture``), and ``train`` finetunes the pretraining run on them (``app.live.labelling``). Started again without
``--model``, it serves the newest Train run on its labels.

The window is the newest ``events`` events, none older than ``ms`` before the newest (``app.live.accumulation``).
The wire format is in ``mem_core.protocol`` and docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from app.config import ServeConfig
from app.live.accumulation import Accumulation, Window, describe_window, newest_span
from app.live.control import Command, ControlError, ControlHandler
from app.live.labelling import HeldWindow, LabelDesk, latest_export, pretraining_run_problem
from app.live.model_slot import ModelSlot
from app.live.publishing import WindowPublisher
from app.live.reader import SourceReader
from app.live.replay_control import REPLAY_COMMANDS, Pausable, ReplayController
from app.live.ring import EventRing
from app.live.sensor_view import sensor_view
from app.live.sockets import Publisher, bind, control_endpoint_for
from app.live.state import ServerState
from app.live.stats import LoopStats
from mem_core.configuration import ConfigError
from mem_core.errors import RunError
from mem_core.runs.lineage import pretraining_run_of
from recorders.base import LiveSource
from recorders.live_recorder import LiveRecorder
from recorders.sources import open_source

if TYPE_CHECKING:  # torch is imported by the loader thread, not at start
    from mem_core.inference import Predictor

RECORDABLE_KINDS = ("camera", "sim")
PREVIEW_INTERVAL_S = 0.2  # sensor views while the model loads: 5 a second leave the CPU to the loading
NO_MODEL_INTERVAL_S = 1 / 30  # sensor views a second without a model


class LiveServer:
    """The live inference server. ``run()`` blocks; ``start()`` runs it in a thread, ``stop()`` ends it.

    Args:
        config: see ``ServeConfig``.
        source: a ``LiveSource`` to use instead of opening ``config.source``.
        predictor: a ``Predictor`` to use instead of loading ``config.model``.
        context: the ZMQ context (default: the process-wide instance).
        torch_threads: torch CPU threads to set when the model is loaded (``mem serve --threads``); None leaves
            the process's setting alone (tests and benchmarks that share their process).
        announce: told when a model is ready (``mem serve`` prints it).
    """

    def __init__(
        self,
        config: ServeConfig,
        *,
        source: LiveSource | None = None,
        predictor: Predictor | None = None,
        context: zmq.Context | None = None,
        torch_threads: int | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        if config.pretrain is not None and (problem := pretraining_run_problem(Path(config.pretrain))) is not None:
            raise ConfigError(f"pretrain {config.pretrain}: {problem}")  # at the start, not at the first Train
        resumed = None
        if config.model is None and predictor is None:  # a restart goes on with the model its labels trained
            resumed = latest_export(Path(config.train_out), Path(config.labels))
            config = replace(config, model=resumed)
        self.config = config
        self.announce = announce
        self._stop = threading.Event()
        self._wake = threading.Event()  # new events, a new model, a window to infer again, or the source's end
        self._refresh = False  # infer the held window again (the model came, the window changed)
        self._error: BaseException | None = None
        self._runner: threading.Thread | None = None
        self.model = ModelSlot(
            config,
            prepare=self._model_coming,
            wake=self._wake,
            predictor=predictor,
            torch_threads=torch_threads,
            announce=announce,
            stopping=self._stop,
        )
        self.labelling = LabelDesk(
            config.labels, config.train_out, config.train_epochs, config.classes, config.min_free_bytes
        )
        self.labelling.resumed = resumed
        self.accumulation = Accumulation(config)
        self.source = source or open_source(config.source, speed=config.speed, loop=config.loop)
        self.replay = (
            ReplayController(self.source, self.ring.clear, lambda: self.window)
            if isinstance(self.source, Pausable)
            else None
        )
        kind = self.source.metadata.get("kind")
        self.recorder = LiveRecorder(config.record_dir, config.min_free_bytes) if kind in RECORDABLE_KINDS else None
        self.reader = SourceReader(self.source, self.ring, self._wake, recorder=self.recorder, replay=self.replay)
        self.counts = LoopStats()
        self.control = ControlHandler(self._commands(), lambda: self.state.control_state())
        self.session = uuid.uuid4().hex[:12]
        self._seen_total = 0  # ring events the loop has taken a window of
        context = context or zmq.Context.instance()
        control = config.control or control_endpoint_for(config.pub)
        self.publisher = Publisher(bind(context, zmq.PUB, config.pub))
        try:
            self._control_socket = bind(context, zmq.REP, control)
        except zmq.ZMQError:
            self.publisher.socket.close(0)
            raise
        self.pub_endpoint = self.publisher.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.publishing = WindowPublisher(
            self.publisher, self.counts, self.labelling.windows, self.replay, self.session, config.top_k
        )
        self.control_endpoint = self._control_socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.state = ServerState(
            session=self.session,
            counts=self.counts,
            accumulation=self.accumulation,
            control=self.control,
            model=self.model,
            labelling=self.labelling,
            source=self.source,
            replay=self.replay,
            recorder=self.recorder,
            control_endpoint=self.control_endpoint,
        )

    # ---- what tests, benchmarks and ``mem serve`` read -----------------------------------------------------

    @property
    def ring(self) -> EventRing:
        return self.accumulation.ring

    @property
    def window(self) -> Window:
        """The window being served."""
        return self.accumulation.window

    @property
    def predictor(self) -> Predictor | None:
        """The model being served (None while loading, or without a model)."""
        return self.model.predictor

    @property
    def model_loaded(self) -> threading.Event:
        """Set once the first model is served."""
        return self.model.loaded

    @property
    def frames(self) -> int:
        """Predictions published."""
        return self.counts.frames

    @property
    def windows(self) -> int:
        """Windows published (the newest ``frame`` id)."""
        return self.counts.windows

    @property
    def skipped_windows(self) -> int:
        return self.counts.skipped_windows

    @property
    def latencies(self) -> deque[tuple[float, float]]:
        """(publish time, latency) in monotonic seconds."""
        return self.counts.latencies

    def stats(self) -> dict[str, Any]:
        """The ``stats`` message's fields (``ServerState.stats``)."""
        return self.state.stats()

    def control_state(self) -> dict[str, Any]:
        """The ``state`` control reply (``ServerState.control_state``)."""
        return self.state.control_state()

    def reply_frames(self, frames: list[bytes], seq: int) -> list[bytes]:
        """The encoded reply to one control request (never raises)."""
        return self.control.reply_frames(frames, seq)

    def window_truth(self, events: np.ndarray) -> dict[str, Any]:
        """The live source's ground truth of a window (``source_truth``)."""
        return source_truth(self.source, events)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the thread ``start`` began is still serving."""
        return self._runner is not None and self._runner.is_alive()

    def start(self) -> LiveServer:
        """Run the server in a background thread (tests, benchmarks); ``stop()`` ends it."""
        self._runner = threading.Thread(target=self.run, name="mem-serve", daemon=True)
        self._runner.start()
        return self

    @property
    def stopping(self) -> bool:
        """``stop()`` was asked for."""
        return self._stop.is_set()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every thread to finish and wait for them; sockets are closed by ``run``."""
        self._stop.set()
        self._wake.set()
        if self._runner is not None:
            self._runner.join(timeout)

    def run(self, duration_s: float | None = None) -> None:
        """Serve until ``stop()``, the end of a non-looping source, or ``duration_s``; re-raises an error of the
        source or of loading the model."""
        duration_s = duration_s if duration_s is not None else self.config.duration_s
        started = time.monotonic()
        end = None if duration_s is None else started + duration_s
        threads = [
            self._thread("reader", self._reported(self.reader.run), self._stop),
            self._thread("control", self.control.serve, self._control_socket, self._stop),
        ]
        if self.model.loading:
            threads.append(self._thread("loader", self._reported(self._load_model), started))
        if self.config.watch and self.model.path is not None:
            threads.append(self._thread("watch", self.model.watch, self._stop))
        try:
            self._inference_loop(end)
        finally:
            self._stop.set()
            self.source.close()
            for thread in threads:
                thread.join(5.0)
            if self.recorder is not None:
                self.recorder.stop()
            self.labelling.close()
            self.publisher.socket.close(0)
            self._control_socket.close(0)
        if self._error is not None:
            raise self._error

    def _thread(self, name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"mem-serve-{name}", daemon=True)
        thread.start()
        return thread

    def _reported(self, target: Callable[..., None]) -> Callable[..., None]:
        """``target``, whose error ends the server and is raised by ``run()`` in the main thread."""

        def reporting(*args: Any) -> None:
            try:
                target(*args)
            except Exception as exc:
                self._error = exc
                self._stop.set()
                self._wake.set()

        return reporting

    def _load_model(self, started: float) -> None:
        try:
            self.model.load()
        except RunError:
            if self._stop.is_set():  # stopped while the model's first window ran: nothing went wrong
                return
            raise
        if self.announce is not None:
            self.announce(
                f"mem serve: {self.model.predictor.task} model ready after {time.monotonic() - started:.1f} s, "
                f"window {describe_window(self.window)}"
            )

    def _model_coming(self, predictor: Predictor, keep_window: bool) -> None:
        """A model about to be served: its training window, and the held window inferred again (asked before the
        model is served, so the loop cannot end a finished file before this inference)."""
        self.accumulation.follow_model(predictor.training_window, keep_window)
        self._refresh = True

    # ---- inference loop ------------------------------------------------------------------------------------

    def _inference_loop(self, end: float | None) -> None:
        interval = self.config.stats_interval_s
        next_stats = time.monotonic()  # a first stats message at once: a viewer learns "loading model" early
        while not self._stop.is_set():
            now = time.monotonic()
            if end is not None and now >= end:
                break
            if now >= next_stats:
                self.publishing.stats(self.stats())
                next_stats = max(next_stats + interval, now)
            wait = max((next_stats if end is None else min(next_stats, end)) - now, 0.0)
            if self.model.predictor is None:
                # loading: a sensor view now and then, no wake-up per batch (the CPU is the loader's); no model:
                # sensor views at a display's rate
                preview = PREVIEW_INTERVAL_S if self.model.loading else NO_MODEL_INTERVAL_S
                self.model.loaded.wait(min(wait, preview))
                if self.ring.total != self._seen_total:
                    self._infer_and_publish()
                elif not self.model.loading and self.reader.done:
                    break  # no model, and a file played to its end
                continue
            if self._wake.wait(wait):
                self._wake.clear()
                if self.ring.total != self._seen_total or self._refresh:
                    self._refresh = False
                    self._infer_and_publish()
            if self.reader.done and self.ring.total == self._seen_total and not self._refresh:
                break  # a file played to its end, and its last window was inferred
        self.publishing.stats(self.stats())

    def _request_refresh(self) -> None:
        self._refresh = True
        self._wake.set()

    def _infer_and_publish(self) -> None:
        window, (predictor, version), sensor = self.window, self.model.served, self.reader.sensor  # others replace them
        snap = self.ring.snapshot(window.events)
        new_events = snap.total - self._seen_total
        self._seen_total = snap.total
        if len(snap.events) == 0 or sensor is None:
            return
        if predictor is not None:  # events never inferred, in whole windows, are "skipped" (not while loading)
            self.counts.count_unseen(new_events, len(snap.events), window.events)
        events = newest_span(snap.events, window.ms)
        start = time.perf_counter()
        view, binning = sensor_view(events, sensor)
        stages = {"sensor": (time.perf_counter() - start) * 1e3}
        out = predictor(events, sensor) if predictor is not None else None
        self.counts.windows += 1
        common = self.publishing.frame_fields(events, sensor, snap.arrival)
        info = self.publishing.capture_info(self.source.metadata, window)
        self.labelling.windows.add(HeldWindow(self.counts.windows, events, sensor, info))
        start = time.perf_counter()
        region = out.region if out is not None else (0, 0, sensor.height, sensor.width)
        input_region = [v / binning for v in region]
        self.publishing.sensor(view, binning, input_region, common)
        if out is not None:
            self.publishing.prediction(predictor, version, out, common, snap.arrival, record_latency=new_events > 0)
            stages.update(out.stages_ms)
        self.counts.last_stages = {**stages, "publish": (time.perf_counter() - start) * 1e3}

    # ---- state -------------------------------------------------------------------------------------------

    # ---- control commands ----------------------------------------------------------------------------------

    def _commands(self) -> dict[str, Command]:
        """What each control command does (``state`` only answers)."""
        replay = self.replay.commands if self.replay is not None else dict.fromkeys(REPLAY_COMMANDS, self._no_replay)
        recording = ("record_start", "record_stop")
        return {
            **replay,
            "window": self._choose_window,
            "capture": self._capture,
            "undo_capture": lambda command, args: self.labelling.undo(),
            "train": self._train,
            **dict.fromkeys(recording, self._record if self.recorder is not None else self._no_recording),
        }

    def _no_replay(self, command: str, args: dict[str, Any]) -> None:
        raise ControlError(f"{command}: the source ({self.source.metadata.get('kind')}) is live: it cannot pause")

    def _choose_window(self, command: str, args: dict[str, Any]) -> None:
        self.accumulation.choose(Window(args["events"], args["ms"]))
        self._request_refresh()  # the new window at once, also while a replay is paused

    def _capture(self, command: str, args: dict[str, Any]) -> None:
        self.labelling.capture(args["label"], args.get("frame"), self.window_truth)

    def _train(self, command: str, args: dict[str, Any]) -> None:
        pretrain, path = self.config.pretrain, self.model.path
        if pretrain is None and path is not None:
            pretrain = pretraining_run_of(path.parent if path.is_file() else path)  # an ONNX file: its export folder
        self.labelling.train(
            pretrain,
            args.get("epochs"),
            lambda export: self.model.swap(export, keep_window=True),
            args.get("classes"),
            onnx=self.model.onnx,
        )

    def _record(self, command: str, args: dict[str, Any]) -> None:
        if command == "record_start":
            self.recorder.start(args.get("name") or f"live-{datetime.now():%Y%m%d-%H%M%S}")
        else:
            self.recorder.stop()

    def _no_recording(self, command: str, args: dict[str, Any]) -> None:
        raise ControlError(
            f"{command}: recording needs a live source ({' or '.join(RECORDABLE_KINDS)}), "
            f"not {self.source.metadata.get('kind')}"
        )


def source_truth(source: Any, events: np.ndarray) -> dict[str, Any]:
    """A simulated source's ground truth of a window of its events: ``{"truth": class names in view}`` when one
    scene spans the whole window (else None); ``{}`` for sources that know none."""
    classes_at = getattr(source, "classes_at", None)
    if classes_at is None:
        return {}
    first, last = classes_at(int(events["t"][0])), classes_at(int(events["t"][-1]))
    return {"truth": last if first == last else None}


@contextlib.contextmanager
def _signals_handled_by(handler: Callable[[int, Any], None] | int) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` inside, to what they went to before after. In the main thread only
    (Python sets handlers there; elsewhere they stay as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


def interrupted_by_signals() -> contextlib.AbstractContextManager[None]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` (while the server is built and its model starts loading): a
    shell starts a background job (``mem serve ... &``) with SIGINT ignored, and Python leaves it ignored; SIGTERM
    would end the process without closing the source, the recording and the sockets."""
    return _signals_handled_by(signal.default_int_handler)


def stopped_by_signals(server: LiveServer) -> contextlib.AbstractContextManager[None]:
    """Ctrl-C (SIGINT) and SIGTERM stop ``server`` between two windows; a second one raises ``KeyboardInterrupt``.
    Raised at the first, it could land in a library's C callback (pyzmq's frame deallocation) that prints it and
    goes on, and the server went on serving."""

    def stop(signum: int, frame: Any) -> None:
        if server.stopping:
            raise KeyboardInterrupt
        server.stop(timeout=0)

    return _signals_handled_by(stop)


def serve_live(config: ServeConfig) -> None:
    """Serve until Ctrl-C (or ``config.duration_s``), printing the endpoints, when the model is ready, and a
    final summary. Ctrl-C and SIGTERM stop it: raised while it starts, between two windows once it runs."""
    with interrupted_by_signals():
        _serve(config)


def _serve(config: ServeConfig) -> None:
    server = LiveServer(config, torch_threads=config.threads, announce=lambda line: print(line, flush=True))
    config = server.config
    if server.labelling.resumed is not None:
        start = (
            f"loading {config.model}, the newest Train run on {config.labels} (--model picks another); "
            f"source {config.source!r} streams meanwhile"
        )
    elif config.model is not None:
        start = f"loading model {config.model}; source {config.source!r} streams meanwhile"
    else:
        start = f"no model: source {config.source!r} streams for labelling into {config.labels}"
    print(
        f"mem serve: {start}\npublishing on {server.pub_endpoint}, control on {server.control_endpoint}",
        flush=True,
    )
    started = time.monotonic()
    try:
        with stopped_by_signals(server):
            server.run()
    except KeyboardInterrupt:
        server.stop()
    if server.model.loading:  # stopped (Ctrl-C, --duration) while the model was still loading: say so
        why = f"did not load: {server._error}" if server._error else "was still loading"
        print(
            f"mem serve: stopped {time.monotonic() - started:.1f} s after the start; the model {config.model} {why}",
            flush=True,
        )
    lat = [x for _, x in server.latencies]
    p95 = f", p95 latency {np.percentile(lat, 95) * 1e3:.1f} ms" if lat else ""
    print(f"mem serve: {server.frames} predictions, {server.skipped_windows} skipped windows{p95}", flush=True)
