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
    # Upper bound on events: crossings of a monotone segment, plus one extra per noise reset.
    cap = 2 * n_noise
    for y in range(h):
        for x in range(w):
            d = float(l1[y, x]) - float(l0[y, x])
            if d > 0.0:
                cap += int(d / c_on[y * w + x]) + 1
            elif d < 0.0:
                cap += int(-d / c_off[y * w + x]) + 1
    ev_t = np.empty(cap, np.int64)
    ev_x = np.empty(cap, np.uint16)
    ev_y = np.empty(cap, np.uint16)
    ev_p = np.empty(cap, np.uint8)
    m = 0
    j = 0
    t_end = t0 + dt - 1
    for y in range(h):
        for x in range(w):
            i = y * w + x
            a = float(l0[y, x])
            b = float(l1[y, x])
            if a == b and not (j < n_noise and noise_pix[j] == i):
                continue
            step = c_on[i] if b > a else -c_off[i]  # signed distance between crossing levels
            polarity = 1 if b > a else 0
            scale = dt / (b - a) if b != a else 0.0  # us per unit of log intensity
            r = ref[i]
            lt = last_t[i]
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
