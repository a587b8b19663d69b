"""Prophesee EVT 2.0 and EVT 3.0 word decoders (numba), following the public format descriptions.

EVT 2.0: 32-bit little-endian words, type in bits 31..28. ``CD_OFF``/``CD_ON`` (0/1) carry the 6 low time
bits (27..22), x (21..11) and y (10..0); ``EVT_TIME_HIGH`` (8) carries time bits 33..6. Other types are skipped.

EVT 3.0: 16-bit little-endian words, type in bits 15..12, decoded against a running state: ``EVT_ADDR_Y`` (0)
sets y, ``EVT_ADDR_X`` (2) is one event at x with polarity bit 11, ``VECT_BASE_X`` (3) sets the base x and
polarity of the following ``VECT_12`` (4) / ``VECT_8`` (5) bit masks (bit i = an event at base + i; the base
then advances by 12 / 8), ``EVT_TIME_LOW`` (6) and ``EVT_TIME_HIGH`` (8) hold the low and high 12 bits of a
24-bit microsecond time base. Other types are skipped.

Both time bases wrap (2^34 us for EVT 2.0, 2^24 us for EVT 3.0): a time-high that goes back by more than half
its range is counted as a wrap, so timestamps grow without bound; one that goes back by less is no wrap but
damage (random words do it at every other time-high), counted and refused by the reader. Events before the
first time-high word have no time yet and are dropped, as Prophesee's decoders do.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from mem_core.events import EVENT_DTYPE

EVT3_MAX_X = 2047
EVT2_HIGH_HALF = 1 << 27  # half the range of EVT 2.0's 28-bit time-high
EVT3_HIGH_HALF = 1 << 11  # half the range of EVT 3.0's 12-bit time-high


class Decoded(NamedTuple):
    """Events in stream order and the words no camera writes: vector events beyond x = 2047 (EVT 3.0) and
    time-high words that step back without wrapping."""

    events: np.ndarray
    beyond_x: int
    time_back: int


@numba.njit(cache=True, nogil=True)
def _evt2(words, out, fill):
    n = 0
    time_high = -1
    loops = 0
    back = 0
    for i in range(words.size):
        w = np.int64(words[i])
        kind = w >> 28
        if kind == 0x8:
            high = w & 0x0FFFFFFF
            if high < time_high:
                if time_high - high > EVT2_HIGH_HALF:
                    loops += 1
                else:
                    back += 1
            time_high = high
        elif kind <= 0x1 and time_high >= 0:
            if fill:
                out[n].t = (loops << 34) | (time_high << 6) | ((w >> 22) & 0x3F)
                out[n].x = (w >> 11) & 0x7FF
                out[n].y = w & 0x7FF
                out[n].p = kind
            n += 1
    return n, 0, back


@numba.njit(cache=True, nogil=True)
def _evt3(words, out, fill):
    n = 0
    bad = 0
    y = 0
    base_x = 0
    pol = 0
    time_low = 0
    time_high = -1
    loops = 0
    back = 0
    for i in range(words.size):
        w = np.int64(words[i])
        kind = w >> 12
        if kind == 0x8:
            high = w & 0xFFF
            if high < time_high:
                if time_high - high > EVT3_HIGH_HALF:
                    loops += 1
                else:
                    back += 1
            time_high = high
        elif kind == 0x6:
            time_low = w & 0xFFF
        elif kind == 0x0:
            y = w & 0x7FF
        elif kind == 0x3:
            base_x = w & 0x7FF
            pol = (w >> 11) & 1
        elif kind == 0x2 or kind == 0x4 or kind == 0x5:
            t = (loops << 24) | (time_high << 12) | time_low
            if kind == 0x2:
                if time_high >= 0:
                    if fill:
                        out[n].t = t
                        out[n].x = w & 0x7FF
                        out[n].y = y
                        out[n].p = (w >> 11) & 1
                    n += 1
                continue
            width = 12 if kind == 0x4 else 8
            for b in range(width):
                if (w >> b) & 1 and time_high >= 0:
                    x = base_x + b
                    if x > EVT3_MAX_X:
                        bad += 1
                    else:
                        if fill:
                            out[n].t = t
                            out[n].x = x
                            out[n].y = y
                            out[n].p = pol
                        n += 1
            base_x += width
    return n, bad, back


def decode_evt2(words: np.ndarray) -> Decoded:
    """EVT 2.0 ``uint32`` words -> events in stream order (``beyond_x`` is always 0)."""
    return _decode(_evt2, words)


def decode_evt3(words: np.ndarray) -> Decoded:
    """EVT 3.0 ``uint16`` words -> events in stream order and the counts of damaged words."""
    return _decode(_evt3, words)


def _decode(kernel, words: np.ndarray) -> Decoded:
    # Two passes (count, then fill) size the output exactly: no over-allocation for 12-event vectors.
    dummy = np.empty(0, dtype=EVENT_DTYPE)
    n, _, _ = kernel(words, dummy, False)
    out = np.empty(n, dtype=EVENT_DTYPE)
    _, beyond_x, time_back = kernel(words, out, True)
    return Decoded(out, beyond_x, time_back)
