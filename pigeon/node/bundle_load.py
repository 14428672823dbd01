"""What each bundle this node owns costs it (docs/cluster.md, "Scale-out" 4.1): the placement planner bounds nodes'
load with it. Owns the rule of the estimate: a bundle's load is its share of this process's CPU, shared out by
the work its log took — entries and bytes appended, which the journal counts per log anyway (the hot path pays
nothing) — each weighed as the loop time it costs (`limits.load_entry_units`, `load_kib_units`; no more than
`load_unit_s_max` a unit, so a node's start or its storage work is not laid on the few bundles that appended
meanwhile), and smoothed by an exponential average with the half-life the caller gives. An estimate: reads that write nothing (a backlog
delivered again, peeks) and the storage role's work for other owners' ledgers are shared out with the rest."""

from __future__ import annotations

import json
import math
import time
from typing import Callable, Iterable, Mapping

from pigeon.core import limits


class LoadMeter:
    def __init__(self, counts: Callable[[], Mapping[int, tuple[int, int]]], half_life_s: float,
                 cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic):
        """`counts()`: log id → (entries, bytes) appended since the process started (only ever growing while the
        log is this node's; a drop starts it over)."""
        self.counts, self.half_life_s, self.cpu, self.clock = counts, half_life_s, cpu, clock
        self._at: float | None = None
        self._cpu = 0.0
        self._seen: dict[int, tuple[int, int]] = {}
        self.rates: dict[int, tuple[float, float, float]] = {}  # log → (entries/s, bytes/s, cores), smoothed
        self.cores = 0.0  # the process's CPU, smoothed

    def sample(self) -> None:
        """Take the counts and the CPU now; the rates since the last sample go into the averages."""
        now, cpu, counts = self.clock(), self.cpu(), dict(self.counts())
        at, self._at = self._at, now
        spent, self._cpu = cpu - self._cpu, cpu
        seen, self._seen = self._seen, counts
        if at is None or now <= at:
            return
        dt = now - at
        took = {}
        for log_id, (entries, nbytes) in counts.items():
            e0, b0 = seen.get(log_id, (entries, nbytes))
            de, db = entries - e0, nbytes - b0
            took[log_id] = (max(de, 0), max(db, 0))
        units = {log_id: de * limits.load_entry_units + db / 1024 * limits.load_kib_units
                 for log_id, (de, db) in took.items()}
        total = sum(units.values())
        cores = max(spent, 0.0) / dt
        keep = 1.0 - math.pow(0.5, dt / self.half_life_s)  # the weight of this interval in the average
        self.cores += keep * (cores - self.cores)
        rates = {}
        for log_id in set(self.rates) | set(took):
            de, db = took.get(log_id, (0, 0))
            u = units.get(log_id, 0.0)
            now_rate = (de / dt, db / dt, min(cores * u / total, u * limits.load_unit_s_max / dt) if total else 0.0)
            was = self.rates.get(log_id, (0.0, 0.0, 0.0))
            rate = tuple(w + keep * (n - w) for w, n in zip(was, now_rate))
            if log_id in counts or max(rate) > 1e-9:
                rates[log_id] = rate
        self.rates = rates

    def report(self, logs: Iterable[int]) -> bytes:
        """The load report of the given logs (the bundles this node owns), as `load/<node>` holds it."""
        bundles = {str(log_id - 1): [round(v, 6) for v in self.rates.get(log_id, (0.0, 0.0, 0.0))]
                   for log_id in sorted(logs)}
        return json.dumps({"cores": round(self.cores, 6), "bundles": bundles}, separators=(",", ":")).encode()


def read_report(raw: bytes) -> tuple[float, dict[int, tuple[float, float, float]]]:
    """(the node's cores, bundle → (entries/s, bytes/s, cores)) of a load report; a report this release cannot read
    counts as no load (the planner then moves nothing on its account)."""
    try:
        d = json.loads(raw)
        return float(d["cores"]), {int(b): (float(v[0]), float(v[1]), float(v[2])) for b, v in d["bundles"].items()}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return 0.0, {}
