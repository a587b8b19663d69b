"""A simulated event camera: moving shapes -> log-intensity frames -> DVS events, with per-pixel labels.

The scene is a static background (flat or textured) with ``n_objects`` anti-aliased shapes (``SHAPES``) that
translate, rotate and bounce off the sensor borders. Every ``step_us`` the scene is rendered into a
log-intensity frame; between two frames each pixel's log intensity is interpolated linearly, and an event is
emitted wherever it moves one contrast threshold away from the level at that pixel's last event (ESIM-style),
at the interpolated crossing time. Pixels have their own ON/OFF thresholds (Gaussian mismatch around
``contrast_threshold``), a refractory period, and Poisson background noise. Output is ``EVENT_DTYPE``
sorted by time. With ``scene_us`` the scene cuts to freshly drawn objects at every multiple of ``scene_us``, so a
long recording shows every class; a cut resets each pixel's reference level, so it fires no burst of events.

Labels: ``EventSimulator.label_mask()`` is ``(H, W) uint8`` with 0 = background and ``k + 1`` for class id ``k``
(an index into ``classes``). ``make_sample`` gives labelled, reproducible training samples.

The modules, by job: ``config`` (``SimulatorConfig``, light: no numba), ``scene`` (objects, background, the render
kernel), ``dvs`` (the pixel kernel that turns two log frames into events), ``camera`` (``EventSimulator``),
``samples`` (labelled samples for the ``sim`` dataset). Import from ``mem_core.simulator``.
"""

from mem_core.simulator.camera import EventSimulator
from mem_core.simulator.config import (
    BACKGROUND_LABEL,
    DEFAULT_SENSOR,
    SHAPES,
    SimulatorConfig,
    fast_config,
    task_config,
)
from mem_core.simulator.samples import make_sample

__all__ = [
    "BACKGROUND_LABEL",
    "DEFAULT_SENSOR",
    "SHAPES",
    "EventSimulator",
    "SimulatorConfig",
    "fast_config",
    "make_sample",
    "task_config",
]
