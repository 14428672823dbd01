"""The workloads, each run against one started server through its driver. Owns the rule: a figure is computed
from what the server acknowledged (publish) or what the client received and acked (consume), over the time from
the common start instant to the last acknowledgement; every run is bounded in count and time.

A driver is any object with the async methods used here (`setup`, `serving`, `publish`, `consume`,
`latency_publish`, `latency_consume`; gRPC targets also `ordered_*` and `many_*`) and a `supports` set."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time
from typing import Callable

from pigeon.bench.procs import DiskProbe
from pigeon.bench.workers import Background, Gate, run_one, run_workers

Tick = Callable[[float, int], None]  # (fraction done, messages so far)

_CTX = mp.get_context("fork")


def _ticker(gate: Gate, tick: Tick) -> Callable[[], None]:
    def t():
        if gate.start_at:
            by_time = (time.monotonic() - gate.start_at) / gate.duration_s
            by_count = gate.done / gate.limit if gate.limit else 0.0
            tick(min(1.0, max(by_time, by_count)), gate.done)
    return t


def _wall(plan, seconds: float) -> float:
    return seconds + plan.peer_start_s_max + 60  # setup, connection and drain slack on top of the run


def setup(driver, key: str, ordered: bool = False) -> None:
    run_one(driver.setup, key, ordered, wall_s=60)


def publish(driver, plan, key: str, batch: int, tick: Tick, *, size: int | None = None, limit: int = 0,
            duration_s: float | None = None, inflight: int | None = None) -> dict:
    """Durable publish throughput: `publish_procs` processes × `inflight` requests in flight, each request (or
    pipelined window) `batch` messages of `size` bytes, for `duration_s` or until `limit`."""
    size = size or plan.message_bytes
    inflight = inflight or plan.publish_inflight[0]
    gate = Gate(_CTX, duration_s or plan.publish_s, limit)
    jobs = [(driver.publish, (key, size, batch, inflight, gate))] * plan.publish_procs
    outs = run_workers(jobs, gate, _wall(plan, gate.duration_s), _ticker(gate, tick))
    count = sum(o["count"] for o in outs)
    seconds = max(o["t_end"] for o in outs) - gate.start_at
    out = {"msgs_per_s": round(count / seconds), "count": count, "seconds": round(seconds, 3), "batch": batch,
           "message_bytes": size, "procs": plan.publish_procs, "inflight_per_proc": inflight}
    retries = sum(o.get("publish_retries", 0) for o in outs)  # (requests the server refused and got again)
    return dict(out, publish_retries=retries) if retries else out


def publish_best(driver, plan, key: str, batch: int, tick: Tick) -> dict:
    """`publish` once per in-flight setting of the plan; the best run is the figure, all are kept."""
    runs = []
    for i, inflight in enumerate(plan.publish_inflight):
        share = len(plan.publish_inflight)
        runs.append(publish(driver, plan, key, batch, lambda f, n: tick((i + f) / share, n), inflight=inflight))
    best = max(runs, key=lambda r: r["msgs_per_s"])
    return dict(best, published_total=sum(r["count"] for r in runs),
                sweep=[{"inflight_per_proc": r["inflight_per_proc"], "msgs_per_s": r["msgs_per_s"]} for r in runs])


def consume(driver, plan, key: str, expect: int, tick: Tick) -> dict:
    """Consume with acks: drain `expect` backlogged messages (or stop at `consume_s_max`)."""
    gate = Gate(_CTX, plan.consume_s_max, expect)
    jobs = [(driver.consume, (key, plan.consume_outstanding_max, gate))] * plan.consume_procs
    outs = run_workers(jobs, gate, _wall(plan, gate.duration_s), _ticker(gate, tick))
    count = sum(o["count"] for o in outs)
    last = max((o["t_last"] for o in outs if o["count"]), default=gate.start_at)
    if count < expect:  # stopped by the clock: the rate is over the whole window, stalls included
        last = max(last, gate.until)
    seconds = max(last - gate.start_at, 1e-9)
    out = {"msgs_per_s": round(count / seconds) if count else 0, "count": count, "backlog": expect,
           "seconds": round(seconds, 3), "procs": plan.consume_procs, "drained": count >= expect}
    return _with_stream_errors(out, outs)


def mixed(driver, plan, key: str, tick: Tick) -> dict:
    """Publish and consume at the same time, on a topic of its own: the publishers of `publish` (first batch size
    and in-flight setting) and the consumers of `consume` run together for `mixed_s`. Each side is rated over
    the window; what the consumers did not take by its end is the backlog left (sustained: close to none)."""
    setup(driver, key)
    out = _at_once(driver, plan, [key] * plan.publish_procs, [key] * plan.consume_procs, plan.publish_inflight[0],
                   tick)
    return out | {"publish_procs": plan.publish_procs, "consume_procs": plan.consume_procs}


def topics(driver, plan, key: str, tick: Tick) -> dict:
    """`mixed` spread over `plan.topics` topics, one publisher process and one consumer process on each, with as
    many requests in flight in all as `mixed`: the load a server can share out by topic (a worker per core owns
    some of them)."""
    keys = [f"{key}-{i}" for i in range(plan.topics)]
    for k in keys:
        setup(driver, k)
    inflight = max(1, plan.publish_inflight[0] * plan.publish_procs // plan.topics)
    return _at_once(driver, plan, keys, keys, inflight, tick) | {"topics": plan.topics, "inflight_per_proc": inflight}


def _at_once(driver, plan, pub_keys: list[str], sub_keys: list[str], inflight: int, tick: Tick) -> dict:
    """A publisher process per key of `pub_keys` and a consumer process per key of `sub_keys`, together for
    `mixed_s`: each side rated over the window."""
    gate = Gate(_CTX, plan.mixed_s)
    batch = plan.publish_batches[0]
    pubs = [(driver.publish, (k, plan.message_bytes, batch, inflight, gate)) for k in pub_keys]
    subs = [(driver.consume, (k, plan.consume_outstanding_max, gate)) for k in sub_keys]
    outs = run_workers(pubs + subs, gate, _wall(plan, gate.duration_s), _ticker(gate, tick))
    published = sum(o["count"] for o in outs[:len(pubs)])
    consumed = sum(o["count"] for o in outs[len(pubs):])
    pub_s = max(max(o["t_end"] for o in outs[:len(pubs)]) - gate.start_at, 1e-9)
    sub_s = max([plan.mixed_s] + [o["t_last"] - gate.start_at for o in outs[len(pubs):] if o["count"]])
    out = {"publish_msgs_per_s": round(published / pub_s), "consume_msgs_per_s": round(consumed / sub_s),
           "published": published, "consumed": consumed, "backlog_left": max(0, published - consumed),
           "seconds": plan.mixed_s, "batch": batch, "message_bytes": plan.message_bytes}
    return _with_stream_errors(out, outs[len(pubs):])


def _with_stream_errors(out: dict, consumers: list[dict]) -> dict:
    """`out` plus the consumers' streams that the server ended with an error, summed by code (when any)."""
    errors: dict[str, int] = {}
    for o in consumers:
        for code, n in (o.get("stream_errors") or {}).items():
            errors[code] = errors.get(code, 0) + n
    if errors:
        out["stream_errors"] = errors
    return out


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[i]


