"""`make cluster`: three etcd members and three Pigeon nodes on loopback, in the foreground, their logs in one
coloured stream; prints the addresses to use. Ctrl-C (or SIGTERM) stops everything it started.

    python scripts/cluster.py [--nodes 3] [--dir ./cluster] [--port 8085]

Node i listens on --port + 2i (gRPC) and the port after it (REST, /metrics, the web console).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from pigeon.bench.procs import free_port
from pigeon.testing.cluster import await_status, node_process
from pigeon.testing.etcd import EtcdProcess

COLOURS = ["\033[36m", "\033[35m", "\033[33m", "\033[32m", "\033[34m", "\033[31m"]
RESET = "\033[0m"


def follow(path: str, label: str, colour: str, stop: threading.Event) -> None:
    """Print the lines appended to `path`, prefixed with `label`."""
    while not os.path.exists(path) and not stop.is_set():
        time.sleep(0.1)
    with open(path, errors="replace") as f:
        f.seek(0, os.SEEK_END)
        while not stop.is_set():
            line = f.readline()
            if not line:
                time.sleep(0.1)
                continue
            tty = sys.stdout.isatty()
            print(f"{colour if tty else ''}{label:>6} |{RESET if tty else ''} {line.rstrip()}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--dir", default="./cluster")
    ap.add_argument("--port", type=int, default=8085, help="the first node's gRPC port; the others follow it, "
                                                           "two apart (each node's HTTP port is its gRPC port + 1)")
    args = ap.parse_args()
    root = os.path.abspath(args.dir)
    os.makedirs(root, exist_ok=True)
    stop = threading.Event()
    quiet = threading.Event()  # the logs are followed until everything has stopped
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    peers = {f"e{i}": free_port() for i in range(3)}
    initial = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in peers.items())
    token = f"pigeon-cluster-{os.getpid()}"
    etcds = [EtcdProcess(os.path.join(root, name), name, peer_port=port, initial_cluster=initial, token=token)
             for name, port in peers.items()]
    nodes = [node_process(root, ",".join(e.endpoint for e in etcds), f"n{i + 1}", zone=f"z{i + 1}",
                          port=args.port + 2 * i, http=True) for i in range(args.nodes)]
    for n in nodes:  # REST, /metrics and the console beside each node's gRPC port, as on a single node
        n.http_port = n.port + 1
    followers = [threading.Thread(target=follow, args=(p.log_path, label, COLOURS[i % len(COLOURS)], quiet),
                                  daemon=True)
                 for i, (label, p) in enumerate([(e.name, e) for e in etcds] + [(n.data_dir.rsplit("/", 1)[-1], n)
                                                                                   for n in nodes])]
    for t in followers:
        t.start()
    try:
        starters = [threading.Thread(target=e.start) for e in etcds]  # members wait for one another: start together
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        for n in nodes:
            n.start()
        endpoints = ",".join(e.endpoint for e in etcds)
        await_status(endpoints, lambda st: st["unowned"] == 0 and len(st["nodes"]) == len(nodes), timeout=60)
        print(f"\npigeon cluster ready (data in {root}):\n  nodes: {' '.join(n.address for n in nodes)}\n"
              f"  console, REST: {' '.join(n.http + '/' for n in nodes)}\n"
              f"  etcd:  {endpoints}\n  try:   PUBSUB_EMULATOR_HOST={nodes[0].address} pigeon topics create t1\n"
              f"         pigeon cluster status --etcd {endpoints}\n  Ctrl-C stops everything.\n", flush=True)
        while not stop.is_set():
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for n in nodes:
            try:
                n.stop()
            except Exception:  # noqa: BLE001 — killed instead
                n.kill()
        for e in etcds:
            e.stop()
        time.sleep(0.3)
        quiet.set()
        print("stopped: every node and etcd member this started", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
