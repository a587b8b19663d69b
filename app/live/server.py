"""``mem serve``: run a model on the newest events of a live source and publish the results over ZMQ.

Four threads:

- the reader pulls batches from the source into an ``EventRing`` of the newest window, stamping each batch with
  its arrival time (and appends them to a corpus while recording); between batches it carries out the replay
  commands (play, pause, speed, seek), so the first batch after a seek is known;
- the loader imports torch and loads the model. The source streams from the start: until the model is ready the
  server publishes the sensor view of every window and ``stats`` saying ``model_state: "loading"``;
- the inference loop (the thread calling ``run``) takes the newest window whenever new events arrived, publishes
  its ``sensor`` view and, once the model is loaded, runs the ``Predictor`` and publishes ``hist``, ``tokens``,
  ``pred``; windows that came and went while it was busy are counted as skipped, never queued; ``stats`` go out
  every ``stats_interval_s``;
- the control thread answers JSON requests on a REP socket (replay, window, recording, labelling commands, state);
- with ``--watch``, a watcher loads a newer export of the model when one appears; a Train run (labelling) loads the
  model it exported the same way. The new model takes over between two windows: the stream, the sockets and the
  viewers' connections stay; ``model.version`` counts the models served.

Without a model the server streams the sensor view only (``model_state: "none"``): a viewer can label windows
(``capture``), and ``train`` finetunes the pretraining run on them (``app.live.labelling``).

The window is the newest ``events`` events, none older than ``ms`` before the newest: by default the window the
model was trained on (``mem export`` records it), changed at run time by the ``window`` command.
The wire format is in ``mem_core.protocol`` and docs/protocol.md.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import zmq

from app.config import ServeConfig
from app.live.labelling import HeldWindow, LabelDesk, LabelError
from app.live.ring import EventRing
from app.live.sensor_view import sensor_view
from mem_core.configuration import ConfigError
from mem_core.errors import RunError
from mem_core.events import SensorSize
from mem_core.lineage import pretraining_run_of, source_run
from mem_core.protocol import (
    MAX_TEXT,
    MAX_WINDOW_EVENTS,
    MAX_WINDOW_MS,
    ProtocolError,
    decode,
    decode_control,
    encode,
    encode_control,
)
from recorders.base import LiveSource, RecorderError
from recorders.live_recorder import LiveRecorder
from recorders.publish import CLOSE_LINGER_MS
from recorders.sources import open_source

if TYPE_CHECKING:  # torch is imported by the loader thread, not at start
    from mem_core.inference import Output, Predictor

RECORDABLE_KINDS = ("camera", "sim")
REPLAY_COMMANDS = ("play", "pause", "speed", "seek")
LATENCY_HISTORY = 100_000  # (time, latency) pairs kept for benchmarks
LOADING_WINDOW_EVENTS = 30_000  # the window until the model tells its own (the paper's n_max)
PREVIEW_INTERVAL_S = 0.2  # sensor views while the model loads: 5 a second leave the CPU to the loading
REPLAY_COMMAND_WAIT_S = 5.0  # the reader thread carries a replay command out within ~50 ms; a reply waits this long
NO_MODEL_WINDOW = (30_000, 50.0)  # the window without a model: the sim dataset's 50 ms samples, crisp to label
NO_MODEL_INTERVAL_S = 1 / 30  # sensor views a second without a model
WATCH_INTERVAL_S = 1.0  # how often --watch looks at the model's files
MODEL_FILES = ("model.json", "model.safetensors", "best.pt")


class Window(NamedTuple):
    """What a prediction sees: the newest ``events`` events, none older than ``ms`` before the newest (None: no
    time limit)."""

    events: int
    ms: float | None


def control_endpoint_for(pub: str) -> str:
    """The default control endpoint: same host, port + 1 (``*`` stays ``*``); ``ipc://X`` -> ``ipc://X-control``."""
    if not pub.startswith("tcp://"):
        return pub + "-control"
    host, sep, port = pub.rpartition(":")
    if not sep or host == "tcp":
        raise ConfigError(f"endpoint {pub!r} has no port (expected tcp://HOST:PORT)")
    if port == "*":
        return pub
    if not port.isdigit():
        raise ConfigError(f"endpoint {pub!r} has a bad port {port!r}")
    return f"{host}:{int(port) + 1}"


