"""The server's state as ``stats`` messages and control replies carry it (``mem_core.protocol.state`` checks it
on the other side): the loop's counts, the window, the source and its replay, the recording, labelling and the
served model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.live.accumulation import Accumulation
    from app.live.control import ControlHandler
    from app.live.labelling import LabelDesk
    from app.live.model_slot import ModelSlot
    from app.live.replay_control import ReplayController
    from app.live.stats import LoopStats
    from recorders.base import LiveSource
    from recorders.live_recorder import LiveRecorder


class ServerState:
    """The server's report, read from the parts it is made of (each read when a report is asked for)."""

    def __init__(
        self,
        *,
        session: str,
        counts: LoopStats,
        accumulation: Accumulation,
        control: ControlHandler,
        model: ModelSlot,
        labelling: LabelDesk,
        source: LiveSource,
        replay: ReplayController | None,
        recorder: LiveRecorder | None,
        control_endpoint: str,
    ) -> None:
        self.session, self.counts, self.accumulation, self.control = session, counts, accumulation, control
        self.model, self.labelling, self.source, self.replay = model, labelling, source, replay
        self.recorder, self.control_endpoint = recorder, control_endpoint

    def stats(self) -> dict[str, Any]:
        """The ``stats`` message fields (rates over the time since the previous call)."""
        return {
            "session": self.session,
            **self.counts.report(self.accumulation.ring.total),
            "malformed": self.control.malformed + getattr(self.source, "malformed", 0),
            **self._settings(),
            "source": self.source_state(),
            "recording": self.recorder.state() if self.recorder is not None else None,
            "control": self.control_endpoint,
        }

    def _settings(self) -> dict[str, Any]:
        """``commands`` carried out (read first: what follows is at least that recent), ``model_state``
        ("loading" / "ready" / "none"), the ``task`` once known, the window (``accumulation``), labelling and the
        served ``model``."""
        commands = self.control.carried_out
        predictor = self.model.predictor
        model_state = "ready" if predictor is not None else "loading" if self.model.loading else "none"
        state = {"commands": commands, "model_state": model_state, "accumulation": self.accumulation.state()}
        if predictor is not None:
            state["task"] = predictor.task
        # a capture labels a whole window: a classifier's classes are the names to offer, a segmenter's are not
        offered = predictor.classes if predictor is not None and predictor.task == "classification" else None
        state["labels"], state["training"] = self.labelling.state(offered)
        state["model"] = self.model.state()
        return state

    def source_state(self) -> dict[str, Any]:
        """Source metadata (kind, model, serial, ...) plus the replay state for replays (a file, a corpus)."""
        meta = self.source.metadata
        state = {k: meta[k] for k in ("kind", "model", "serial", "height", "width") if k in meta}
        state["recordable"] = self.recorder is not None
        if self.replay is not None:
            state["replay"] = self.replay.state()
        return state

    def control_state(self) -> dict[str, Any]:
        """What a client needs to draw its controls: session, model state, task, classes, window, source and
        recording state (task, classes and token grid once the model is loaded)."""
        state: dict[str, Any] = {"session": self.session, **self._settings()}
        predictor = self.model.predictor
        if predictor is not None:
            state.update(classes=predictor.classes, token_grid=predictor.token_grid)
        recording = self.recorder.state() if self.recorder is not None else None
        state.update(source=self.source_state(), recording=recording)
        return state
