"""Per-project quotas. Owns the rules: each project has its own publish throughput (bytes per second),
admin operations (per `limits.admin_quota_window_s`) and retained backlog bytes; a project past one is refused
with QuotaExceeded (RESOURCE_EXHAUSTED, a QuotaFailure naming the quota, a RetryInfo saying when a retry may pass)
and nothing else is charged for the refused call — another project's quota is never touched, so a noisy tenant
cannot spend a quiet one's share.

Publish throughput is a token bucket holding `limits.quota_burst_s` of the project's rate, refilled continuously:
a tenant publishing flat out gets its bytes spread evenly over each second instead of all at the start of a
fixed window — a 1 s window let a noisy tenant write its whole second's quota in one burst, and the quiet
tenants' group commits in that burst were its p99. Admin operations use fixed windows (a per-minute count). `now`
is passed in. Usage (bytes and operations accepted, refusals) is counted per project for /metrics."""

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

    @property
    def active(self) -> bool:
        return bool(self.publish_bytes_per_s or self.admin_ops_per_min or self.backlog_bytes)

    def _take(self, windows: dict, project: str, amount: float, cap: float, span: float, now: float, quota: str,
              unit: str) -> None:
        w = windows.get(project)
        if w is None:
            w = windows[project] = _Window(now, 0.0)
        if now - w.start >= span:
            w.start, w.used = now - (now - w.start) % span, 0.0
        # a call bigger than a whole window passes when the window is fresh: a limit below one request's size
        # must not refuse it for ever
        if w.used + amount > cap and w.used > 0:
            self.refused[(project, quota)] += 1
            raise QuotaExceeded(project, quota, int(cap), unit, max(0.0, w.start + span - now))
        w.used += amount

    def publish(self, project: str, nbytes: int, now: float) -> None:
        """Charge a publish of `nbytes` to `project`, or refuse it (over throughput, or over retained backlog)."""
        if self.backlog_bytes and self.backlog.get(project, 0) > self.backlog_bytes:
            self.refused[(project, "backlog-bytes")] += 1
            raise QuotaExceeded(project, "backlog-bytes", self.backlog_bytes, "bytes retained unacknowledged",
                                limits.security_watch_s)
        if self.publish_bytes_per_s:
            self._drain(project, nbytes, now)
        self.published_bytes[project] += nbytes

    def _drain(self, project: str, nbytes: int, now: float) -> None:
        rate = self.publish_bytes_per_s
        cap = rate * limits.quota_burst_s
        b = self._publish.get(project)
        if b is None:
            b = self._publish[project] = _Bucket(cap, now)
        b.tokens, b.at = min(cap, b.tokens + (now - b.at) * rate), now
        if nbytes > b.tokens and b.tokens < cap:  # a request bigger than the bucket passes when it is full
            self.refused[(project, "publish-bytes-per-second")] += 1
            raise QuotaExceeded(project, "publish-bytes-per-second", rate, "bytes per second",
                                max(limits.quota_retry_s_min, (min(nbytes, cap) - b.tokens) / rate))
        b.tokens -= nbytes

    def admin(self, project: str, now: float) -> None:
        """Charge one admin operation to `project`, or refuse it."""
        if self.admin_ops_per_min:
            self._take(self._admin, project, 1, self.admin_ops_per_min, limits.admin_quota_window_s, now,
                       "admin-operations-per-minute", "operations per minute")
        self.admin_ops[project] += 1

    def measured(self, backlog: dict[str, int]) -> None:
        """The retained unacked bytes of each project, as the node measured them."""
        self.backlog = backlog
