"""Labelled samples of the simulated camera: one object of a class (and distractors) over a short span, with its
label mask; what the ``sim`` dataset is made of."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mem_core.simulator.camera import EventSimulator, concatenate
from mem_core.simulator.config import SimulatorConfig


def make_sample(
    class_id: int,
    rng: np.random.Generator,
    config: SimulatorConfig | None = None,
    duration_us: int = 50_000,
    distractors: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """One labelled sample: the events of a scene with one object of ``class_id`` (on top) and ``distractors``
    objects of other classes (if there are any), and the scene's (H, W) label mask at the middle of the sample.

    The scene (pose, speed, background, noise) is drawn from ``rng``; ``config.seed`` and ``n_objects`` are ignored.
    """
    cfg = config if config is not None else SimulatorConfig()
    if not 0 <= class_id < len(cfg.classes):
        raise ValueError(f"class_id {class_id} out of range for {len(cfg.classes)} classes {cfg.classes}")
    if distractors < 0:
        raise ValueError(f"distractors must be >= 0, got {distractors}")
    others = [k for k in range(len(cfg.classes)) if k != class_id] or [class_id]
    objects = [*rng.choice(others, distractors).tolist(), class_id]
    sim = EventSimulator(replace(cfg, seed=int(rng.integers(2**63))), object_classes=objects)
    first = sim.simulate(duration_us // 2)
    mask = sim.label_mask()
    return concatenate([first, sim.simulate(duration_us - duration_us // 2)]), mask
