"""``EventSimulator``: the simulated event camera, a scene that moves and the pixels that watch it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numba
import numpy as np

from mem_core.events import EVENT_DTYPE, SensorSize
from mem_core.simulator.config import SimulatorConfig
from mem_core.simulator.dvs import MIN_THRESHOLD_FRACTION, NEVER_US, dvs_events
from mem_core.simulator.scene import Objects, background, center_bounds, render_scene, spawn_objects


class EventSimulator:
    """A live simulated event camera. Time starts at 0 and only moves forward (``simulate``/``stream``).

    ``object_classes`` (class ids) fixes the scene's objects, bottom to top, overriding ``config.n_objects`` (a
    scene cut then draws new poses for the same classes). The same config (and ``object_classes``) and the same
    sequence of calls give identical events.
    """

    def __init__(self, config: SimulatorConfig | None = None, object_classes: Sequence[int] | None = None) -> None:
        self.config = config if config is not None else SimulatorConfig()
        cfg = self.config
        h, w = cfg.sensor
        bg_seq, threshold_seq, object_seq, class_seq, noise_seq = np.random.SeedSequence(cfg.seed).spawn(5)
        self._class_rng = np.random.default_rng(class_seq)
        self._object_rng = np.random.default_rng(object_seq)
        self._fixed_classes = None
        if object_classes is not None:
            self._fixed_classes = np.asarray(object_classes, dtype=np.int64).reshape(-1)
            bad = self._fixed_classes[(self._fixed_classes < 0) | (self._fixed_classes >= len(cfg.classes))]
            if bad.size:
                raise ValueError(f"object class ids {bad.tolist()} out of range for {len(cfg.classes)} classes")
        self._objects = self._draw_objects()
        self._log_bg = background(cfg.sensor, cfg.texture, np.random.default_rng(bg_seq))
        threshold_rng = np.random.default_rng(threshold_seq)
        floor = MIN_THRESHOLD_FRACTION * cfg.contrast_threshold
        self._c_on = np.maximum(threshold_rng.normal(cfg.contrast_threshold, cfg.threshold_sigma, h * w), floor)
        self._c_off = np.maximum(threshold_rng.normal(cfg.contrast_threshold, cfg.threshold_sigma, h * w), floor)
        self._noise_rng = np.random.default_rng(noise_seq)
        self._t = 0
        self._log = np.empty((h, w), dtype=np.float32)
        self._log_next = np.empty((h, w), dtype=np.float32)
        self._labels = np.empty((h, w), dtype=np.uint8)
        self._render(self._log)
        self._ref = self._log.reshape(-1).astype(np.float64)  # every pixel starts at its current level
        self._last_t = np.full(h * w, NEVER_US, dtype=np.int64)
        self._next_cut = cfg.scene_us if cfg.scene_us else None

    def _draw_objects(self) -> Objects:
        if self._fixed_classes is not None:
            class_id = self._fixed_classes
        else:
            class_id = self._class_rng.integers(0, len(self.config.classes), self.config.n_objects)
        return spawn_objects(class_id, self.config, self._object_rng)

    def _cut(self) -> None:
        """Replace the objects; every pixel's reference level becomes its new level, so the cut fires no events."""
        self._objects = self._draw_objects()
        self._render(self._log)
        self._ref = self._log.reshape(-1).astype(np.float64)
        self._next_cut += self.config.scene_us

    @property
    def sensor(self) -> SensorSize:
        return self.config.sensor

    @property
    def classes(self) -> list[str]:
        """Class names; class id ``k`` is ``classes[k]`` and appears as ``k + 1`` in ``label_mask()``."""
        return list(self.config.classes)

    @property
    def time_us(self) -> int:
        """The current simulation time: every event emitted so far has ``t < time_us``."""
        return self._t

    @property
    def object_classes(self) -> list[int]:
        """Class ids of the objects in the scene, bottom to top."""
        return self._objects.class_id.tolist()

    def label_mask(self) -> np.ndarray:
        """(H, W) uint8 labels of the scene at ``time_us``: 0 = background, ``k + 1`` = class id ``k``."""
        return self._labels.copy()

    def simulate(self, duration_us: int) -> np.ndarray:
        """Advance by ``duration_us`` and return the events of [time_us, time_us + duration_us), sorted."""
        if duration_us < 0:
            raise ValueError(f"duration_us must be >= 0, got {duration_us}")
        end = self._t + int(duration_us)
        parts = []
        while self._t < end:
            if self._next_cut is not None and self._t >= self._next_cut:
                self._cut()
            parts.append(self._advance(end if self._next_cut is None else min(end, self._next_cut)))
        return concatenate(parts)

    def stream(self, duration_us: int | None = None, batch_us: int = 10_000) -> Iterator[np.ndarray]:
        """Consecutive event batches of ``batch_us`` each (the last may be shorter); endless if no duration."""
        if batch_us <= 0:
            raise ValueError(f"batch_us must be > 0, got {batch_us}")
        if duration_us is not None and duration_us < 0:
            raise ValueError(f"duration_us must be >= 0, got {duration_us}")
        end = None if duration_us is None else self._t + int(duration_us)
        while end is None or self._t < end:
            yield self.simulate(batch_us if end is None else min(batch_us, end - self._t))

    def _advance(self, end: int) -> np.ndarray:
        """Move the scene, render it and fire the pixels up to ``end`` in steps of ``step_us`` (the last may be
        shorter): the noise is drawn here, step by step, and the rest runs in one compiled loop."""
        cfg, obj = self.config, self._objects
        starts = np.arange(self._t, end, cfg.step_us, dtype=np.int64)
        dts = np.minimum(starts + cfg.step_us, end) - starts
        noise = [self._draw_noise(int(t0), int(dt)) for t0, dt in zip(starts, dts, strict=True)]
        bounds = np.zeros(len(noise) + 1, dtype=np.int64)
        np.cumsum([pix.size for pix, _, _ in noise], out=bounds[1:])
        pix, t, p = (np.concatenate(column) for column in zip(*noise, strict=True))
        lo, hi = center_bounds(obj.radius, self.sensor)
        events = advance(
            self._log_bg,
            obj.shape_id,
            self._labels_drawn(),
            obj.center,
            obj.velocity,
            obj.angle,
            obj.angular_speed,
            self._looks(),
            lo,
            hi,
            float(cfg.texture),
            self._log,
            self._log_next,
            self._labels,
            self._ref,
            self._last_t,
            self._c_on,
            self._c_off,
            starts,
            dts,
            cfg.refractory_us,
            pix,
            t,
            p,
            bounds,
        )
        if starts.size % 2:  # the last frame rendered is in the other buffer
            self._log, self._log_next = self._log_next, self._log
        self._t = end
        return events

    def _render(self, out_log: np.ndarray) -> None:
        """The scene as it stands into ``out_log`` and the label mask (``render_scene``'s (n, 7) parameters: the
        pose, then ``_looks``)."""
        obj = self._objects
        params = np.concatenate([obj.center, obj.angle[:, None], self._looks()], axis=1)
        render_scene(self._log_bg, obj.shape_id, self._labels_drawn(), params, float(self.config.texture), out_log,
                     self._labels)  # fmt: skip

    def _looks(self) -> np.ndarray:
        """(n, 4) what a step does not change: radius, log brightness, stripe frequency and phase."""
        obj = self._objects
        return np.stack([obj.radius, obj.log_brightness, obj.stripe_freq, obj.stripe_phase], axis=1)

    def _labels_drawn(self) -> np.ndarray:
        """(n,) uint8 the label each object draws in the mask: its class id + 1 (0 is the background)."""
        return (self._objects.class_id + 1).astype(np.uint8)

    def _draw_noise(self, t0: int, dt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Poisson background-noise candidates in [t0, t0 + dt), sorted by pixel then time."""
        h, w = self.sensor
        n = self._noise_rng.poisson(self.config.noise_rate_hz * h * w * dt * 1e-6)
        pix = self._noise_rng.integers(0, h * w, n)  # (no draws at all for n = 0)
        t = t0 + self._noise_rng.integers(0, dt, n)
        p = self._noise_rng.integers(0, 2, n).astype(np.uint8)
        if n < 2:
            return pix, t, p
        order = np.lexsort((t, pix))
        return pix[order], t[order], p[order]


def concatenate(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate ``EVENT_DTYPE`` arrays as raw bytes (numpy joins packed structured arrays field by field, slower)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([np.empty(0, dtype=np.uint8), *(part.view(np.uint8) for part in parts)]).view(EVENT_DTYPE)


@numba.njit(cache=True)
def advance(
    log_bg, shape_id, label, center, velocity, angle, angular_speed, looks, lo, hi, texture,
    log, log_next, labels, ref, last_t, c_on, c_off, starts, dts, refractory, noise_pix, noise_t, noise_p, bounds,
):  # fmt: skip
    """The steps ``starts``/``dts`` of one scene: per step, move the objects (``center``, ``velocity`` and ``angle``
    in place; translation reflects at ``lo``/``hi``, an overshoot of more than one sensor width is clipped), render
    them over ``log_bg`` into the next frame and ``labels``, and fire the pixels between the two frames with the
    step's noise candidates ``bounds[k]:bounds[k + 1]``. ``looks`` is (n, 4): radius, log brightness, stripe
    frequency and phase. The frames alternate between ``log`` and ``log_next``; returns the events, sorted."""
    n = shape_id.size
    params = np.empty((n, 7))
    for j in range(n):  # a loop, not a slice assignment: that compiles numba's shape checks
        for c in range(4):
            params[j, 3 + c] = looks[j, c]
    out = np.empty(1024, EVENT_DTYPE)
    m = 0
    for k in range(starts.size):
        seconds = dts[k] * 1e-6
        for j in range(n):
            for axis in range(2):
                pos = center[j, axis] + velocity[j, axis] * seconds
                if pos > hi[j, axis]:
                    pos = 2 * hi[j, axis] - pos
                    velocity[j, axis] = -velocity[j, axis]
                if pos < lo[j, axis]:
                    pos = 2 * lo[j, axis] - pos
                    velocity[j, axis] = -velocity[j, axis]
                center[j, axis] = min(max(pos, lo[j, axis]), hi[j, axis])
            angle[j] = angle[j] + angular_speed[j] * seconds
            params[j, 0], params[j, 1], params[j, 2] = center[j, 0], center[j, 1], angle[j]
        render_scene(log_bg, shape_id, label, params, texture, log_next, labels)
        a, b = bounds[k], bounds[k + 1]
        events = dvs_events(
            log, log_next, ref, last_t, c_on, c_off, starts[k], dts[k], refractory,
            noise_pix[a:b], noise_t[a:b], noise_p[a:b],
        )  # fmt: skip
        if m + events.size > out.size:
            grown = np.empty(max(2 * out.size, m + events.size), EVENT_DTYPE)
            grown[:m] = out[:m]
            out = grown
        out[m : m + events.size] = events
        m += events.size
        log, log_next = log_next, log
    return out[:m]