def configured_window(config: ServeConfig, model: tuple[int, float | None] | None) -> Window:
    """The window ``config`` asks for; what it leaves open comes from the model's training window (``model``,
    None while loading). ``window_ms`` 0 means no time limit."""
    if model is None and config.model is None:  # no model coming: a window to label with
        model = NO_MODEL_WINDOW
    events = config.window or min(model[0] if model else LOADING_WINDOW_EVENTS, MAX_WINDOW_EVENTS)
    ms = config.window_ms if config.window_ms is not None else (model[1] if model else None)
    return Window(events, ms or None)


def _check_options(config: ServeConfig, loading: bool) -> None:
    """Bad options as one line at once, not after the seconds of loading the model."""
    if loading and config.model is not None and not Path(config.model).is_dir():
        raise ConfigError(f"model {config.model}: no such directory (an export or a finetune / segment run)")
    if config.window is not None and not 1 <= config.window <= MAX_WINDOW_EVENTS:
        raise ConfigError(f"window must be 1 to {MAX_WINDOW_EVENTS:,} events, got {config.window}")
    ms = config.window_ms
    if ms is not None and not (math.isfinite(ms) and 0 <= ms <= MAX_WINDOW_MS):
        raise ConfigError(f"window_ms must be 0 (no time limit) to {MAX_WINDOW_MS:g} ms, got {ms}")
    if config.train_epochs < 1:
        raise ConfigError(f"train_epochs must be at least 1, got {config.train_epochs}")
    if config.top_k <= 0 or config.stats_interval_s <= 0:
        raise ConfigError(f"top_k and stats_interval_s must be positive, got {config.top_k}, {config.stats_interval_s}")


class ControlError(Exception):
    """A control request that cannot be carried out (the reply's ``error``)."""


