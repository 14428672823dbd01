"""Figures the hot paths feed at the cost of a batch, not a message (for /metrics). Owns the rules:

  * ack latency (Cloud Monitoring's subscription/ack_latencies: from handing a message out to its ack) is
    sampled: the first message of every `every`-th delivered batch is remembered with its time (at most `held_max`
    per subscription, the oldest forgotten), and its ack, if it comes, is observed — so a redelivered or
    expired sample is simply never observed, and acks cost a lookup only while samples are held;
  * the hottest ordering keys are counted per publish request (one key per request) with the space-saving
    algorithm: each topic keeps `keys_max` counters, a new key takes the smallest one's place and count, so a
    key's count is an overestimate by at most that count, and keys published often are never dropped."""

from __future__ import annotations

import heapq

from pigeon.core.histogram import Histogram


class AckLatency:
    def __init__(self, every: int = 16, held_max: int = 64):
        self.every, self.held_max = every, held_max
        self.histogram = Histogram()
        self._held: dict[int, dict[int, float]] = {}  # subscription uid → {message number: handed out at}
        self._batches = 0

    def delivered(self, sub_uid: int, first_num: int, now: float) -> None:
        self._batches += 1
        if self._batches % self.every:
            return
        held = self._held.get(sub_uid)
        if held is None:
            held = self._held[sub_uid] = {}
        elif len(held) >= self.held_max:
            del held[next(iter(held))]
        held[first_num] = now

    def acked(self, sub_uid: int, nums, now: float) -> None:
        held = self._held.get(sub_uid)
        if not held:
            return
        for num in held.keys() & set(nums):
            self.histogram.observe(now - held.pop(num))
        if not held:
            del self._held[sub_uid]

    def prune(self, live) -> None:
        """Forget the samples of subscriptions no longer in `live` (uids)."""
        for uid in [u for u in self._held if u not in live]:
            del self._held[uid]


class HotKeys:
    def __init__(self, keys_max: int = 10):
        self.keys_max = keys_max
        self._topics: dict[str, dict[str, int]] = {}  # topic name → {ordering key: messages (estimate)}

    def published(self, topic: str, key: str, count: int) -> None:
        counts = self._topics.get(topic)
        if counts is None:
            counts = self._topics[topic] = {}
        if key in counts:
            counts[key] += count
        elif len(counts) < self.keys_max:
            counts[key] = count
        else:
            smallest = min(counts, key=counts.__getitem__)
            counts[key] = counts.pop(smallest) + count

    def prune(self, live) -> None:
        """Forget the counts of topics no longer in `live` (names)."""
        for name in [t for t in self._topics if t not in live]:
            del self._topics[name]

    def hottest(self, n: int) -> list[tuple[str, str, int]]:
        """The `n` (topic, key, messages) with the most messages over every topic."""
        return heapq.nlargest(n, ((t, k, c) for t, counts in self._topics.items() for k, c in counts.items()),
                              key=lambda x: x[2])
