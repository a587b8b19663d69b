"""A subscriber's count of the messages it received and missed, per topic, across publisher restarts."""

from __future__ import annotations

from typing import Any

from mem_core.protocol.framing import Message


class SeqTracker:
    """A subscriber's bookkeeping of ``seq`` per topic: messages received, missed (gaps) and publisher restarts.

    A publisher restart shows as a new ``session`` header field or a ``seq`` that does not increase; the count
    starts again from that message without counting a gap.
    """

    def __init__(self) -> None:
        self.received = 0
        self.missed = 0
        self.restarts = 0
        self._session: Any = None
        self._last: dict[str, int] = {}  # topic -> last seq of the current session

    def update(self, message: Message) -> int:
        """Record ``message``; returns how many messages of its topic were missed just before it."""
        self.received += 1
        session, seq = message.header.get("session"), message.seq
        if self._last and session != self._session:
            self.restarts += 1
            self._last.clear()
        self._session = session
        previous = self._last.get(message.topic)
        if previous is not None and seq <= previous:
            self.restarts += 1
            self._last.clear()
            previous = None
        self._last[message.topic] = seq
        if previous is None:
            return 0
        gap = seq - previous - 1
        self.missed += gap
        return gap