class LiveServer:
    """The live inference server. ``run()`` blocks; ``start()`` runs it in a thread, ``stop()`` ends it.

    Args:
        config: see ``ServeConfig``.
        source: a ``LiveSource`` to use instead of opening ``config.source``.
        predictor: a ``Predictor`` to use instead of loading ``config.model``.
        context: the ZMQ context (default: the process-wide instance).
        torch_threads: torch CPU threads to set when the model is loaded (``mem serve --threads``); None leaves
            the process's setting alone (tests and benchmarks that share their process).
    """

    def __init__(
        self,
        config: ServeConfig,
        *,
        source: LiveSource | None = None,
        predictor: Predictor | None = None,
        context: zmq.Context | None = None,
        torch_threads: int | None = None,
    ) -> None:
        _check_options(config, loading=predictor is None)
        self.config = config
        # (predictor, its model version): one attribute, so a window never pairs one model's output with another's
        # version; set by the loader thread once the model is ready, replaced by a swap
        self._served: tuple[Predictor | None, int] = (None, 0)
        self._given_predictor = predictor
        self._loading = predictor is not None or config.model is not None  # a first model is coming
        self.model_path: Path | None = Path(config.model) if config.model is not None else None
        self.model_name: str | None = None
        self.model_error: str | None = None  # why a newer model could not be loaded (the old one stays)
        self._model_stamp: tuple | None = None  # the served model's files (size, mtime), for --watch
        self.labelling = LabelDesk(config.labels, config.train_out, config.train_epochs, config.classes)
        self._torch_threads = torch_threads
        self.default_window = configured_window(config, None)
        self.window = self.default_window
        self._window_chosen = False  # a window command came: the model's training window no longer applies
        self.source = source or open_source(config.source, speed=config.speed, loop=config.loop)
        self.ring = EventRing(self.window.events)
        self.session = uuid.uuid4().hex[:12]
        self._context = context or zmq.Context.instance()
        self._pub = self._bind(zmq.PUB, config.pub)
        try:
            self._control = self._bind(zmq.REP, config.control or control_endpoint_for(config.pub))
        except zmq.ZMQError:
            self._pub.close(0)
            raise
        self.pub_endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.control_endpoint = self._control.getsockopt_string(zmq.LAST_ENDPOINT)
        kind = self.source.metadata.get("kind")
        self.recorder = LiveRecorder(config.record_dir) if kind in RECORDABLE_KINDS else None
        self.announce: Callable[[str], None] | None = None  # told when the model is ready (``mem serve`` prints it)

        self.model_loaded = threading.Event()
        self.model_ready_s: float | None = None  # seconds from ``run()`` to a loaded, warmed-up model
        self._stop = threading.Event()
        self._new_events = threading.Event()
        self._refresh = False  # infer the held window again (the model came, the window changed)
        self._threads: list[threading.Thread] = []
        self._runner: threading.Thread | None = None
        self._source_done = False
        self._error: BaseException | None = None
        self._sensor: SensorSize | None = None
        self._seq = dict.fromkeys(("sensor", "hist", "tokens", "pred", "stats"), 0)
        # inference bookkeeping (inference thread only)
        self.frames = 0  # predictions
        self.windows = 0  # windows published (the ``frame`` id; sensor views while the model loads included)
        self.skipped_windows = 0
        self.control_malformed = 0
        self.commands = 0  # control commands carried out (stats carry it: a client tells stats older than a reply)
        # (publish time, latency) in monotonic seconds; other threads read it with list() (atomic under the GIL)
        self.latencies: deque[tuple[float, float]] = deque(maxlen=LATENCY_HISTORY)
        self._seen_total = 0
        self._unseen_events = 0
        self._last_window: dict[str, Any] = {}
        self._last_stages: dict[str, float] = {}
        self._stats_mark = (time.monotonic(), 0, 0)  # (time, ring total, frames) at the last stats message
        # replay: commands for the reader thread; position (reader thread writes, others read)
        self._replay_commands: queue.SimpleQueue[tuple[str, dict[str, Any], Future]] = queue.SimpleQueue()
        self._replay_base_us: int | None = 0
        self._replay_ref_us = 0
        self.replay_position_us = 0

    def _bind(self, kind: int, endpoint: str) -> zmq.Socket:
        socket = self._context.socket(kind)
        # a PUB socket with a zero linger can abort libzmq on close (see recorders.publish); the others need none
        socket.setsockopt(zmq.LINGER, CLOSE_LINGER_MS if kind == zmq.PUB else 0)
        if kind == zmq.PUB:
            socket.setsockopt(zmq.SNDHWM, 16)  # a slow subscriber loses old messages, the server never waits
        try:
            socket.bind(endpoint)
        except zmq.ZMQError as exc:
            socket.close(0)
            raise zmq.ZMQError(exc.errno, f"cannot bind {endpoint}: {exc.strerror}") from None
        return socket

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> LiveServer:
        """Run the server in a background thread (tests, benchmarks); ``stop()`` ends it."""
        self._runner = threading.Thread(target=self.run, name="mem-serve", daemon=True)
        self._runner.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every thread to finish and wait for them; sockets are closed by ``run``."""
        self._stop.set()
        self._new_events.set()
        if self._runner is not None:
            self._runner.join(timeout)

    def run(self, duration_s: float | None = None) -> None:
        """Serve until ``stop()``, the end of a non-looping source, or ``duration_s``; re-raises an error of the
        source or of loading the model."""
        duration_s = duration_s if duration_s is not None else self.config.duration_s
        started = time.monotonic()
        end = None if duration_s is None else started + duration_s
        self._threads = [
            threading.Thread(target=self._read_source, name="mem-serve-reader", daemon=True),
            threading.Thread(target=self._serve_control, name="mem-serve-control", daemon=True),
        ]
        if self._loading:
            self._threads.append(
                threading.Thread(target=self._load_model, args=(started,), name="mem-serve-loader", daemon=True)
            )
        if self.config.watch and self.model_path is not None:
            self._threads.append(threading.Thread(target=self._watch_model, name="mem-serve-watch", daemon=True))
        for thread in self._threads:
            thread.start()
        try:
            self._inference_loop(end)
        finally:
            self._stop.set()
            self.source.close()
            for thread in self._threads:
                thread.join(5.0)
            if self.recorder is not None:
                self.recorder.stop()
            self.labelling.close()
            self._pub.close(0)
            self._control.close(0)
        if self._error is not None:
            raise self._error

    # ---- loader thread -------------------------------------------------------------------------------------

    def _load_model(self, started: float) -> None:
        """Import torch, load and warm up the model, then hand it to the inference loop."""
        try:
            import torch

            from mem_core.inference import Predictor

            if self._torch_threads is not None:
                torch.set_num_threads(self._torch_threads)
            config = self.config
            stamp = model_stamp(self.model_path)
            predictor = self._given_predictor or Predictor(config.model, config.tokenizer, config.device)
            predictor.warm_up()
        except Exception as exc:  # reported by run() in the main thread
            self._error = exc
            self._stop.set()
            self._new_events.set()
            return
        self._install(predictor, self.model_path, stamp)
        self.model_ready_s = time.monotonic() - started
        if self.announce is not None:
            self.announce(
                f"mem serve: {predictor.task} model ready after {self.model_ready_s:.1f} s, "
                f"window {describe_window(self.window)}"
            )

    def _install(self, predictor: Predictor, path: Path | None, stamp: tuple | None, keep_window: bool = False) -> None:
        """Serve ``predictor`` from the next window on (the stream and the sockets stay)."""
        self.default_window = configured_window(self.config, predictor.training_window)
        if keep_window:  # a model trained on captures is served on windows like the captured ones
            self._window_chosen = True
        if not self._window_chosen:
            self._set_window(self.default_window)
        self._refresh = True  # before the predictor: the loop must not end a finished file before this inference
        self.model_path, self._model_stamp = path, stamp
        self.model_name = model_name(path)
        self.model_error = None
        self._served = (predictor, self.model_version + 1)
        self._loading = False
        self.model_loaded.set()
        self._new_events.set()

    def swap_model(self, path: Path | str, keep_window: bool = False) -> None:
        """Load the model at ``path`` (an export or a run) and serve it from the next window on; raises what loading
        raised and keeps the current model then. Runs in the calling thread (a watcher, a Train run)."""
        from mem_core.inference import Predictor

        path = Path(path)
        stamp = model_stamp(path)
        predictor = Predictor(path, None, self.config.device)
        predictor.warm_up()
        self._install(predictor, path, stamp, keep_window=keep_window)
        if self.announce is not None:
            self.announce(f"mem serve: now serving {path} (model version {self.model_version})")

    def _watch_model(self) -> None:
        """``--watch``: load the served model's files again when they changed and stayed unchanged for one look
        (an export being written is not read half-way); a model that fails to load is reported, once."""
        while not self.model_loaded.wait(0.2):
            if self._stop.is_set():  # the server ended before its first model loaded
                return
        seen = failed = None
        while not self._stop.wait(WATCH_INTERVAL_S):
            path = self.model_path
            stamp = model_stamp(path)
            if stamp is None or stamp == self._model_stamp or stamp == failed:
                seen = stamp
                continue
            if stamp != seen:  # changed since the last look: wait until it settles
                seen = stamp
                continue
            try:
                self.swap_model(path)
            except Exception as exc:  # a broken export: keep serving the current model
                failed = stamp
                self.model_error = f"{path}: {type(exc).__name__}: {exc}"[:MAX_TEXT]

    # ---- reader thread -------------------------------------------------------------------------------------

    def _read_source(self) -> None:
        last_t: int | None = None
        try:
            for batch in self.source:
                if self._stop.is_set():
                    break
                if len(batch):
                    last_t = self._take(batch, last_t)
                self._apply_replay_commands()  # between batches: the next batch is the first after a seek
        except Exception as exc:  # reported by run() in the main thread
            self._error = exc
            self._stop.set()
        finally:
            self._source_done = True
            self._new_events.set()

    def _take(self, batch: np.ndarray, last_t: int | None) -> int:
        """Put a batch into the ring (and the recording); returns its newest time."""
        arrival = time.monotonic()
        sensor = SensorSize(*self.source.sensor)
        if sensor != self._sensor or (last_t is not None and int(batch["t"][0]) < last_t):
            self.ring.clear()  # a new stream (another sensor or a restarted publisher)
            self._sensor = sensor
        self._track_replay(batch)  # before the push: a window never holds events of an unknown position
        self.ring.push(batch, arrival)
        if self.recorder is not None:
            self.recorder.append(batch, sensor, self.source.metadata)
        self._new_events.set()
        return int(batch["t"][-1])

    def _track_replay(self, batch: np.ndarray) -> None:
        if not hasattr(self.source, "t_last"):
            return
        if self._replay_base_us is not None:  # first batch after the start or a seek
            self._replay_ref_us = int(batch["t"][0]) - self._replay_base_us
            self._replay_base_us = None
        self.replay_position_us = self._file_position_us(int(batch["t"][-1]))

    def _file_position_us(self, t_us: int) -> int:
        """Where in the replayed file the event at stream time ``t_us`` lies (loops continue 1 us after the end)."""
        duration = int(self.source.t_last) - int(self.source.t_first) + 1
        return (t_us - self._replay_ref_us) % duration

    def _apply_replay_commands(self) -> None:
        while True:
            try:
                command, args, done = self._replay_commands.get_nowait()
            except queue.Empty:
                return
            try:
                self._apply_replay(command, args)
            except Exception as exc:  # handed to the control thread, which answers with it
                done.set_exception(exc)
            else:
                done.set_result(None)

    def _apply_replay(self, command: str, args: dict[str, Any]) -> None:
        source = self.source
        if command == "play":
            source.resume()
        elif command == "pause":
            source.pause()
        elif command == "speed":
            source.speed = args["value"]
        else:
            position = min(int(args["position_s"] * 1e6), int(source.t_last) - int(source.t_first))
            source.seek(position)
            self._replay_base_us = self.replay_position_us = position
            self.ring.clear()  # a window from before the seek would mix two moments of the file

    # ---- inference loop ------------------------------------------------------------------------------------

    def _inference_loop(self, end: float | None) -> None:
        interval = self.config.stats_interval_s
        next_stats = time.monotonic()  # a first stats message at once: a viewer learns "loading model" early
        while not self._stop.is_set():
            now = time.monotonic()
            if end is not None and now >= end:
                break
            if now >= next_stats:
                self._publish_stats()
                next_stats = max(next_stats + interval, now)
            wait = max((next_stats if end is None else min(next_stats, end)) - now, 0.0)
            if self.predictor is None:
                # loading: a sensor view now and then, no wake-up per batch (the CPU is the loader's); no model:
                # sensor views at a display's rate
                interval = PREVIEW_INTERVAL_S if self._loading else NO_MODEL_INTERVAL_S
                self.model_loaded.wait(min(wait, interval))
                if self.ring.total != self._seen_total:
                    self._infer_and_publish()
                elif not self._loading and self._source_done:
                    break  # no model, and a file played to its end
                continue
            if self._new_events.wait(wait):
                self._new_events.clear()
                if self.ring.total != self._seen_total or self._refresh:
                    self._refresh = False
                    self._infer_and_publish()
            if self._source_done and self.ring.total == self._seen_total and not self._refresh:
                break  # a file played to its end, and its last window was inferred
        self._publish_stats()

    def _request_refresh(self) -> None:
        self._refresh = True
        self._new_events.set()

    def _infer_and_publish(self) -> None:
        window, (predictor, version), sensor = self.window, self._served, self._sensor  # (other threads replace them)
        snap = self.ring.snapshot(window.events)
        new_events = snap.total - self._seen_total
        self._seen_total = snap.total
        if len(snap.events) == 0 or sensor is None:
            return
        if predictor is not None:  # events never inferred, in whole windows, are "skipped" (not while loading)
            self._unseen_events += max(0, new_events - len(snap.events))
            self.skipped_windows = self._unseen_events // window.events
        events = newest_span(snap.events, window.ms)
        start = time.perf_counter()
        view, binning = sensor_view(events, sensor)
        stages = {"sensor": (time.perf_counter() - start) * 1e3}
        out = predictor(events, sensor) if predictor is not None else None
        self.windows += 1
        common = self._frame_fields(events, sensor, snap.arrival)
        self.labelling.windows.add(HeldWindow(self.windows, events, sensor, self._capture_info(events)))
        start = time.perf_counter()
        region = out.region if out is not None else (0, 0, sensor.height, sensor.width)
        input_region = [v / binning for v in region]
        self._send("sensor", {"sensor": view}, binning=binning, input_region=input_region, **common)
        if out is not None:
            self._publish_prediction(predictor, version, out, common, snap.arrival, record_latency=new_events > 0)
            stages.update(out.stages_ms)
        self._last_stages = {**stages, "publish": (time.perf_counter() - start) * 1e3}

    def _frame_fields(self, events: np.ndarray, sensor: SensorSize, arrival: float) -> dict[str, Any]:
        """The fields every message of one window carries."""
        t = events["t"]
        self._last_window = {"events": len(events), "t_first_us": int(t[0]), "t_last_us": int(t[-1])}
        if hasattr(self.source, "t_last"):  # a replay: where in the file the newest event lies
            self._last_window["position_s"] = self._file_position_us(int(t[-1])) / 1e6
        return {
            "session": self.session,
            "frame": self.windows,
            "t_arrival": time.time() - (time.monotonic() - arrival),
            "window": self._last_window,
            "sensor": [sensor.height, sensor.width],
        }

    def _capture_info(self, events: np.ndarray) -> dict[str, Any]:
        """What a capture of this window records besides its events and the prediction: the source and the window
        (kept for every published window, so it stays cheap; the ground truth is looked up at capture)."""
        meta = self.source.metadata
        return {**{k: meta[k] for k in ("kind", "serial") if k in meta}, "window": self._last_window}

    def window_truth(self, events: np.ndarray) -> dict[str, Any]:
        """The live source's ground truth of a window (``source_truth``)."""
        return source_truth(self.source, events)

    def _publish_prediction(
        self,
        predictor: Predictor,
        version: int,
        out: Output,
        common: dict[str, Any],
        arrival: float,
        record_latency: bool,
    ) -> None:
        self.frames += 1
        self._send("hist", {"hist": out.hist}, **common)
        if out.tokens is not None:
            self._send("tokens", {"tokens": out.tokens}, num_tokens=predictor.tokenizer.config.num_tokens, **common)
        arrays, fields = self._prediction(predictor, out)
        top1 = {"prediction": fields["top_k"][0]["name"]} if out.probs is not None else {}
        self.labelling.windows.update(common["frame"], model_version=version, **top1)
        now = time.monotonic()
        self._send("pred", arrays, latency_ms=(now - arrival) * 1e3, model_version=version, **fields, **common)
        if record_latency:  # a refresh of an old window (after a window change) says nothing about latency
            self.latencies.append((now, now - arrival))

    def _prediction(self, predictor: Predictor, out: Output) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        classes = predictor.classes
        if out.probs is not None:
            order = np.argsort(-out.probs)[: self.config.top_k]
            top_k = [{"id": int(i), "name": classes[i], "prob": float(out.probs[i])} for i in order]
            return {"probs": out.probs}, {"task": "classification", "classes": classes, "top_k": top_k}
        return {"mask": out.mask}, {"task": "segmentation", "classes": classes}

    def _send(self, topic: str, arrays: dict[str, np.ndarray] | None = None, **fields: Any) -> None:
        frames = encode(topic, self._seq[topic], arrays, **fields)
        self._seq[topic] += 1
        self._pub.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)  # PUB drops, never waits, when a peer lags

    def stats(self) -> dict[str, Any]:
        """The ``stats`` message fields (rates over the time since the previous call)."""
        now, total, frames = time.monotonic(), self.ring.total, self.frames
        t0, total0, frames0 = self._stats_mark
        self._stats_mark = (now, total, frames)
        dt = max(now - t0, 1e-9)
        recent = []  # latencies of the last 2 s, newest first
        for t, lat in reversed(self.latencies):
            if t < now - 2.0:
                break
            recent.append(lat)
        latency = {}
        if recent:
            p50, p95 = np.percentile(recent, [50, 95]) * 1e3
            latency = {"last": recent[0] * 1e3, "p50": float(p50), "p95": float(p95)}
        window = self._last_window
        return {
            "session": self.session,
            "events_per_s": (total - total0) / dt,
            "predictions_per_s": (frames - frames0) / dt,
            "predictions": frames,
            "window_events": window.get("events", 0),
            "window_ms": (window["t_last_us"] - window["t_first_us"]) / 1e3 if window else 0.0,
            "latency_ms": latency,
            "stages_ms": self._last_stages,
            "skipped_windows": self.skipped_windows,
            "malformed": self.control_malformed + getattr(self.source, "malformed", 0),
            **self._settings(),
            "source": self.source_state(),
            "recording": self.recorder.state() if self.recorder is not None else None,
            "control": self.control_endpoint,
        }

    def _publish_stats(self) -> None:
        self._send("stats", None, **self.stats())

    def _settings(self) -> dict[str, Any]:
        """``commands`` carried out (read first: what follows is at least that recent), ``model_state``
        ("loading" / "ready"), the ``task`` once known, and the window (``accumulation``)."""
        commands = self.commands
        window, default, predictor = self.window, self.default_window, self.predictor
        accumulation = {"events": window.events, "ms": window.ms}
        accumulation.update(default_events=default.events, default_ms=default.ms)
        model_state = "ready" if predictor is not None else "loading" if self._loading else "none"
        state = {"commands": commands, "model_state": model_state, "accumulation": accumulation}
        if predictor is not None:
            state["task"] = predictor.task
        # a capture labels a whole window: a classifier's classes are the names to offer, a segmenter's are not
        offered = predictor.classes if predictor is not None and predictor.task == "classification" else None
        state["labels"], state["training"] = self.labelling.state(offered)
        model = None
        if self.model_version:
            model = {"name": self.model_name or "model", "version": self.model_version, "path": str(self.model_path)}
        if self.model_error is not None:
            model = {**(model or {"name": "none", "version": 0, "path": ""}), "error": self.model_error}
        state["model"] = model
        return state

    def source_state(self) -> dict[str, Any]:
        """Source metadata (kind, model, serial, ...) plus the replay state for files."""
        meta = self.source.metadata
        state = {k: meta[k] for k in ("kind", "model", "serial", "height", "width") if k in meta}
        state["recordable"] = self.recorder is not None
        if hasattr(self.source, "seek"):
            state["replay"] = {
                "playing": not self.source.paused,
                "speed": self.source.speed,
                "position_s": self.replay_position_us / 1e6,
                "duration_s": (int(self.source.t_last) - int(self.source.t_first)) / 1e6,
            }
        return state

    # ---- control thread ------------------------------------------------------------------------------------

    def _serve_control(self) -> None:
        seq = 0
        while not self._stop.is_set():
            if not self._control.poll(100, zmq.POLLIN):
                continue
            frames = self._control.recv_multipart()
            self._control.send_multipart(self.reply_frames(frames, seq))
            seq += 1

    def reply_frames(self, frames: list[bytes], seq: int) -> list[bytes]:
        """The encoded reply to one request. Never raises: a REP socket that does not answer never hears again."""
        try:
            return encode_control(seq, **self.handle_control(frames))
        except Exception as exc:  # a bug in a command must not end the control thread
            error = f"{type(exc).__name__}: {exc}"[:MAX_TEXT]
            return encode_control(seq, "error", ok=False, error=error, state=None)

    def handle_control(self, frames: list[bytes]) -> dict[str, Any]:
        """The reply fields for one request: ``command``, ``ok``, ``error`` (or None) and ``state``."""
        try:
            command, args = decode_control(decode(frames, expect=("control",)))
        except ProtocolError as exc:
            self.control_malformed += 1
            return {"command": "error", "ok": False, "error": str(exc)[:MAX_TEXT], "state": None}
        try:
            self._apply_control(command, args)
        except (ControlError, LabelError, RecorderError, RunError, ValueError, OSError) as exc:
            return {"command": command, "ok": False, "error": str(exc)[:MAX_TEXT], "state": self.control_state()}
        if command != "state":
            self.commands += 1
        return {"command": command, "ok": True, "error": None, "state": self.control_state()}

    def control_state(self) -> dict[str, Any]:
        """What a client needs to draw its controls: session, model state, task, classes, window, source and
        recording state (task, classes and token grid once the model is loaded)."""
        state: dict[str, Any] = {"session": self.session, **self._settings()}
        if self.predictor is not None:
            state.update(classes=self.predictor.classes, token_grid=self.predictor.token_grid)
        recording = self.recorder.state() if self.recorder is not None else None
        state.update(source=self.source_state(), recording=recording)
        return state

    def _apply_control(self, command: str, args: dict[str, Any]) -> None:
        if command == "state":
            return
        if command in REPLAY_COMMANDS:
            if not hasattr(self.source, "seek"):
                raise ControlError(f"{command}: the source ({self.source.metadata.get('kind')}) is not a file replay")
            self._replay_command(command, args)
            return
        if command == "window":
            self._window_chosen = True
            self._set_window(Window(args["events"], args["ms"]))
            self._request_refresh()  # the new window at once, also while a replay is paused
            return
        if command in ("capture", "undo_capture", "train"):
            self._label_command(command, args)
            return
        if self.recorder is None:
            raise ControlError(
                f"{command}: recording needs a live source ({' or '.join(RECORDABLE_KINDS)}), "
                f"not {self.source.metadata.get('kind')}"
            )
        if command == "record_start":
            name = args.get("name") or f"live-{datetime.now():%Y%m%d-%H%M%S}"
            self.recorder.start(name)
        else:
            self.recorder.stop()

    def _label_command(self, command: str, args: dict[str, Any]) -> None:
        desk = self.labelling
        if command == "capture":
            desk.capture(args["label"], args.get("frame"), self.window_truth)
        elif command == "undo_capture":
            desk.undo()
        else:
            pretrain = self.config.pretrain
            if pretrain is None and self.model_path is not None:
                pretrain = pretraining_run_of(self.model_path)
            desk.train(pretrain, args.get("epochs"), lambda export: self.swap_model(export, keep_window=True))

    def _replay_command(self, command: str, args: dict[str, Any]) -> None:
        """Have the reader thread carry out a replay command between two batches, and wait until it did (the
        reply then shows its effect); with the reader gone (the source ended) carry it out here."""
        done: Future = Future()
        self._replay_commands.put((command, args, done))
        reader = self._threads[0] if self._threads else None
        deadline = time.monotonic() + REPLAY_COMMAND_WAIT_S
        while True:
            if reader is None or not reader.is_alive():
                self._apply_replay_commands()
            try:
                return done.result(timeout=0.05)  # raises what the command raised
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise ControlError(
                        f"{command}: the replay did not respond within {REPLAY_COMMAND_WAIT_S:g} s"
                    ) from None

    @property
    def predictor(self) -> Predictor | None:
        """The model being served (None while loading, or without a model)."""
        return self._served[0]

    @property
    def model_version(self) -> int:
        """Models served so far: 1 for the first, +1 for each swap (0: none yet)."""
        return self._served[1]

    def _set_window(self, window: Window) -> None:
        self.ring.resize(window.events)
        self.window = window


