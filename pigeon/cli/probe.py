"""`pigeon probe`: the black-box SLI — publish to a probe topic at a steady rate with the official client and
receive on a StreamingPull subscription, measuring each message from the publish call to its delivery. Exports
the figures as Prometheus metrics (`--metrics-port`) and prints a live summary; `--duration` ends it with a JSON
summary (for scripts and tests).

A message counts as lost when it has not arrived `--deadline` seconds after its publish was acknowledged; a
publish that fails or times out counts as a publish failure. Each message carries its sequence number and send
time; duplicates (redeliveries) are counted, not measured twice.

The control plane is timed too (seed 000: "a prober creates a subscription and checks that it took less than five
seconds"): at the start and then every `CONTROL_EVERY_S` a topic and a subscription of its own are created and
deleted, each call timed against `CONTROL_SLO_S`; a call that fails or takes longer is a control-plane failure.
Its calls are not retried: the time is the server's answer, not a client's patience. A secured target is reached as
pigeon.client.access says (`--tls-ca`, `--token`/`--token-file`, `--client-cert`/`--client-key`); a target that
refuses the probe's credentials is said so in one line, and the probe exits 2 as for any target it cannot set up."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from pigeon.core import limits
from pigeon.client.access import ClientAuth, pubsub_clients

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
CONTROL_SLO_S = 5.0  # each create or delete of a topic or subscription answered within this
CONTROL_EVERY_S = 30.0  # a control-plane round this often (a round is four admin calls: cheap for any node)
CONTROL_TIMEOUT_S = 2 * CONTROL_SLO_S  # a call not answered by then has long missed the SLO
CONTROL_OPERATIONS = ("create_topic", "create_subscription", "delete_subscription", "delete_topic")


class Prober:
    def __init__(self, target: str, project: str, rate: float, deadline_s: float, registry: CollectorRegistry,
                 auth: ClientAuth | None = None, control_slo_s: float = CONTROL_SLO_S):
        self.target, self.project, self.rate, self.deadline_s, self.auth = target, project, rate, deadline_s, auth
        self.control_slo_s = control_slo_s
        self.run_id = uuid.uuid4().hex[:8]
        self.topic = f"projects/{project}/topics/pigeon-probe"
        self.subscription = f"projects/{project}/subscriptions/pigeon-probe-{self.run_id}"
        self.lock = threading.Lock()
        self.sent: dict[int, float] = {}  # seq → when the publish was acknowledged (waiting for delivery)
        self.sent_at: dict[int, float] = {}  # seq → when it was sent
        self.done: set[int] = set()
        self.recent: deque[float] = deque(maxlen=10_000)  # latencies of the last messages, for the summary
        self.counts = {"sent": 0, "received": 0, "publish_failures": 0, "lost": 0, "duplicates": 0,
                       "control_calls": 0, "control_failures": 0}
        self.control_max_s: dict[str, float] = {}  # operation → its slowest answer
        self._rounds = itertools.count()
        self.m_latency = Histogram("pigeon_probe_latency_seconds", "From the publish call to the delivery",
                                   buckets=LATENCY_BUCKETS, registry=registry)
        self.m_sent = Counter("pigeon_probe_sent", "Probe messages published", registry=registry)
        self.m_received = Counter("pigeon_probe_received", "Probe messages received", registry=registry)
        self.m_pub_fail = Counter("pigeon_probe_publish_failures", "Publishes that failed or timed out",
                                  registry=registry)
        self.m_lost = Counter("pigeon_probe_lost", "Messages not delivered within the deadline", registry=registry)
        self.m_control = Histogram("pigeon_probe_control_latency_seconds", "Creating or deleting a topic or "
                                   "subscription, answered", ["operation"], buckets=LATENCY_BUCKETS, registry=registry)
        self.m_control_fail = Counter("pigeon_probe_control_failures", f"Creates and deletes that failed or took "
                                      f"longer than the SLO ({control_slo_s:g} s)", ["operation"], registry=registry)
        for op in CONTROL_OPERATIONS:  # every series from the start: a first failure is an increase
            self.m_control.labels(op)
            self.m_control_fail.labels(op)

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

    def check_control_plane(self) -> None:
        """One round: create a topic and a subscription of this round's own, delete them, each call timed."""
        n = next(self._rounds)
        topic = f"projects/{self.project}/topics/pigeon-probe-control-{self.run_id}-{n}"
        sub = f"projects/{self.project}/subscriptions/pigeon-probe-control-{self.run_id}-{n}"
        once = {"retry": None, "timeout": CONTROL_TIMEOUT_S}
        if not self._timed("create_topic", lambda: self.pub.create_topic(name=topic, **once)):
            return  # (nothing to delete, nor to subscribe to)
        if self._timed("create_subscription", lambda: self.sub.create_subscription(name=sub, topic=topic, **once)):
            self._timed("delete_subscription", lambda: self.sub.delete_subscription(subscription=sub, **once))
        self._timed("delete_topic", lambda: self.pub.delete_topic(topic=topic, **once))

    def _timed(self, operation: str, call) -> bool:
        t0 = time.monotonic()
        try:
            call()
            ok = True
        except Exception:  # noqa: BLE001 — any failure of the call is the finding
            ok = False
        took = time.monotonic() - t0
        if ok:
            self.m_control.labels(operation).observe(took)
        failed = not ok or took > self.control_slo_s
        if failed:
            self.m_control_fail.labels(operation).inc()
        with self.lock:
            self.counts["control_calls"] += 1
            self.counts["control_failures"] += failed
            if ok:
                self.control_max_s[operation] = max(self.control_max_s.get(operation, 0.0), took)
        return ok

    def _control_rounds(self, stop: threading.Event) -> None:
        while True:
            self.check_control_plane()
            if stop.wait(CONTROL_EVERY_S):
                return

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
        control_stop = threading.Event()
        control = threading.Thread(target=self._control_rounds, args=(control_stop,), name="pigeon-probe-control",
                                   daemon=True)
        control.start()
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
            control_stop.set()
            control.join()  # (a round under way ends within its calls' timeouts)
        with self.lock:
            self.counts["lost"] += len(self.sent_at)  # published but never acknowledged nor failed
            self.sent_at.clear()
        return self.summary()

    def summary(self) -> dict:
        lat = sorted(self.recent)

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else None
        with self.lock:
            control = {op: round(s * 1000, 2) for op, s in self.control_max_s.items()}
        return {**self.counts, "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(lat[-1] * 1000, 2) if lat else None,
                "control_max_ms": control}


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
                  "admin max ms", "admin failures", title=f"pigeon probe → {target} ({rate:g} msg/s; admin calls "
                                                         f"within {CONTROL_SLO_S:g} s)")
        slowest = max(s["control_max_ms"].values(), default=None)
        t.add_row(*(str(s[k]) if s[k] is not None else "-" for k in ("sent", "received", "p50_ms", "p99_ms", "max_ms",
                                                                     "publish_failures", "lost", "duplicates")),
                  str(slowest) if slowest is not None else "-", str(s["control_failures"]))
        return t

    try:
        with Live(table(p.summary()), console=console, refresh_per_second=2, transient=as_json) as live:
            out = p.run(duration_s, lambda s: live.update(table(s)))
            live.update(table(out))
    finally:
        p.teardown()
    if as_json:
        print(json.dumps(out))
    return 0 if out["lost"] == 0 and out["publish_failures"] == 0 and out["control_failures"] == 0 else 1
