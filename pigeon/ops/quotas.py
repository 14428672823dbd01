"""Per-project quotas. Owns the rules: each project has its own publish throughput (bytes per second),
admin operations (per `limits.admin_quota_window_s`) and retained backlog bytes; a project past one is refused
with QuotaExceeded (RESOURCE_EXHAUSTED, a QuotaFailure naming the quota, a RetryInfo saying when a retry may pass)
and nothing else is charged for the refused call — another project's quota is never touched, so a noisy tenant
cannot spend a quiet one's share.

Publish throughput is a token bucket holding `limits.quota_burst_s` of the project's rate, refilled continuously:
a tenant publishing flat out gets its bytes spread evenly over each second instead of all at the start of a
fixed window — a 1 s window let a noisy tenant write its whole second's quota in one burst, and the quiet
tenants' group commits in that burst were its p99. Admin operations use fixed windows (a per-minute count). `now`
is passed in. Usage (bytes and operations accepted, refusals) is counted per project for /metrics.

In a cluster a quota is the cluster's, not each node's: every node meters the calls it takes, and the nodes
share each project's quota out among themselves by what their callers asked for (`report` and `share_out`,
exchanged through etcd every second by the security watch, as Pulsar's resource groups share a quota among
brokers; max-min fair: `shares`). What a node's callers ask for counts refused calls too. A project nobody asked
about lately gets an equal share on every node; a node alone (or a single node) enforces the whole quota. The
retained backlog is summed over the nodes (each measures the subscriptions it owns)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pigeon.core import limits
from pigeon.core.errors import QuotaExceeded


@dataclass
class _Window:
    start: float = 0.0
    used: float = 0.0


@dataclass
class _Bucket:
    tokens: float  # may go below 0: a request bigger than the bucket passes when it is full, and is paid back
    at: float


REPORT_S = limits.security_watch_s  # the span of a report: the nodes exchange them this often


class ProjectQuotas:
    def __init__(self, publish_bytes_per_s: int, admin_ops_per_min: int, backlog_bytes: int):
        self.publish_bytes_per_s, self.admin_ops_per_min, self.backlog_bytes = (
            publish_bytes_per_s, admin_ops_per_min, backlog_bytes)
        self._publish: dict[str, _Bucket] = {}
        self._admin: dict[str, _Window] = {}
        self.backlog: dict[str, int] = {}  # project → retained unacked bytes, as last measured (`measured`)
        self.published_bytes: Counter = Counter()  # usage, for /metrics
        self.admin_ops: Counter = Counter()
        self.refused: Counter = Counter()  # (project, quota) → calls refused
        # a cluster's sharing: what callers asked for since the last report, and this node's shares
        self.asked_bytes: Counter = Counter()
        self.asked_ops: Counter = Counter()
        self.shares: dict[str, tuple[float, float]] = {}  # project → (publish share, admin share)
        self.default_share = 1.0  # a project no node reported: 1 / the nodes reporting
        self.elsewhere_backlog: dict[str, int] = {}  # the other nodes' measurements

    @property
    def active(self) -> bool:
        return bool(self.publish_bytes_per_s or self.admin_ops_per_min or self.backlog_bytes)

    def _take(self, windows: dict, project: str, amount: float, cap: float, span: float, now: float, quota: str,
              unit: str, limit: int) -> None:
        w = windows.get(project)
        if w is None:
            w = windows[project] = _Window(now, 0.0)
        if now - w.start >= span:
            w.start, w.used = now - (now - w.start) % span, 0.0
        # a call bigger than a whole window passes when the window is fresh: a limit below one request's size
        # must not refuse it for ever
        if w.used + amount > cap and w.used > 0:
            self.refused[(project, quota)] += 1
            raise QuotaExceeded(project, quota, limit, unit, max(0.0, w.start + span - now))
        w.used += amount

    def _share(self, project: str, i: int) -> float:
        got = self.shares.get(project)
        return self.default_share if got is None else got[i]

    def publish(self, project: str, nbytes: int, now: float) -> None:
        """Charge a publish of `nbytes` to `project`, or refuse it (over throughput, or over retained backlog)."""
        self.asked_bytes[project] += nbytes
        if self.backlog_bytes and self.backlog.get(project, 0) + self.elsewhere_backlog.get(project, 0) > \
                self.backlog_bytes:
            self.refused[(project, "backlog-bytes")] += 1
            raise QuotaExceeded(project, "backlog-bytes", self.backlog_bytes, "bytes retained unacknowledged",
                                limits.security_watch_s)
        if self.publish_bytes_per_s:
            self._drain(project, nbytes, now)
        self.published_bytes[project] += nbytes

    def _drain(self, project: str, nbytes: int, now: float) -> None:
        rate = self.publish_bytes_per_s * self._share(project, 0)
        cap = rate * limits.quota_burst_s
        b = self._publish.get(project)
        if b is None:
            b = self._publish[project] = _Bucket(cap, now)
        b.tokens, b.at = min(cap, b.tokens + (now - b.at) * rate), now
        if nbytes > b.tokens and b.tokens < cap:  # a request bigger than the bucket passes when it is full
            self.refused[(project, "publish-bytes-per-second")] += 1
            raise QuotaExceeded(project, "publish-bytes-per-second", self.publish_bytes_per_s, "bytes per second",
                                max(limits.quota_retry_s_min, (min(nbytes, cap) - b.tokens) / rate))
        b.tokens -= nbytes

    def admin(self, project: str, now: float) -> None:
        """Charge one admin operation to `project`, or refuse it."""
        self.asked_ops[project] += 1
        if self.admin_ops_per_min:
            self._take(self._admin, project, 1, self.admin_ops_per_min * self._share(project, 1),
                       limits.admin_quota_window_s, now, "admin-operations-per-minute", "operations per minute",
                       self.admin_ops_per_min)
        self.admin_ops[project] += 1

    def measured(self, backlog: dict[str, int]) -> None:
        """The retained unacked bytes of each project, as the node measured them."""
        self.backlog = backlog

    # --- a cluster's sharing -----------------------------------------------------------------------------------
    def report(self) -> dict[str, list[int]]:
        """What this node's callers asked of each project since the last report (publish bytes, admin
        operations) and the backlog it measured: {project: [bytes, operations, backlog bytes]}. Starts counting
        anew."""
        out = {p: [self.asked_bytes[p], self.asked_ops[p], self.backlog.get(p, 0)]
               for p in set(self.asked_bytes) | set(self.asked_ops) | set(self.backlog)}
        self.asked_bytes.clear()
        self.asked_ops.clear()
        if len(out) > limits.quota_report_projects_max:  # the busiest: the others get equal shares meanwhile
            out = dict(sorted(out.items(), key=lambda kv: kv[1], reverse=True)[:limits.quota_report_projects_max])
        return out

    def share_out(self, own: dict[str, list[int]], others: list[dict[str, list[int]]]) -> None:
        """This node's share of each project's quotas, from its own report and the other nodes' latest (max-min
        fair: `shares`), and the backlog measured elsewhere. A report that cannot be read changes nothing."""
        capacity = (self.publish_bytes_per_s * REPORT_S, self.admin_ops_per_min * REPORT_S / 60)
        got, default = shares(own, others, capacity)
        elsewhere: dict[str, int] = {}
        for r in others:
            for p, v in r.items():
                elsewhere[p] = elsewhere.get(p, 0) + int(v[2])
        self.shares, self.default_share, self.elsewhere_backlog = got, default, elsewhere


# the least share a node holds of a project's quota, as a part of an equal share: its callers' first calls pass
# before the next exchange gives it more (the nodes' shares then add up to a little over the whole)


def shares(own: dict[str, list[int]], others: list[dict[str, list[int]]],
           capacity: tuple[float, float]) -> tuple[dict, float]:
    """({project: (publish share, admin share)}, the share of a project absent from every report) for the node
    whose report is `own`, beside the reports of `others`; `capacity`: each quota per report's span (a second).

    Max-min fair: a node whose callers asked for less than an equal part of what is left gets what they asked
    for, the others split the rest equally, and what nobody asked for is split equally on top — so a node whose
    callers are refused (and, answered late, ask at a slower pace) still gets an equal part, rather than a part
    that shrinks with what it could ask (shares in proportion to what was asked did that: 60/33 kB/s of a 100 kB/s
    quota between two clients publishing flat out)."""
    n = 1 + len(others)
    equal = 1.0 / n
    out: dict[str, tuple[float, float]] = {}
    for p in set(own).union(*others):
        part = []
        for i in (0, 1):
            wants = [own.get(p, (0, 0, 0))[i]] + [r[p][i] if p in r else 0 for r in others]
            cap = capacity[i]
            if cap <= 0:
                part.append(equal)
                continue
            given, left = _water_fill(wants, cap)
            part.append(max(equal * limits.quota_share_floor, (given + left / n) / cap))
        out[p] = (part[0], part[1])
    return out, equal


def _water_fill(wants: list[float], cap: float) -> tuple[float, float]:
    """(what the first of `wants` is given, what is left of `cap`) when `cap` is shared max-min fair."""
    left, mine = cap, 0.0
    order = sorted(range(len(wants)), key=lambda j: wants[j])
    for k, j in enumerate(order):
        give = min(wants[j], left / (len(wants) - k))
        left -= give
        if j == 0:
            mine = give
    return mine, left
