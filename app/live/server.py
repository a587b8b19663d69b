"""``mem serve``: run a model on the newest events of a live source and publish the results over ZMQ.

Three threads:

- the reader pulls batches from the source into an ``EventRing`` of the newest ``window`` events, stamping
  each batch with its arrival time (and appends them to a corpus while recording);
- the inference loop (the thread calling ``run``) takes the newest window whenever new events arrived,
  runs the ``Predictor`` and publishes ``hist``, ``tokens``, ``pred`` messages; windows that came and went
  while it was busy are counted as skipped, never queued; ``stats`` go out every ``stats_interval_s``;
- the control thread answers JSON requests on a REP socket (replay and recording commands, state).

The wire format is in ``mem_core.protocol`` and docs/protocol.md.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from datetime import datetime
from typing import Any

import numpy as np
import zmq

from app.config import ServeConfig
from app.live.ring import EventRing
from mem_core.configuration import ConfigError
from mem_core.events import SensorSize
from mem_core.inference import Output, Predictor
from mem_core.protocol import MAX_TEXT, ProtocolError, decode, decode_control, encode, encode_control
from recorders.base import LiveSource, RecorderError
from recorders.live_recorder import LiveRecorder
from recorders.publish import CLOSE_LINGER_MS
from recorders.sources import open_source

RECORDABLE_KINDS = ("camera", "sim")
LATENCY_HISTORY = 100_000  # (time, latency) pairs kept for benchmarks


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


class ControlError(Exception):
    """A control request that cannot be carried out (the reply's ``error``)."""


class LiveServer:
    """The live inference server. ``run()`` blocks; ``start()`` runs it in a thread, ``stop()`` ends it.

    Args:
        config: see ``ServeConfig``.
        source: a ``LiveSource`` to use instead of opening ``config.source``.
        predictor: a ``Predictor`` to use instead of loading ``config.model``.
        context: the ZMQ context (default: the process-wide instance).
    """

    def __init__(
        self,
        config: ServeConfig,
        *,
        source: LiveSource | None = None,
        predictor: Predictor | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        self.config = config
        self.predictor = predictor or Predictor(config.model, config.tokenizer, config.device)
        self.window = config.window or self.predictor.spec.n_max
        bad_span = config.window_ms is not None and not config.window_ms > 0  # (NaN too)
        if self.window <= 0 or config.top_k <= 0 or config.stats_interval_s <= 0 or bad_span:
            raise ValueError(
                f"window, window_ms, top_k and stats_interval_s must be positive, got {self.window}, "
                f"{config.window_ms}, {config.top_k}, {config.stats_interval_s}"
            )
        self.source = source or open_source(config.source, speed=config.speed, loop=config.loop)
        self.ring = EventRing(self.window)
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

        self._stop = threading.Event()
        self._new_events = threading.Event()
        self._threads: list[threading.Thread] = []
        self._runner: threading.Thread | None = None
        self._source_done = False
        self._error: BaseException | None = None
        self._sensor: SensorSize | None = None
        self._seq = dict.fromkeys(("hist", "tokens", "pred", "stats"), 0)
        # inference bookkeeping (inference thread only)
        self.frames = 0
        self.skipped_windows = 0
        self.control_malformed = 0
        # (publish time, latency) in monotonic seconds; other threads read it with list() (atomic under the GIL)
        self.latencies: deque[tuple[float, float]] = deque(maxlen=LATENCY_HISTORY)
        self._seen_total = 0
        self._unseen_events = 0
        self._last_window: dict[str, Any] = {}
        self._last_stages: dict[str, float] = {}
        self._stats_mark = (time.monotonic(), 0, 0)  # (time, ring total, frames) at the last stats message
        # replay position (reader thread writes, others read)
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
        """Serve until ``stop()``, the end of a non-looping source, or ``duration_s``; re-raises a source error."""
        duration_s = duration_s if duration_s is not None else self.config.duration_s
        self.predictor.warm_up()
        end = None if duration_s is None else time.monotonic() + duration_s
        self._threads = [
            threading.Thread(target=self._read_source, name="mem-serve-reader", daemon=True),
            threading.Thread(target=self._serve_control, name="mem-serve-control", daemon=True),
        ]
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
            self._pub.close(0)
            self._control.close(0)
        if self._error is not None:
            raise self._error

    # ---- reader thread -------------------------------------------------------------------------------------

    def _read_source(self) -> None:
        last_t: int | None = None
        try:
            for batch in self.source:
                if self._stop.is_set():
                    break
                if len(batch) == 0:
                    continue
                arrival = time.monotonic()
                sensor = SensorSize(*self.source.sensor)
                if sensor != self._sensor or (last_t is not None and int(batch["t"][0]) < last_t):
                    self.ring.clear()  # a new stream (another sensor or a restarted publisher)
                    self._sensor = sensor
                last_t = int(batch["t"][-1])
                self.ring.push(batch, arrival)
                self._track_replay(batch)
                if self.recorder is not None:
                    self.recorder.append(batch, sensor, self.source.metadata)
                self._new_events.set()
        except Exception as exc:  # reported by run() in the main thread
            self._error = exc
            self._stop.set()
        finally:
            self._source_done = True
            self._new_events.set()

    def _track_replay(self, batch: np.ndarray) -> None:
        if not hasattr(self.source, "t_last"):
            return
        duration = int(self.source.t_last) - int(self.source.t_first) + 1  # loops continue 1 us after the end
        if self._replay_base_us is not None:  # first batch after the start or a seek
            self._replay_ref_us = int(batch["t"][0]) - self._replay_base_us
            self._replay_base_us = None
        self.replay_position_us = (int(batch["t"][-1]) - self._replay_ref_us) % duration

    # ---- inference loop ------------------------------------------------------------------------------------

    def _inference_loop(self, end: float | None) -> None:
        interval = self.config.stats_interval_s
        next_stats = time.monotonic() + interval
        while not self._stop.is_set():
            now = time.monotonic()
            if end is not None and now >= end:
                break
            wait = next_stats - now if end is None else min(next_stats, end) - now
            if self._new_events.wait(max(wait, 0.0)):
                self._new_events.clear()
                if self.ring.total != self._seen_total:
                    self._infer_and_publish()
                elif self._source_done:
                    break
            if time.monotonic() >= next_stats:
                self._publish_stats()
                next_stats = max(next_stats + interval, time.monotonic())
        self._publish_stats()

    def _infer_and_publish(self) -> None:
        snap = self.ring.snapshot(self.window)
        sensor = self._sensor
        new_events = snap.total - self._seen_total
        self._seen_total = snap.total
        if len(snap.events) == 0 or sensor is None:
            return
        # events that arrived but never fell inside a window: whole windows of them are "skipped"
        self._unseen_events += max(0, new_events - len(snap.events))
        self.skipped_windows = self._unseen_events // self.window
        events = snap.events
        if self.config.window_ms is not None:  # live sources keep time monotonic, so the newest span is a suffix
            t = events["t"]
            events = events[np.searchsorted(t, t[-1] - round(self.config.window_ms * 1000), side="right") :]
        out = self.predictor(events, sensor)
        self.frames += 1
        t = events["t"]
        wall_arrival = time.time() - (time.monotonic() - snap.arrival)
        self._last_window = {"events": len(events), "t_first_us": int(t[0]), "t_last_us": int(t[-1])}
        common = {
            "session": self.session,
            "frame": self.frames,
            "t_arrival": wall_arrival,
            "window": self._last_window,
            "sensor": [sensor.height, sensor.width],
        }
        start = time.perf_counter()
        self._send("hist", {"hist": out.hist}, **common)
        if out.tokens is not None:
            self._send(
                "tokens", {"tokens": out.tokens}, num_tokens=self.predictor.tokenizer.config.num_tokens, **common
            )
        arrays, fields = self._prediction(out)
        now = time.monotonic()
        self._send("pred", arrays, latency_ms=(now - snap.arrival) * 1e3, **fields, **common)
        self.latencies.append((now, now - snap.arrival))
        self._last_stages = {**out.stages_ms, "publish": (time.perf_counter() - start) * 1e3}

    def _prediction(self, out: Output) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        classes = self.predictor.classes
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
            "task": self.predictor.task,
            "source": self.source_state(),
            "recording": self.recorder.state() if self.recorder is not None else None,
            "control": self.control_endpoint,
        }

    def _publish_stats(self) -> None:
        self._send("stats", None, **self.stats())

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
        except (ControlError, RecorderError, ValueError, OSError) as exc:
            return {"command": command, "ok": False, "error": str(exc)[:MAX_TEXT], "state": self.control_state()}
        return {"command": command, "ok": True, "error": None, "state": self.control_state()}

    def control_state(self) -> dict[str, Any]:
        """What a client needs to draw its controls: session, task, classes, source and recording state."""
        return {
            "session": self.session,
            "task": self.predictor.task,
            "classes": self.predictor.classes,
            "token_grid": self.predictor.token_grid,
            "source": self.source_state(),
            "recording": self.recorder.state() if self.recorder is not None else None,
        }

    def _apply_control(self, command: str, args: dict[str, Any]) -> None:
        if command == "state":
            return
        if command in ("play", "pause", "speed", "seek"):
            if not hasattr(self.source, "seek"):
                raise ControlError(f"{command}: the source ({self.source.metadata.get('kind')}) is not a file replay")
            if command == "play":
                self.source.resume()
            elif command == "pause":
                self.source.pause()
            elif command == "speed":
                self.source.speed = args["value"]
            else:
                position = int(args["position_s"] * 1e6)
                self.source.seek(position)
                self._replay_base_us = min(position, int(self.source.t_last) - int(self.source.t_first))
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


def run(config: ServeConfig) -> None:
    """Serve until Ctrl-C (or ``config.duration_s``), printing the endpoints and a final summary."""
    import torch

    torch.set_num_threads(config.threads)
    server = LiveServer(config)
    print(
        f"mem serve: {server.predictor.task} model {config.model} on source {config.source!r}, "
        f"window {server.window} events"
        f"{'' if config.window_ms is None else f' of at most {config.window_ms:g} ms'}\n"
        f"publishing on {server.pub_endpoint}, control on {server.control_endpoint}",
        flush=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        server.stop()
    lat = [x for _, x in server.latencies]
    p95 = f", p95 latency {np.percentile(lat, 95) * 1e3:.1f} ms" if lat else ""
    print(f"mem serve: {server.frames} predictions, {server.skipped_windows} skipped windows{p95}", flush=True)
