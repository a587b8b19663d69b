"""How the app writes quantities for people: the viewer's status bar and ``mem inspect`` say them the same way."""

from __future__ import annotations


def event_rate(per_s: float) -> str:
    """``2.50 Mev/s``, ``35.2 kev/s``, ``120 ev/s``."""
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} Mev/s"
    return f"{per_s / 1e3:.1f} kev/s" if per_s >= 1e3 else f"{per_s:.0f} ev/s"
