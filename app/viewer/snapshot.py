"""What the viewer window shows, as data (``view_state``: JSON written beside a snapshot, read by tests and the
bench), and the snapshot itself (``save_snapshot``: the window as PNG plus that JSON)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from PySide6 import QtCore, QtWidgets


class Snapshots:
    """Mixed into ``ViewerWindow`` (a ``QMainWindow``): reads its widgets, its client and what it last drew."""

    def view_state(self) -> dict[str, Any]:
        """What the window shows, as JSON-able data (written next to snapshots; used by tests and the bench)."""
        view = self.view
        hist = None
        if view.shape is not None and view.picture() is not None:
            rect = view.mapFromScene(view.image.sceneBoundingRect()).boundingRect()
            top_left = view.viewport().mapTo(self, rect.topLeft())
            hist = {
                "view": "sensor" if view.showing_sensor else "input",
                "shape": list(view.shape),
                "sensor": list(view.sensor.sensor) if view.sensor is not None else None,
                "lit_fraction": float((np.asarray(view.picture()[0]).max(axis=0) > 0).mean()),  # px with events
                "rect": [top_left.x(), top_left.y(), rect.width(), rect.height()],
            }
        client = self.client
        return {
            "endpoint": client.endpoint if client else None,
            "link": self.link_text(),
            "notice": self.view.notice.text() if self.view.notice.isVisibleTo(self) else None,
            "stale": self.view.stale,
            "model_state": self.last_stats.get("model_state"),
            "session": self.session,
            "frames_shown": self.frames_shown,
            "display_fps": self.display_fps,
            **self._activity(),
            "histogram": hist,
            "input": None if view.hist is None else list(view.hist.shape[1:]),
            "tokens": None if view.tokens is None else {"grid": list(view.tokens.shape), "shown": view.show_tokens},
            "prediction": self.last_pred,
            "stats": {
                k: self.last_stats.get(k)
                for k in ("events_per_s", "window_events", "window_ms", "latency_ms", "skipped_windows", "predictions")
            },
            "messages": {
                "received": client.tracker.received if client else 0,
                "missed": client.tracker.missed if client else 0,
                "malformed": (client.malformed if client else 0) + self.bad_messages,
                "restarts": client.tracker.restarts if client else 0,
            },
            "controls": {
                "replay": self.replay.isVisibleTo(self),
                "record": self.record.isVisibleTo(self),
                "accumulation": self.accumulation.isVisibleTo(self),
                "labels": self.labels.isVisibleTo(self),
            },
            "labels": {
                "classes": self.labels.classes,
                "counts": self.labels.counts,
                "captures": self.labels.captures,
                "flashes": self.flashes,
                "status": self.labels.status.text(),
                "error": self.labels.error.text(),
            },
            "training": self.labels.training,
            "model": {  # the server's model, and the version of the newest prediction
                **(self.last_stats.get("model") or {}),
                "version": self.model_version,
                "switches": self.model_switches,
            },
        }

    def _activity(self) -> dict[str, float]:
        """Seconds since the first message, and the GUI thread's CPU time over that span as a fraction."""
        if self.first_message is None:
            return {"elapsed_s": 0.0, "gui_busy_fraction": 0.0}
        wall0, cpu0 = self.first_message
        elapsed = max(time.monotonic() - wall0, 1e-9)
        return {"elapsed_s": elapsed, "gui_busy_fraction": (time.thread_time() - cpu0) / elapsed}

    def save_snapshot(self, path: Path | str) -> dict[str, Any]:
        """Save the window as PNG at ``path`` and ``view_state()`` as JSON beside it (same name, ``.json``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.update_status()
        # lay out what changed (a longer status text) before the picture is taken, not at the next event loop turn
        QtWidgets.QApplication.sendPostedEvents(None, QtCore.QEvent.Type.LayoutRequest)
        if not self.grab().save(str(path)):
            raise OSError(f"could not write the snapshot {path}")
        state = self.view_state()
        path.with_suffix(".json").write_text(json.dumps(state, indent=2) + "\n")
        return state
