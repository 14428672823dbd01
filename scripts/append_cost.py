"""What a ledger member spends to take replication's bytes, by the way they come: the append channel or the
storage service's gRPC Append stream, each in the clear and with mutual TLS (a secured cluster's node
certificates). A member (a ledger store with both, in a process of its own, on uvloop as `pigeon serve`) takes
the same entries from a writer in this process (uvloop too), and its CPU per MiB taken is read from /proc.

    python scripts/append_cost.py [--mib 64] [--entry-kib 16] [--rounds 3]

Loopback only; the member is stopped by its pid; temporary files are removed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time

import uvloop
from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pigeon.node.replication import StorageClient  # noqa: E402
from pigeon.ops import certs  # noqa: E402
from pigeon.ops.config import load  # noqa: E402

MEMBER = """
import asyncio, sys, grpc, uvloop
sys.path.insert(0, sys.argv[1])
from pigeon.api import storage_api
from pigeon.core import limits
from pigeon.node import append_channel
from pigeon.node.ledger_store import LedgerStore
from pigeon.ops import tls
from pigeon.ops.config import load

async def main(data, pki):
    store = LedgerStore(data)
    await store.open()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limits.grpc_receive_bytes_max)])
    server.add_generic_rpc_handlers(storage_api.handlers(store))
    config = None
    if pki:
        config = load(env={}, etcd="http://127.0.0.1:2379", node_id="m", tls_cert=pki + "/node-m.pem",
                      tls_key=pki + "/node-m-key.pem", tls_client_ca=pki + "/ca.pem", auth_token_file=pki + "/tokens")
        port = server.add_secure_port("127.0.0.1:0", tls.peer_server_credentials(config))
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sock = append_channel.listen("127.0.0.1", 0)
    channel = await append_channel.serve(sock, store, tls.append_server_context(config) if config else None)
    print(port, sock.getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    channel.close()
    await server.stop(0)
    await store.close()

uvloop.run(main(sys.argv[2], sys.argv[3]))
"""


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def write(client: StorageClient, channel: bool, entries: int, entry: bytes) -> float:
    """Append `entries` entries to a new ledger as fast as the member answers; the seconds it took."""
    stream = client.open_append(channel=channel)
    answers = stream.answers()
    t0 = time.perf_counter()
    window = 256  # entries in flight, as a busy writer keeps them
    sent = answered = 0
    while answered < entries:
        while sent < entries and sent - answered < window:
            stream.send(1, 1, sent, 3, entry)
            sent += 1
        stream.flush()
        index, why = await answers.__anext__()
        assert not why, why
        answered = index + 1
    dt = time.perf_counter() - t0
    stream.close()
    return dt


def measure(pki: str, secured: bool, channel: bool, mib: int, entry_kib: int) -> tuple[float, float]:
    """(member CPU ms per MiB, MiB/s)."""
    data = tempfile.mkdtemp(prefix="pigeon-append-cost-")
    member = subprocess.Popen([sys.executable, "-c", MEMBER, ROOT, data, pki if secured else ""],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grpc_port, channel_port = member.stdout.readline().split()
        config = None
        if secured:
            config = load(env={}, etcd="http://127.0.0.1:2379", node_id="w", tls_cert=f"{pki}/node-w.pem",
                          tls_key=f"{pki}/node-w-key.pem", tls_client_ca=f"{pki}/ca.pem",
                          auth_token_file=f"{pki}/tokens")

        async def run() -> tuple[float, float]:
            client = StorageClient(f"127.0.0.1:{grpc_port}", config)
            client.append_at = f"127.0.0.1:{channel_port}" if channel else ""
            entries = mib * 1024 // entry_kib
            await write(client, channel, 64, b"w" * 1024)  # warm: connections, handshakes
            before = cpu_seconds(member.pid)
            dt = await write(client, channel, entries, os.urandom(entry_kib * 1024))
            used = cpu_seconds(member.pid) - before
            await client.close()
            return used * 1000 / mib, mib / dt

        return uvloop.run(run())  # the writer's loop as a node's
    finally:
        member.stdin.close()
        try:
            member.wait(timeout=30)
        except subprocess.TimeoutExpired:
            member.kill()
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="MiB appended per measurement")
    ap.add_argument("--entry-kib", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="each way measured this many times, interleaved")
    args = ap.parse_args()
    console = Console()
    pki = tempfile.mkdtemp(prefix="pigeon-append-cost-pki-")
    try:
        certs.make_ca(pki)
        for node in ("m", "w"):
            certs.issue(pki, f"node-{node}", hosts=["127.0.0.1"], node_id=node)
        open(os.path.join(pki, "tokens"), "w").close()
        ways = [("append channel", False, True), ("append channel, mutual TLS", True, True),
                ("gRPC Append", False, False), ("gRPC Append, mutual TLS", True, False)]
        got: dict[str, list[tuple[float, float]]] = {w[0]: [] for w in ways}
        for r in range(args.rounds):
            for name, secured, channel in ways:
                console.print(f"round {r + 1}/{args.rounds}: {name} …")
                got[name].append(measure(pki, secured, channel, args.mib, args.entry_kib))
    finally:
        shutil.rmtree(pki, ignore_errors=True)
    table = Table(title=f"a member taking {args.mib} MiB in entries of {args.entry_kib} KiB ({args.rounds} rounds)")
    for col in ("way", "member CPU ms per MiB (median, range)", "MiB/s (median)"):
        table.add_column(col, justify="right" if col != "way" else "left")
    for name, rows in got.items():
        cpu = sorted(c for c, _ in rows)
        rate = sorted(m for _, m in rows)
        table.add_row(name, f"{cpu[len(cpu) // 2]:.2f} ({cpu[0]:.2f}–{cpu[-1]:.2f})", f"{rate[len(rate) // 2]:.0f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
