"""What ``mem serve`` publishes for each window: the fields every message of the window carries, and the model's
messages (``hist``, ``tokens``, ``pred``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from mem_core.events import SensorSize

if TYPE_CHECKING:  # torch is imported by the loader thread, not at start
    from app.live.accumulation import Window
    from app.live.labelling import RecentWindows
    from app.live.replay_control import ReplayController
    from app.live.sockets import Publisher
    from app.live.stats import LoopStats
    from mem_core.inference import Predictor
    from mem_core.onnx_inference import OnnxPredictor
    from mem_core.prediction import Output


class WindowPublisher:
    """Publishes each window of one server session on ``publisher``, counting in ``counts``; ``windows`` hold what a
    capture may name (their prediction noted here), ``replay`` says where in a replay a window lies (None: no replay),
    ``top_k`` classes go into a ``pred``."""

    def __init__(
        self,
        publisher: Publisher,
        counts: LoopStats,
        windows: RecentWindows,
        replay: ReplayController | None,
        session: str,
        top_k: int,
    ) -> None:
        self.publisher, self.counts, self.windows, self.replay = publisher, counts, windows, replay
        self.session, self.top_k = session, top_k

    def frame_fields(self, events: np.ndarray, sensor: SensorSize, arrival: float) -> dict[str, Any]:
        """The fields every message of one window carries."""
        t = events["t"]
        window = {"events": len(events), "t_first_us": int(t[0]), "t_last_us": int(t[-1])}
        if self.replay is not None:  # where in the replayed events the newest event lies
            window["position_s"] = self.replay.file_position_us(int(t[-1])) / 1e6
        self.counts.last_window = window
        return {
            "session": self.session,
            "frame": self.counts.windows,
            "t_arrival": time.time() - (time.monotonic() - arrival),
            "window": window,
            "sensor": [sensor.height, sensor.width],
        }

    def capture_info(self, source: dict[str, Any], served: Window) -> dict[str, Any]:
        """What a capture of the newest window records besides its events and the prediction: the ``source``'s
        metadata and the window (kept for every published window, so it stays cheap; the ground truth is looked up
        at capture), and the window the model is ``served`` on (what Train's export serves its model on)."""
        return {
            **{k: source[k] for k in ("kind", "serial") if k in source},
            "window": self.counts.last_window,
            "served_window": {"events": served.events, "ms": served.ms},
        }

    def sensor(self, view: np.ndarray, binning: int, input_region: list[float], common: dict[str, Any]) -> None:
        self.publisher.send("sensor", {"sensor": view}, binning=binning, input_region=input_region, **common)

    def prediction(
        self,
        predictor: Predictor | OnnxPredictor,
        version: int,
        out: Output,
        common: dict[str, Any],
        arrival: float,
        record_latency: bool,
    ) -> None:
        """The model's messages of one window: ``hist``, ``tokens`` where it has a tokenizer, and ``pred``."""
        self.counts.frames += 1
        self.publisher.send("hist", {"hist": out.hist}, **common)
        if out.tokens is not None:
            self.publisher.send("tokens", {"tokens": out.tokens}, num_tokens=predictor.num_tokens, **common)
        arrays, fields = prediction_fields(predictor, out, self.top_k)
        top1 = {"prediction": fields["top_k"][0]["name"]} if out.probs is not None else {}
        self.windows.update(common["frame"], model_version=version, **top1)
        now = time.monotonic()
        self.publisher.send("pred", arrays, latency_ms=(now - arrival) * 1e3, model_version=version, **fields, **common)
        if record_latency:  # a refresh of an old window (after a window change) says nothing about latency
            self.counts.latencies.append((now, now - arrival))

    def stats(self, fields: dict[str, Any]) -> None:
        self.publisher.send("stats", None, **fields)


def prediction_fields(
    predictor: Predictor | OnnxPredictor, out: Output, top_k: int
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and fields of a ``pred`` message: the probabilities and the ``top_k`` classes, or the mask."""
    classes = predictor.classes
    if out.probs is not None:
        order = np.argsort(-out.probs)[:top_k]
        top = [{"id": int(i), "name": classes[i], "prob": float(out.probs[i])} for i in order]
        return {"probs": out.probs}, {"task": "classification", "classes": classes, "top_k": top}
    return {"mask": out.mask}, {"task": "segmentation", "classes": classes}
