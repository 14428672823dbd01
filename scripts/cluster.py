"""`make cluster`: three etcd members and three Pigeon nodes on loopback, in the foreground, their logs in one
coloured stream; prints the addresses to use. Ctrl-C (or SIGTERM) stops everything it started.

    python scripts/cluster.py [--nodes 3] [--dir ./cluster] [--port 8085] [--secure]

Node i listens on --port + 2i (gRPC) and the port after it (REST, /metrics, the web console).

--secure (`make cluster SECURE=1`) makes a development CA, a server certificate, a node certificate per node, etcd's
certificate, an operator's client certificate and an admin's bearer token under DIR/pki, and starts the nodes
secured the way a client needs no certificate: the client ports serve TLS and tokens, and each node has a peer port
(--port + 2n + i) where the nodes call one another with mutual TLS and their node certificates. etcd takes TLS
only on its client URLs and requires a certificate of the CA: each node presents its node certificate, `pigeon
cluster status` the operator's. (etcd's members talk to one another in plaintext on loopback.)
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
import time

from pigeon.bench.procs import free_port
from pigeon.ops import certs, etcd_access
from pigeon.ops.auth import token_hash
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
    ap.add_argument("--secure", action="store_true", help="TLS and bearer tokens for clients, a peer port with node "
                                                           "certificates between the nodes")
    args = ap.parse_args()
    root = os.path.abspath(args.dir)
    os.makedirs(root, exist_ok=True)
    pki = os.path.join(root, "pki")
    extra = {f"n{i + 1}": [] for i in range(args.nodes)}
    if args.secure:
        extra = secure(pki, args.nodes, args.port)
    stop = threading.Event()
    quiet = threading.Event()  # the logs are followed until everything has stopped
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    peers = {f"e{i}": free_port() for i in range(3)}
    initial = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in peers.items())
    token = f"pigeon-cluster-{os.getpid()}"
    etcds = [EtcdProcess(os.path.join(root, name), name, peer_port=port, initial_cluster=initial, token=token,
                         pki=pki if args.secure else None)
             for name, port in peers.items()]
    endpoints = ",".join(e.url for e in etcds)
    nodes = [node_process(root, endpoints, f"n{i + 1}", zone=f"z{i + 1}",
                          port=args.port + 2 * i, http=True, extra=extra[f"n{i + 1}"]) for i in range(args.nodes)]
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
        operator = etcds[0].tls_flags("client-ops")  # `pigeon cluster …`'s options: none without --secure
        access = etcd_access.read(endpoints, *operator[1::2])
        await_status(access, lambda st: st["unowned"] == 0 and len(st["nodes"]) == len(nodes), timeout=60)
        status_command = " ".join(["pigeon cluster status --etcd", endpoints, *operator])
        if args.secure:
            addresses = [n.address.replace("127.0.0.1", "localhost") for n in nodes]
            client = f"pigeon --tls-ca {pki}/ca.pem --token-file {pki}/token"
            print(f"\npigeon cluster ready, secured (data in {root}; certificates and the admin's token in {pki}):\n"
                  f"  nodes: {' '.join(addresses)} (TLS; clients bring a token, no certificate)\n"
                  f"  peers: {' '.join(n.extra[n.extra.index('--peer-port') + 1] for n in nodes)} (mutual TLS, "
                  f"node certificates)\n"
                  f"  console, REST: {' '.join(n.http.replace('http:', 'https:') + '/' for n in nodes)}\n"
                  f"  etcd:  {endpoints} (TLS; client certificates of the CA required)\n"
                  f"  try:   {client} topics create orders -a {addresses[0]}\n"
                  f"         {client} subscriptions create orders-sub --topic orders -a {addresses[-1]}\n"
                  f"         {client} publish orders hello -a {addresses[1 % len(addresses)]}\n"
                  f"         {client} pull orders-sub --ack -a {addresses[-1]}\n"
                  f"         {status_command}\n  Ctrl-C stops everything.\n", flush=True)
        else:
            print(f"\npigeon cluster ready (data in {root}):\n  nodes: {' '.join(n.address for n in nodes)}\n"
                  f"  console, REST: {' '.join(n.http + '/' for n in nodes)}\n"
                  f"  etcd:  {endpoints}\n  try:   PUBSUB_EMULATOR_HOST={nodes[0].address} pigeon topics create orders\n"
                  f"         {status_command}\n  Ctrl-C stops everything.\n", flush=True)
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


def secure(pki: str, count: int, port: int) -> dict[str, list[str]]:
    """Certificates and an admin token in `pki` (kept across runs); each node's flags: a server certificate and
    the token file on the client port, its node certificate and the CA on a peer port of its own and towards
    etcd."""
    if not os.path.exists(os.path.join(pki, "ca.pem")):
        certs.make_ca(pki)
    hosts = ["localhost", "127.0.0.1"]
    server, server_key = certs.issue(pki, "server", hosts=hosts)
    tokens, token = os.path.join(pki, "tokens.txt"), os.path.join(pki, "token")
    admin = "serviceAccount:admin@pigeon-dev.iam.gserviceaccount.com"
    if not os.path.exists(token):
        value = "pgn_" + secrets.token_urlsafe(32)
        with open(os.open(tokens, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(f"{token_hash(value)} {admin}\n")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(value + "\n")
    certs.etcd_server(pki, hosts)
    certs.issue(pki, "client-ops", email="ops@pigeon-dev.example")  # the operator's, for etcd
    ca = os.path.join(pki, "ca.pem")
    out = {}
    for i in range(count):
        node = f"n{i + 1}"
        cert, key = certs.issue(pki, f"node-{node}", hosts=hosts, node_id=node)
        out[node] = ["--tls-cert", server, "--tls-key", server_key, "--auth-token-file", tokens, "--admins", admin,
                     "--peer-port", str(port + 2 * count + i), "--peer-cert", cert, "--peer-key", key,
                     "--peer-ca", ca, "--etcd-ca", ca, "--etcd-cert", cert, "--etcd-key", key]
    return out


if __name__ == "__main__":
    sys.exit(main())
