"""The pixels of the simulated camera (ESIM-style): between two log-intensity frames, each pixel fires an event
wherever its interpolated log intensity moves one contrast threshold from its reference level, with per-pixel
thresholds, a refractory period and background noise."""

from __future__ import annotations

import numba
import numpy as np

from mem_core.events import EVENT_DTYPE

# Pixel thresholds drawn below this fraction of the nominal threshold are clipped (a zero threshold never settles).
MIN_THRESHOLD_FRACTION = 0.2
NEVER_US = -(2**62)  # the last event time of a pixel that never fired


@numba.njit(cache=True)
def _grown(values, size):
    grown = np.empty(size, values.dtype)
    grown[: values.size] = values
    return grown


@numba.njit(cache=True)
def dvs_events(l0, l1, ref, last_t, c_on, c_off, t0, dt, refractory, noise_pix, noise_t, noise_p):
    """Events of one interval [t0, t0 + dt) between log frames ``l0`` and ``l1`` (H, W), sorted by time.

    Per pixel, in time order: a threshold crossing of the linearly interpolated log intensity moves the
    reference level by one threshold and fires unless the pixel is refractory (then it is swallowed); a noise
    candidate (flat pixel index, sorted by pixel then time) fires with its polarity and resets the reference
    to the current level, unless refractory (then it is dropped). ``ref`` and ``last_t`` (flat, H * W) are
    updated in place. Returns an ``EVENT_DTYPE`` array.
    """
    h, w = l0.shape
    n_noise = noise_pix.size
    cap = 64 + 2 * n_noise  # grown below as events come (most pixels of a step fire none)
    ev_t = np.empty(cap, np.int64)
    ev_x = np.empty(cap, np.uint16)
    ev_y = np.empty(cap, np.uint16)
    ev_p = np.empty(cap, np.uint8)
    m = 0
    j = 0
    t_end = t0 + dt - 1
    next_noise = noise_pix[0] if n_noise else -1  # the pixel of the next noise candidate
    for y in range(h):
        for x in range(w):
            i = y * w + x
            if l0[y, x] == l1[y, x] and i != next_noise:
                continue
            a = float(l0[y, x])
            b = float(l1[y, x])
            step = c_on[i] if b > a else -c_off[i]  # signed distance between crossing levels
            polarity = 1 if b > a else 0
            scale = dt / (b - a) if b != a else 0.0  # us per unit of log intensity
            r = ref[i]
            lt = last_t[i]
            # room for every event this pixel can fire: its crossings, plus one per noise candidate and the crossing
            # each noise reset can add
            room = m + int(abs(b - a) / abs(step)) + 1
            for k in range(j, n_noise):
                if noise_pix[k] != i:
                    break
                room += 2
            if room > cap:
                cap = max(2 * cap, room)
                ev_t, ev_x, ev_y, ev_p = _grown(ev_t, cap), _grown(ev_x, cap), _grown(ev_y, cap), _grown(ev_p, cap)
            while True:
                level = r + step
                crossing = b != a and (level - b) * step <= 0.0
                noise = j < n_noise and noise_pix[j] == i
                if noise and (not crossing or noise_t[j] - t0 <= (level - a) * scale):
                    te = noise_t[j]
                    pol = noise_p[j]
                    j += 1
                    if te - lt < refractory:
                        continue
                    r = a + (b - a) * ((te - t0) / dt)
                elif crossing:
                    te = min(t0 + int((level - a) * scale), t_end)
                    pol = polarity
                    r = level
                    if te - lt < refractory:
                        continue
                else:
                    break
                ev_t[m] = te
                ev_x[m] = x
                ev_y[m] = y
                ev_p[m] = pol
                m += 1
                lt = te
            ref[i] = r
            last_t[i] = lt
            next_noise = noise_pix[j] if j < n_noise else -1
    # Counting sort on the time offset (stable, O(m + dt)).
    start = np.zeros(dt + 1, np.int64)
    for k in range(m):
        start[ev_t[k] - t0 + 1] += 1
    for k in range(dt):
        start[k + 1] += start[k]
    out = np.empty(m, EVENT_DTYPE)
    for k in range(m):
        slot = ev_t[k] - t0
        event = out[start[slot]]
        start[slot] += 1
        event.t = ev_t[k]
        event.x = ev_x[k]
        event.y = ev_y[k]
        event.p = ev_p[k]
    return out
