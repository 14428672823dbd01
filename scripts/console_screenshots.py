"""The README's pictures of the web console: starts a node (or, with --cluster, etcd and three nodes), makes
some traffic — a steady publisher, a consumer that acknowledges most of what it gets, a dead-letter topic that
fills — and saves screenshots of the console's pages from a real headless Chromium.

    python scripts/console_screenshots.py [--out docs/img] [--cluster] [--seconds 40]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from pigeon.testing.browser import chromium
from pigeon.testing.server import ServerProcess

P = "projects/shop"


def call(base: str, method: str, path: str, body=None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}") from None


def setup(base: str) -> None:
    for t in ("orders", "payments", "orders-dead"):
        call(base, "PUT", f"/v1/{P}/topics/{t}", {"labels": {"team": "checkout"}})
    call(base, "PUT", f"/v1/{P}/subscriptions/orders-fulfilment", {
        "topic": f"{P}/topics/orders", "ackDeadlineSeconds": 30, "enableMessageOrdering": True,
        "deadLetterPolicy": {"deadLetterTopic": f"{P}/topics/orders-dead", "maxDeliveryAttempts": 5}})
    call(base, "PUT", f"/v1/{P}/subscriptions/orders-analytics", {"topic": f"{P}/topics/orders",
                                                                   "filter": 'attributes.region = "eu"'})
    call(base, "PUT", f"/v1/{P}/subscriptions/payments-ledger", {"topic": f"{P}/topics/payments"})
    call(base, "PUT", f"/v1/{P}/subscriptions/orders-dead-inspect", {"topic": f"{P}/topics/orders-dead"})


def traffic(base: str, stop: threading.Event) -> None:
    """~150 orders/s and ~40 payments/s; orders-fulfilment acks most, hands back the poison ones; the ledger
    acks everything, a little behind."""
    i = 0
    while not stop.is_set():
        t0 = time.monotonic()
        orders = [{"data": base64.b64encode(json.dumps({"order": i + k, "total": 12.5}).encode()).decode(),
                   "attributes": {"region": "eu" if (i + k) % 3 else "us", "poison": str((i + k) % 97 == 0)},
                   "orderingKey": f"customer-{i // 30 % 7}"} for k in range(30)]  # one key per request, as Pub/Sub asks
        call(base, "POST", f"/v1/{P}/topics/orders:publish", {"messages": orders})
        pays = [{"data": base64.b64encode(f"payment {i + k}".encode()).decode()} for k in range(8)]
        call(base, "POST", f"/v1/{P}/topics/payments:publish", {"messages": pays})
        got = call(base, "POST", f"/v1/{P}/subscriptions/orders-fulfilment:pull",
                   {"maxMessages": 25, "returnImmediately": True}).get("receivedMessages", [])
        good = [m["ackId"] for m in got if m["message"].get("attributes", {}).get("poison") != "True"]
        bad = [m["ackId"] for m in got if m["ackId"] not in good]
        if good:
            call(base, "POST", f"/v1/{P}/subscriptions/orders-fulfilment:acknowledge", {"ackIds": good})
        if bad:
            call(base, "POST", f"/v1/{P}/subscriptions/orders-fulfilment:modifyAckDeadline",
                 {"ackIds": bad, "ackDeadlineSeconds": 0})
        got = call(base, "POST", f"/v1/{P}/subscriptions/payments-ledger:pull",
                   {"maxMessages": 7, "returnImmediately": True}).get("receivedMessages", [])
        if got:
            call(base, "POST", f"/v1/{P}/subscriptions/payments-ledger:acknowledge",
                 {"ackIds": [m["ackId"] for m in got]})
        i += 30
        stop.wait(max(0.0, 0.2 - (time.monotonic() - t0)))


def shoot(base: str, out: str, pages: list[tuple[str, str]], warm_s: float) -> None:
    d = chromium(1440, 900)
    try:
        d.get(f"{base}/?project=shop#/subscriptions")
        print(f"letting the console's charts fill for {warm_s:.0f} s …", flush=True)
        time.sleep(warm_s)  # the charts hold what the page has polled since it opened
        for name, hash_ in pages:
            d.execute_script(f"location.hash = {hash_!r}")
            time.sleep(3)
            path = os.path.join(out, f"console-{name}.png")
            d.save_screenshot(path)
            print(f"saved {path}", flush=True)
    finally:
        d.quit()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--cluster", action="store_true", help="three nodes over etcd (the cluster page too)")
    ap.add_argument("--seconds", type=float, default=40.0, help="traffic before the first picture")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    root = tempfile.mkdtemp(prefix="pigeon-shots-")
    started, etcd = [], None
    try:
        if args.cluster:
            from pigeon.testing.cluster import await_status, start_nodes
            from pigeon.testing.etcd import EtcdProcess

            etcd = EtcdProcess(os.path.join(root, "etcd")).start()
            nodes = start_nodes(root, etcd.endpoint, http=True)
            started = list(nodes.values())
            await_status(etcd.endpoint, lambda st: st["unowned"] == 0, timeout=60)
        else:
            started = [ServerProcess(os.path.join(root, "data"), http=True).start()]
        base = started[0].http
        setup(base)
        stop = threading.Event()
        worker = threading.Thread(target=traffic, args=(base, stop), daemon=True)
        worker.start()
        pages = [("subscriptions", "#/subscriptions"), ("subscription", "#/subscriptions/orders-fulfilment"),
                 ("topic", "#/topics/orders"), ("topics", "#/topics")]
        if args.cluster:
            pages = [("cluster", "#/cluster")]
        try:
            shoot(base, args.out, pages, args.seconds)
        finally:
            stop.set()
            worker.join(10)
    finally:
        for s in started:
            s.kill()
        if etcd is not None:
            etcd.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
