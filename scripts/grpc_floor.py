"""The floor under Pigeon's latency at low rates: what one unary gRPC call costs in Python, measured on the same
machine against a bare `grpc.aio` server that answers every call with its request (uvloop, as `pigeon serve`) and
against a real Pigeon — round trip from a sequential caller (one call, then a 1 ms pause, as the benchmark's
1,000 msg/s), and the server's CPU per call, its event loop's thread apart from the others (gRPC's poller, Pigeon's
journal writer), read from /proc/PID/task before and after each method's calls.

    python scripts/grpc_floor.py [--calls 3000] [--server-env GRPC_EXPERIMENTS=event_engine_listener]

The echo servers serve from gRPC's POSIX listener, as every Pigeon process does (pigeon/__init__.py); give
`--server-env GRPC_EXPERIMENTS=event_engine_listener` to see gRPC's default EventEngine listener instead.

Rows: the echo servers' GetTopic-shaped and Publish-shaped calls (grpc.aio, and grpc's thread-pool server),
then Pigeon's GetTopic (no disk) and Publish of
one 1 KiB message (durable: fdatasync before the answer). Loopback only; each server is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
POSIX_IO = {"GRPC_EXPERIMENTS": "-event_engine_listener"}  # the echo servers' listener, as Pigeon's

ECHO = """
import grpc, sys, uvloop
async def main():
    server = grpc.aio.server()
    async def echo(request, context):
        return request
    methods = {m: grpc.unary_unary_rpc_method_handler(echo) for m in ("GetTopic", "Publish", "CreateTopic")}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", methods),))
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()
uvloop.run(main())
"""

SYNC_ECHO = """
import grpc, sys
from concurrent import futures
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
def echo(request, context):
    return request
methods = {m: grpc.unary_unary_rpc_method_handler(echo) for m in ("GetTopic", "Publish", "CreateTopic")}
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", methods),))
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
server.wait_for_termination()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of the process's main thread — the event loop's, in every server here — and of
    all its other threads together (gRPC's completion-queue poller, Pigeon's journal writer, …)."""
    main = rest = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # (a thread that ended meanwhile)
            continue
        s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if int(tid) == pid:
            main += s
        else:
            rest += s
    return main, rest


async def _calls(address: str, n: int, pid: int) -> dict[str, tuple[list[float], tuple[float, float]]]:
    """{method: (sorted round trips in ms, the server's CPU µs per call on its main thread and on the others)}."""
    import grpc
    from google.pubsub_v1 import types

    topic = "projects/floor/topics/floor"
    out = {}
    async with grpc.aio.insecure_channel(address) as ch:
        await ch.channel_ready()
        try:
            await ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic")(
                types.Topic.pb()(name=topic).SerializeToString(), timeout=10)
        except grpc.aio.AioRpcError:
            pass  # the echo server answers anything; Pigeon may have it already
        reqs = {"GetTopic": types.GetTopicRequest.pb()(topic=topic).SerializeToString(),
                "Publish": types.PublishRequest.pb()(topic=topic, messages=[{"data": os.urandom(1024)}]).SerializeToString()}
        for method, req in reqs.items():
            call = ch.unary_unary(f"/google.pubsub.v1.Publisher/{method}")
            for _ in range(100):  # warm
                await call(req, timeout=10)
            lat = []
            c0 = _cpu_s(pid)
            for _ in range(n):
                t = time.perf_counter()
                await call(req, timeout=10)
                lat.append((time.perf_counter() - t) * 1e3)
                await asyncio.sleep(0.001)
            c1 = _cpu_s(pid)
            out[method] = sorted(lat), ((c1[0] - c0[0]) / n * 1e6, (c1[1] - c0[1]) / n * 1e6)
    return out


def _measure(label: str, argv: list[str], port: int, n: int, env: dict, rows: list, console: Console) -> None:
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"{label}: the server did not start")
                time.sleep(0.1)
        console.print(f"[dim]{label}: {2 * (n + 100)} calls …")
        for method, (xs, (main, rest)) in asyncio.run(_calls(f"127.0.0.1:{port}", n, proc.pid)).items():
            q = lambda f: f"{xs[int(len(xs) * f)]:.3f}"  # noqa: E731
            rows.append((label, method, q(0.5), q(0.9), q(0.99), f"{main:.0f}", f"{rest:.0f}"))
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000, help="timed calls per method")
    ap.add_argument("--server-env", action="append", default=[], help="NAME=VALUE for both servers (repeatable)")
    a = ap.parse_args()
    env = {**POSIX_IO, **dict(kv.split("=", 1) for kv in a.server_env)}
    console = Console()
    rows: list = []
    port = _free_port()
    _measure("bare grpc.aio echo", [sys.executable, "-c", ECHO, str(port)], port, a.calls, env, rows, console)
    port = _free_port()
    _measure("bare grpc echo (threads)", [sys.executable, "-c", SYNC_ECHO, str(port)], port, a.calls, env, rows,
             console)
    data = tempfile.mkdtemp(prefix="pigeon-floor-")
    try:
        port = _free_port()
        _measure("pigeon serve", [sys.executable, "-m", "pigeon", "serve", "--port", str(port), "--http-port",
                                  str(_free_port()), "--data-dir", data], port, a.calls, env, rows, console)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    t = Table(title=f"one unary call, sequential, 1 ms apart ({a.calls} timed per method)"
                    + (f" — server env {a.server_env}" if a.server_env else ""))
    for c in ("server", "method", "p50 ms", "p90 ms", "p99 ms", "server CPU µs/call: main thread (a loop's)",
              "other threads µs/call"):
        t.add_column(c, justify="right" if "ms" in c or "µs" in c else "left")
    for r in rows:
        t.add_row(*r)
    console.print(t)


if __name__ == "__main__":
    main()
