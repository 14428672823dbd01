"""Free space on the journal's disk. Owns the rule: a publish is written only while more than the reserve is
free; deliveries, acks, modacks, admin changes and checkpoints may use the reserve, so consumers can drain a
backlog — which frees whole segments — when the disk has filled up. The reserve is a share of the filesystem
within fixed bounds (core.limits). Free space is looked up at most every limits.disk_free_check_s."""

from __future__ import annotations

from dataclasses import dataclass

from pigeon.core import limits
from pigeon.core.errors import ResourceExhausted
from pigeon.storage.disk import Disk


def reserve_for(total_bytes: int) -> int:
    share = int(total_bytes * limits.disk_reserve_fraction)
    return min(max(share, limits.disk_reserve_bytes_min), limits.disk_reserve_bytes_max)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True, slots=True)
class SpaceStats:
    free_bytes: int
    total_bytes: int
    reserve_bytes: int
    full: bool  # publishes are refused now
    refused: int  # publishes refused since start
    episodes: int  # times the disk filled up since start


class SpaceWatch:
    def __init__(self, disk: Disk, directory: str):
        self.disk, self.dir = disk, directory
        self.free = self.total = 0
        self.reserve = limits.disk_reserve_bytes_min
        self.full = False
        self.refused = self.episodes = 0
        self._checked = float("-inf")
        self._tail = 0  # the journal's end at the last look

    def look(self, now: float, tail: int) -> bool | None:
        """Refresh the free space if it is older than the check interval (`tail`: the journal's end now, so
        what is appended until the next look counts against it). Returns True when the disk just became full,
        False when it just stopped being full, None otherwise."""
        if now - self._checked < limits.disk_free_check_s:
            return None
        self._checked = now
        self._tail = tail
        self.free, self.total = self.disk.free_space(self.dir)
        self.reserve = reserve_for(self.total)
        full = self.free <= self.reserve
        if full == self.full:
            return None
        self.full = full
        self.episodes += full
        return full

    def stale(self) -> None:
        """Look up the free space at the next `look`, whenever it was last looked up."""
        self._checked = float("-inf")

    def check_publish(self, tail: int) -> None:
        """Refuse a publish (RESOURCE_EXHAUSTED) while the disk is at its high-water mark. `tail`: the journal's
        end now — what was appended since the last look is (or soon will be) on the disk too."""
        free = self.free - (tail - self._tail)
        if self.full or free <= self.reserve:
            self.refused += 1
            raise ResourceExhausted(
                f"The disk of {self.dir} is full: {_mib(max(0, free))} free, "
                f"{_mib(self.reserve)} kept in reserve for deliveries, acks and checkpoints. Publishing resumes "
                "once consumers have acknowledged the backlog (old log segments are then deleted) or space is freed.")

    def statistics(self) -> SpaceStats:
        return SpaceStats(self.free, self.total, self.reserve, self.full, self.refused, self.episodes)
