"""broker.delay: the activation index of a topic. Owns the rule: nothing is delivered before its activation
time, and scheduled messages are handed out in activation order (then publish order), also when that time
lies in the past.

Compact: one sorted array of 8-byte entries per activation second (entry = ms-within-second << 54 |
message number), no object per message. A subscription walks the index with a mark, the last (second,
entry) it passed; an entry added behind some subscription's mark is handed to that subscription directly
(`late`)."""

from __future__ import annotations

import bisect
from array import array

_NUM_BITS = 54
_NUM_MASK = (1 << _NUM_BITS) - 1


class Schedule:
    __slots__ = ("buckets", "secs", "count")

    def __init__(self):
        self.buckets: dict[int, array] = {}  # second → packed entries, in insertion order
        self.secs: list[int] = []  # sorted keys of `buckets`
        self.count = 0

    def add(self, activate_ms: int, num: int) -> int:
        """Insert one entry; returns its second."""
        assert 0 <= num <= _NUM_MASK
        sec, ms = divmod(activate_ms, 1000)
        b = self.buckets.get(sec)
        if b is None:
            b = self.buckets[sec] = array("Q")
            bisect.insort(self.secs, sec)
        e = (ms << _NUM_BITS) | num
        if not b or b[-1] < e:
            b.append(e)
        else:
            bisect.insort(b, e)
        self.count += 1
        return sec

    @staticmethod
    def position(activate_ms: int, num: int) -> tuple[int, int]:
        """The mark an entry would have: compare with a subscription's mark to tell whether it is behind."""
        sec, ms = divmod(activate_ms, 1000)
        return sec, (ms << _NUM_BITS) | num

    def walk(self, mark: tuple[int, int], now_ms: int):
        """Yield (activate_ms, num, new mark) for the due entries after `mark`, in order."""
        sec, last = mark
        now_sec = now_ms // 1000
        i = bisect.bisect_left(self.secs, sec)
        while i < len(self.secs):
            s = self.secs[i]
            if s > now_sec:
                return
            b = self.buckets[s]
            j = bisect.bisect_right(b, last) if s == sec else 0
            while j < len(b):
                e = b[j]
                at = s * 1000 + (e >> _NUM_BITS)
                if at > now_ms:  # same second, later millisecond: wait
                    return
                j += 1
                yield at, e & _NUM_MASK, (s, e)
            i += 1

    def next_due_ms(self, mark: tuple[int, int]) -> int | None:
        sec, last = mark
        i = bisect.bisect_left(self.secs, sec)
        while i < len(self.secs):
            s = self.secs[i]
            b = self.buckets[s]
            j = bisect.bisect_right(b, last) if s == sec else 0
            if j < len(b):
                return s * 1000 + (b[j] >> _NUM_BITS)
            i += 1
        return None

    def drop_seconds_before(self, sec: int, keep) -> None:
        """Forget whole seconds before `sec` whose entries `keep(num)` no longer needs."""
        while self.secs and self.secs[0] < sec:
            s = self.secs[0]
            if any(keep(e & _NUM_MASK) for e in self.buckets[s]):
                return
            self.count -= len(self.buckets.pop(s))
            self.secs.pop(0)

    def drop(self, gone) -> None:
        """Forget every entry whose number `gone(num)` names (shards whose logs are applied again)."""
        for sec in list(self.secs):
            b = self.buckets[sec]
            kept = array("Q", (e for e in b if not gone(e & _NUM_MASK)))
            if len(kept) != len(b):
                self.count -= len(b) - len(kept)
                if kept:
                    self.buckets[sec] = kept
                else:
                    del self.buckets[sec]
                    self.secs.remove(sec)

    def export(self, keep=None) -> list[tuple[int, bytes]]:
        """The index as (second, packed entries) — of the entries `keep(num)` keeps, when given."""
        if keep is None:
            return [(s, self.buckets[s].tobytes()) for s in self.secs]
        out = []
        for s in self.secs:
            b = array("Q", (e for e in self.buckets[s] if keep(e & _NUM_MASK)))
            if b:
                out.append((s, b.tobytes()))
        return out

    def restore(self, items, keep=None) -> None:
        """Load exported seconds into an empty index — or, with `keep(num)`, merge the entries it keeps into
        this one (a bundle snapshot's shards beside others)."""
        if keep is not None:
            for sec, raw in items:
                b = array("Q")
                b.frombytes(raw)
                for e in b:
                    if keep(e & _NUM_MASK):
                        self.add(sec * 1000 + (e >> _NUM_BITS), e & _NUM_MASK)
            return
        for sec, raw in items:
            b = array("Q")
            b.frombytes(raw)
            self.buckets[sec] = b
            self.secs.append(sec)
            self.count += len(b)
        self.secs.sort()


def parse_activation(activate_at: str, delay: str, publish_ms: int) -> int | None:
    """Activation time in ms from the reserved attributes, or None when neither is set. Raises ValueError
    with a readable reason when a value cannot be read."""
    if activate_at:
        v = activate_at.strip()
        if v.isdigit():
            return int(v)  # epoch milliseconds
        return _rfc3339_ms(v)
    if delay:
        v = delay.strip().lower()
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
        for suffix in ("ms", "s", "m", "h", "d"):
            if v.endswith(suffix):
                number, factor = v[: -len(suffix)], units[suffix]
                break
        else:
            number, factor = v, 1
        try:
            seconds = float(number) * factor
        except ValueError:
            raise ValueError(f"cannot read the delay {delay!r} (use e.g. 90, 90s, 15m, 2h, 1d)") from None
        if seconds < 0 or seconds != seconds:
            raise ValueError(f"the delay {delay!r} must not be negative")
        return publish_ms + int(seconds * 1000)
    return None


def _rfc3339_ms(v: str) -> int:
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot read the activation time {v!r} (use RFC 3339 or epoch milliseconds)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp() * 1000)