def model_stamp(path: Path | None) -> tuple | None:
    """(name, size, mtime) of a model directory's files, to tell a newer export; None when it has none."""
    if path is None:
        return None
    stamp = []
    for name in MODEL_FILES:
        try:
            info = (path / name).stat()
        except OSError:
            continue
        stamp.append((name, info.st_size, info.st_mtime_ns))
    return tuple(stamp) or None


def model_name(path: Path | None) -> str | None:
    """How the viewer names a model: the run an export came from (``label-003``), else its directory."""
    if path is None:
        return None
    try:
        source = source_run(path)
    except RunError:  # a model.json that does not say cleanly: the loader reports it, the name falls back
        source = None
    return source.name if source is not None else path.name


def source_truth(source: Any, events: np.ndarray) -> dict[str, Any]:
    """A simulated source's ground truth of a window of its events: ``{"truth": class names in view}`` when one
    scene spans the whole window (else None); ``{}`` for sources that know none."""
    classes_at = getattr(source, "classes_at", None)
    if classes_at is None:
        return {}
    first, last = classes_at(int(events["t"][0])), classes_at(int(events["t"][-1]))
    return {"truth": last if first == last else None}


def newest_span(events: np.ndarray, ms: float | None) -> np.ndarray:
    """The suffix of time-sorted ``events`` no older than ``ms`` before the newest (all of them for None)."""
    if ms is None:
        return events
    t = events["t"]  # live sources keep time monotonic, so the newest span is a suffix
    return events[np.searchsorted(t, t[-1] - round(ms * 1000), side="right") :]


def describe_window(window: Window) -> str:
    """``30000 events of at most 100 ms`` (for messages)."""
    return f"{window.events} events" + ("" if window.ms is None else f" of at most {window.ms:g} ms")


def run(config: ServeConfig) -> None:
    """Serve until Ctrl-C (or ``config.duration_s``), printing the endpoints, when the model is ready, and a
    final summary."""
    server = LiveServer(config, torch_threads=config.threads)
    server.announce = lambda line: print(line, flush=True)
    start = (
        f"loading model {config.model}; source {config.source!r} streams meanwhile"
        if config.model is not None
        else f"no model: source {config.source!r} streams for labelling into {config.labels}"
    )
    print(
        f"mem serve: {start}\npublishing on {server.pub_endpoint}, control on {server.control_endpoint}",
        flush=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        server.stop()
    lat = [x for _, x in server.latencies]
    p95 = f", p95 latency {np.percentile(lat, 95) * 1e3:.1f} ms" if lat else ""
    print(f"mem serve: {server.frames} predictions, {server.skipped_windows} skipped windows{p95}", flush=True)
