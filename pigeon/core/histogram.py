"""A fixed-bucket histogram of plain counts: what the hot paths record (an add and a bisect, no lock, no metrics
library) and the metrics endpoint exports as a Prometheus histogram."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

LATENCY_BOUNDS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS_S):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> "HistogramStats":
        cumulative, total = [], 0
        for c in self.counts[:-1]:
            total += c
            cumulative.append(total)
        return HistogramStats(self.bounds, tuple(cumulative), self.sum, self.count)


@dataclass(frozen=True, slots=True)
class HistogramStats:
    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]  # observations at or under each bound
    sum: float
    count: int
