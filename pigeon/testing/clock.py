"""A simulated clock that only moves when told to."""

from __future__ import annotations


class SimClock:
    def __init__(self, start: float = 1_700_000_000.0):
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        assert seconds >= 0
        self._now += seconds
        return self._now