def medians_each_second(lat_us: list[float], rate: int) -> list[float]:
    """The run's course: the median latency in ms of each second's messages (in the order received, `rate` of them
    a second) — a warm-up, a stall and the queue it leaves draining show here, where the run's percentiles blur
    them."""
    return [round(statistics.median(lat_us[i:i + rate]) / 1000, 2) for i in range(0, len(lat_us), rate)]


def latency(driver, plan, key: str, tick: Tick, consumer=None) -> dict:
    """`plan.latency_runs` latency runs, each on its own topic and subscription; the figures are those of the
    median run by p99 (one run's p50, p99, p999 and disk probe together), every run is kept under `runs`. One
    20 s run draws its tail from whatever the shared disk did in those 20 s: a single host stall of a few hundred
    ms is a p99 on its own, for any server that fsyncs. `consumer`: another driver to receive through (another
    node of the same deployment; `driver` publishes)."""
    runs = []
    for i in range(plan.latency_runs):
        part = lambda f, done, i=i: tick((i + f) / plan.latency_runs, done)  # noqa: E731
        runs.append(_latency_once(driver, plan, key if i == 0 else f"{key}{i + 1}", part, consumer or driver))
    ranked = sorted(runs, key=lambda r: (r["p99_ms"] is None, r["p99_ms"] or 0.0))
    out = dict(ranked[(len(ranked) - 1) // 2])
    if len(runs) > 1:
        out["runs"] = [{k: r[k] for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "disk_probe_max_ms")
                        if k in r} for r in runs]
    return out


def _latency_once(driver, plan, key: str, tick: Tick, consumer) -> dict:
    """Publish→receive latency at a fixed rate (open loop, one message per durable publish); the consumer acks
    what it receives. The publisher's clock starts when each message was due, so a stalled send counts."""
    setup(driver, key)
    gate = Gate(_CTX, plan.latency_s)
    grace_s = 2.0
    jobs = [(consumer.latency_consume, (key, 1000, gate, grace_s)),
            (driver.latency_publish, (key, plan.message_bytes, plan.latency_rate, gate))]
    probe = DiskProbe()
    try:
        sub, pub = run_workers(jobs, gate, _wall(plan, gate.duration_s + grace_s), _ticker(gate, tick))
    finally:
        disk = probe.stop()
    lat = sorted(sub["lat_us"])
    ms = lambda q: round(_percentile(lat, q) / 1000, 3)  # noqa: E731
    by_second = medians_each_second(sub["lat_us"], plan.latency_rate)
    return _with_stream_errors({
        "rate": plan.latency_rate, "seconds": plan.latency_s, "sent": pub["sent"], "received": len(lat),
        "p50_ms": ms(0.50), "p99_ms": ms(0.99), "p999_ms": ms(0.999), "max_ms": round(lat[-1] / 1000, 3)
        if lat else None, "p50_ms_each_second": by_second, "message_bytes": plan.message_bytes,
        **{k: v for k, v in pub.items() if k != "sent"}, **disk}, [sub])


def idle(server, plan, key: str, tick: Tick) -> dict:
    """`idle_streams` StreamingPull streams held open on a subscription nobody publishes to (over `idle_channels`
    TCP connections, from a process of their own): the server's memory per stream, and publish + consume at once
    (as `mixed`, for `idle_probe_s`) while they are held, against the mean of the same before and after."""
    driver = server.driver
    setup(driver, key)
    probe = plan.scaled(mixed_s=plan.idle_probe_s)
    before = mixed(driver, probe, f"{key}_before", lambda f, n: tick(0.2 * f, n))
    time.sleep(plan.settle_s)
    rss0 = server.rss()
    opened, release = _CTX.Value("i", 0), _CTX.Event()
    holder = Background(driver.hold_idle, (key, plan.idle_streams, plan.idle_channels, opened, release))
    try:
        until = time.monotonic() + plan.idle_open_s_max
        while opened.value < plan.idle_streams and time.monotonic() < until and holder.alive():
            tick(0.2 + 0.4 * opened.value / plan.idle_streams, 0)
            time.sleep(0.2)
        time.sleep(plan.settle_s)
        rss1 = _settled_rss(server, plan.settle_s)
        during = mixed(driver, probe, f"{key}_during", lambda f, n: tick(0.6 + 0.2 * f, n))
    finally:
        release.set()
    held = holder.result(plan.idle_open_s_max)
    after = mixed(driver, probe, f"{key}_after", lambda f, n: tick(0.8 + 0.2 * f, n))
    n = opened.value
    out = {"streams": n, "channels": plan.idle_channels, "open_at_end": held["still_open"],
           "reopened": held["ended"], "reopen_reasons": held["first_errors"], "rss_before_bytes": rss0,
           "rss_with_bytes": rss1,
           "publish_before": before["publish_msgs_per_s"], "consume_before": before["consume_msgs_per_s"],
           "publish_with": during["publish_msgs_per_s"], "consume_with": during["consume_msgs_per_s"],
           "publish_after": after["publish_msgs_per_s"], "consume_after": after["consume_msgs_per_s"]}
    if n and rss0:
        out["bytes_per_stream"] = round((rss1 - rss0) / n)
    for side in ("publish", "consume"):  # against the mean of the runs before and after, so drift cancels
        without = (out[f"{side}_before"] + out[f"{side}_after"]) / 2
        if without:
            out[f"{side}_ratio"] = round(out[f"{side}_with"] / without, 3)
    return out


def _settled_rss(server, settle_s: float) -> int:
    """The server's memory once two readings `settle_s` apart differ by less than 1 % (at most ten tries)."""
    last = server.rss()
    for _ in range(10):
        time.sleep(settle_s)
        now = server.rss()
        if abs(now - last) < 0.01 * max(last, 1):
            return now
        last = now
    return last


def backlog(server, plan, key: str, messages: int, tick: Tick) -> dict:
    """Server RSS per backlogged message: fill `messages` × `backlog_bytes` into a subscription nobody reads."""
    driver = server.driver
    setup(driver, key)
    time.sleep(plan.settle_s)
    before = server.rss()
    r = publish(driver, plan, key, 1000, tick, size=plan.backlog_bytes, limit=messages,
                duration_s=plan.backlog_s_max)
    time.sleep(plan.settle_s)
    after = server.rss()
    out = {"messages": r["count"], "message_bytes": plan.backlog_bytes, "fill_msgs_per_s": r["msgs_per_s"],
           "rss_before_bytes": before, "rss_after_bytes": after}
    if before and r["count"]:
        out["bytes_per_msg"] = round((after - before) / r["count"], 1)
    return out


async def _wait_serving(driver, key: str, expect: int, until: float) -> float | None:
    while time.monotonic() < until:
        if await driver.serving(key, expect):
            return time.monotonic()
        await asyncio.sleep(0.01)
    return None


def restart(server, plan, key: str, expect: int, tick: Tick) -> dict:
    """kill -9 with the backlog in place, start again on the same data, and time until the backlog is served
    (Pigeon and the emulator: a Pull returns a message; RabbitMQ, NATS, Redis: the queue/stream reports all
    `expect` messages)."""
    tick(0.0, 0)
    t_kill = server.kill_and_restart()
    t_port = time.monotonic()
    t_ok = run_one(_wait_serving, server.driver, key, expect, time.monotonic() + plan.restart_s_max,
                   wall_s=plan.restart_s_max + 30)
    tick(1.0, expect)
    out = {"backlog": expect, "port_open_s": round(t_port - t_kill, 3)}
    if t_ok is None:
        out["error"] = f"not serving the backlog within {plan.restart_s_max:.0f} s"
    else:
        out["seconds"] = round(t_ok - t_kill, 3)
    out["rss_after_bytes"] = server.rss()
    return out


def ordered(driver, plan, key: str, tick_pub: Tick, tick_sub: Tick) -> dict:
    """Ordering keys: `ordered_keys` keys, each published request after request (one key per request of
    `ordered_batch` messages, as Pub/Sub requires); then one StreamingPull drains them while checking each key's
    order."""
    setup(driver, key, ordered=True)
    size = 100
    per_key = plan.ordered_messages // plan.ordered_keys // plan.ordered_batch * plan.ordered_batch
    gate = Gate(_CTX, plan.ordered_s_max)
    n = plan.ordered_keys
    shares = [range(i * n // plan.publish_procs, (i + 1) * n // plan.publish_procs)
              for i in range(plan.publish_procs)]
    jobs = [(driver.ordered_publish, (key, s, per_key, plan.ordered_batch, size, gate)) for s in shares]
    outs = run_workers(jobs, gate, _wall(plan, gate.duration_s), _ticker(gate, tick_pub))
    published = sum(o["count"] for o in outs)
    pub_s = max(o["t_end"] for o in outs) - gate.start_at
    gate2 = Gate(_CTX, plan.ordered_s_max, published)
    (sub,) = run_workers([(driver.ordered_consume, (key, plan.consume_outstanding_max, gate2))], gate2,
                         _wall(plan, gate2.duration_s), _ticker(gate2, tick_sub))
    last = sub["t_last"] or gate2.start_at
    if sub["count"] < published:
        last = max(last, gate2.until)
    sub_s = max(last - gate2.start_at, 1e-9)
    return {"keys": n, "batch": plan.ordered_batch, "message_bytes": size, "published": published,
            "publish_msgs_per_s": round(published / pub_s), "received": sub["count"],
            "consume_msgs_per_s": round(sub["count"] / sub_s), "keys_seen": sub["keys_seen"],
            "order_violations": sub["violations"], "redelivered": sub["redelivered"]}


def connections(driver, plan, key: str, tick: Tick) -> dict:
    """Many clients at once: `conn_publishers` publisher tasks and `conn_subscribers` StreamingPull streams (one
    subscription), asyncio tasks in one process per side, spread over `conn_channels` TCP connections per side."""
    setup(driver, key)
    gate = Gate(_CTX, plan.conn_s)
    jobs = [(driver.many_subscribers, (key, plan.conn_subscribers, plan.conn_channels, plan.conn_outstanding, gate)),
            (driver.many_publishers, (key, plan.conn_publishers, plan.conn_channels, plan.conn_batch,
                                      plan.message_bytes, gate))]
    sub, pub = run_workers(jobs, gate, _wall(plan, gate.duration_s + 30), _ticker(gate, tick))
    return {"publishers": plan.conn_publishers, "subscribers": plan.conn_subscribers,
            "connections_per_side": plan.conn_channels, "batch": plan.conn_batch, "seconds": plan.conn_s,
            "publish_msgs_per_s": round(pub["count"] / plan.conn_s), "receive_msgs_per_s":
            round(sub["count"] / sub["seconds"]), "publishers_active": pub["active"],
            "subscribers_active": sub["active"], "publish_errors": pub["errors"], "subscribe_errors": sub["errors"]}
