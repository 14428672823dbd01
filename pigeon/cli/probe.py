"""`pigeon probe`: the black-box SLI — publish to a probe topic at a steady rate with the official client and
receive on a StreamingPull subscription, measuring each message from the publish call to its delivery. Exports
the figures as Prometheus metrics (`--metrics-port`) and prints a live summary; `--duration` ends it with a JSON
summary (for scripts and tests).

A message counts as lost when it has not arrived `--deadline` seconds after its publish was acknowledged; a
publish that fails or times out counts as a publish failure. Each message carries its sequence number and send
time; duplicates (redeliveries) are counted, not measured twice. A secured target is reached as
pigeon.client.access says (`--tls-ca`, `--token`/`--token-file`, `--client-cert`/`--client-key`); a target that
refuses the probe's credentials is said so in one line, and the probe exits 2 as for any target it cannot set up."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from pigeon.core import limits
from pigeon.client.access import ClientAuth, pubsub_clients

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class Prober:
    def __init__(self, target: str, project: str, rate: float, deadline_s: float, registry: CollectorRegistry,
                 auth: ClientAuth | None = None):
        self.target, self.project, self.rate, self.deadline_s, self.auth = target, project, rate, deadline_s, auth
        self.run_id = uuid.uuid4().hex[:8]
        self.topic = f"projects/{project}/topics/pigeon-probe"
        self.subscription = f"projects/{project}/subscriptions/pigeon-probe-{self.run_id}"
        self.lock = threading.Lock()
        self.sent: dict[int, float] = {}  # seq → when the publish was acknowledged (waiting for delivery)
        self.sent_at: dict[int, float] = {}  # seq → when it was sent
        self.done: set[int] = set()
        self.recent: deque[float] = deque(maxlen=10_000)  # latencies of the last messages, for the summary
        self.counts = {"sent": 0, "received": 0, "publish_failures": 0, "lost": 0, "duplicates": 0}
        self.m_latency = Histogram("pigeon_probe_latency_seconds", "From the publish call to the delivery",
                                   buckets=LATENCY_BUCKETS, registry=registry)
        self.m_sent = Counter("pigeon_probe_sent", "Probe messages published", registry=registry)
        self.m_received = Counter("pigeon_probe_received", "Probe messages received", registry=registry)
        self.m_pub_fail = Counter("pigeon_probe_publish_failures", "Publishes that failed or timed out",
                                  registry=registry)
        self.m_lost = Counter("pigeon_probe_lost", "Messages not delivered within the deadline", registry=registry)

    def _clients(self):
        return pubsub_clients(self.target, self.auth)

    def setup(self) -> None:
        from google.api_core import exceptions

        self.pub, self.sub = self._clients()
        from google.api_core.retry import Retry, if_exception_type

        retry = Retry(predicate=if_exception_type(exceptions.ServiceUnavailable), timeout=limits.probe_setup_s)
        try:
            self.pub.create_topic(name=self.topic, retry=retry, timeout=limits.probe_setup_s)
        except exceptions.AlreadyExists:
            pass
        self.sub.create_subscription(name=self.subscription, topic=self.topic, ack_deadline_seconds=10,
                                     retry=retry, timeout=limits.probe_setup_s)

    def teardown(self) -> None:
        try:
            self.sub.delete_subscription(subscription=self.subscription)
        except Exception:  # noqa: BLE001 — the server may be gone; the subscription expires then
            pass

    def _received(self, message) -> None:
        now = time.monotonic()
        message.ack()
        try:
            run, seq = message.data.decode().split(":")[:2]
            seq = int(seq)
        except ValueError:
            return
        if run != self.run_id:
            return
        with self.lock:
            if seq in self.done:
                self.counts["duplicates"] += 1
                return
            self.done.add(seq)
            self.sent.pop(seq, None)
            t0 = self.sent_at.pop(seq, None)
            self.counts["received"] += 1
        self.m_received.inc()
        if t0 is not None:
            self.recent.append(now - t0)
            self.m_latency.observe(now - t0)

    def _published(self, seq: int, fut) -> None:
        now = time.monotonic()
        with self.lock:
            if fut.exception() is not None:
                self.counts["publish_failures"] += 1
                self.sent_at.pop(seq, None)
                self.m_pub_fail.inc()
            elif seq not in self.done:
                self.sent[seq] = now

    def _expire(self) -> None:
        now = time.monotonic()
        with self.lock:
            late = [s for s, t in self.sent.items() if now - t > self.deadline_s]
            for s in late:
                del self.sent[s]
                self.sent_at.pop(s, None)
                self.done.add(s)  # arriving later is a duplicate, not a delivery
            self.counts["lost"] += len(late)
        if late:
            self.m_lost.inc(len(late))

    def run(self, duration_s: float | None, report) -> dict:
        streaming = self.sub.subscribe(self.subscription, self._received)
        seq = 0
        start = next_at = time.monotonic()
        last_report = start
        try:
            while duration_s is None or time.monotonic() - start < duration_s:
                now = time.monotonic()
                if now < next_at:
                    time.sleep(min(next_at - now, 0.05))
                    continue
                next_at += 1.0 / self.rate
                seq += 1
                with self.lock:
                    self.sent_at[seq] = time.monotonic()
                    self.counts["sent"] += 1
                self.m_sent.inc()
                fut = self.pub.publish(self.topic, f"{self.run_id}:{seq}".encode())
                fut.add_done_callback(lambda f, s=seq: self._published(s, f))
                self._expire()
                if now - last_report >= 1.0:
                    report(self.summary())
                    last_report = now
            drain = time.monotonic() + self.deadline_s  # the last ones: delivered, or lost at their deadline
            while time.monotonic() < drain and (self.sent or self.sent_at):
                time.sleep(0.05)
                self._expire()
        finally:
            streaming.cancel()
        with self.lock:
            self.counts["lost"] += len(self.sent_at)  # published but never acknowledged nor failed
            self.sent_at.clear()
        return self.summary()

    def summary(self) -> dict:
        lat = sorted(self.recent)

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else None
        return {**self.counts, "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(lat[-1] * 1000, 2) if lat else None}


def setup_failure(target: str, e: Exception, secured: bool = True) -> str:
    """One line for a probe that could not create its topic and subscription."""
    from google.api_core import exceptions

    if not secured and isinstance(e, (exceptions.RetryError, exceptions.ServiceUnavailable)):
        return (f"{target} does not answer in plaintext: {e}. If it serves TLS, give --tls-ca (and --token or "
                "--token-file)")
    if isinstance(e, exceptions.Unauthenticated):
        return (f"{target} refused the probe's credentials (UNAUTHENTICATED: {e.message}); give a valid token with "
                "--token or --token-file")
    if isinstance(e, exceptions.PermissionDenied):
        return (f"{target} refused the probe (PERMISSION_DENIED: {e.message}); its principal needs to create and "
                "use topics and subscriptions of the probe's project (--project)")
    return f"{target} does not serve the probe's topic and subscription: {e}"


def main(target: str, project: str, rate: float, duration_s: float | None, metrics_port: int, deadline_s: float,
         as_json: bool, auth: ClientAuth | None = None) -> int:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    registry = CollectorRegistry()
    if metrics_port:
        start_http_server(metrics_port, registry=registry)
    p = Prober(target, project, rate, deadline_s, registry, auth)
    console = Console(stderr=True)
    try:
        p.setup()
    except Exception as e:  # noqa: BLE001 — the target does not answer: that is the probe's finding
        console.print(f"pigeon probe: {setup_failure(target, e, auth is not None)}", highlight=False, markup=False)
        if as_json:
            print(json.dumps({**p.summary(), "error": str(e)}))
        return 2

    def table(s: dict) -> Table:
        t = Table("sent", "received", "p50 ms", "p99 ms", "max ms", "publish failures", "lost", "duplicates",
                  title=f"pigeon probe → {target} ({rate:g} msg/s)")
        t.add_row(*(str(s[k]) if s[k] is not None else "-" for k in ("sent", "received", "p50_ms", "p99_ms", "max_ms",
                                                                     "publish_failures", "lost", "duplicates")))
        return t

    try:
        with Live(table(p.summary()), console=console, refresh_per_second=2, transient=as_json) as live:
            out = p.run(duration_s, lambda s: live.update(table(s)))
            live.update(table(out))
    finally:
        p.teardown()
    if as_json:
        print(json.dumps(out))
    return 0 if out["lost"] == 0 and out["publish_failures"] == 0 else 1
