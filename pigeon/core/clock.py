"""Clock protocol. Pure code takes `now` (seconds since the epoch, float); only pigeon.node reads
a real clock. Tests use pigeon.testing.SimClock."""

from __future__ import annotations

import typing


class Clock(typing.Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...
