"""One noisy tenant publishing flat out against one quiet tenant, on one secured node with a per-project publish
quota: the quiet tenant's publish latency and throughput alone and beside the noisy one.

    python scripts/noisy_tenant.py [--seconds 10] [--quota 20000000] [--lanes 4]

The node runs with bearer tokens (no TLS: the figure is about quotas, not encryption) and
PIGEON_PUBLISH_BYTES_PER_S; the quiet tenant publishes 10 × 1 KiB every 5 ms (2,000 msg/s, well under the
quota) and records each call's latency; the noisy tenant (another process) publishes 100 × 1 KiB per call from
`--lanes` concurrent lanes without pause, ignoring the refusals' retry hints. Prints one JSON document."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc  # noqa: E402
from google.pubsub_v1 import types  # noqa: E402

from pigeon.ops.auth import token_hash  # noqa: E402
from pigeon.testing.server import ServerProcess  # noqa: E402

PUBLISH = "/google.pubsub.v1.Publisher/Publish"


def _request(project: str, n: int) -> bytes:
    return types.PublishRequest.pb()(topic=f"projects/{project}/topics/feed", messages=[
        {"data": os.urandom(1024)} for _ in range(n)]).SerializeToString()


async def _quiet(address: str, token: str, seconds: float) -> dict:
    md = [("authorization", f"Bearer {token}")]
    lat, count, t0 = [], 0, time.monotonic()
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(PUBLISH)
        req = _request("quiet", 10)
        nxt = t0
        while time.monotonic() - t0 < seconds:
            s = time.perf_counter()
            await call(req, metadata=md, timeout=10)
            lat.append((time.perf_counter() - s) * 1000)
            count += 10
            nxt += 0.005
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
    lat.sort()
    return {"msgs_per_s": round(count / (time.monotonic() - t0)), "p50_ms": round(statistics.median(lat), 3),
            "p99_ms": round(lat[int(len(lat) * 0.99)], 3)}


def _noisy(address: str, token: str, seconds: float, lanes: int, out) -> None:
    async def go():
        md = [("authorization", f"Bearer {token}")]
        ok = refused = 0
        async with grpc.aio.insecure_channel(address) as ch:
            call = ch.unary_unary(PUBLISH)
            req = _request("noisy", 100)
            end = time.monotonic() + seconds

            async def lane():
                nonlocal ok, refused
                while time.monotonic() < end:
                    try:
                        await call(req, metadata=md, timeout=10)
                        ok += 100
                    except grpc.aio.AioRpcError as e:
                        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            raise
                        refused += 100

            await asyncio.gather(*(lane() for _ in range(lanes)))
        out.put({"accepted_msgs_per_s": round(ok / seconds), "refused_msgs_per_s": round(refused / seconds)})

    asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--quota", type=int, default=20_000_000, help="publish bytes per second of each project")
    ap.add_argument("--lanes", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tokens = {p: f"tok-{p}-" + os.urandom(8).hex() for p in ("quiet", "noisy", "admin")}
        with open(os.path.join(d, "tokens"), "w") as f:
            for p, t in tokens.items():
                f.write(f"{token_hash(t)} serviceAccount:{p}@x.iam.gserviceaccount.com\n")
        srv = ServerProcess(os.path.join(d, "data"), extra=[
            "--auth-token-file", os.path.join(d, "tokens"),
            "--admins", ",".join(f"serviceAccount:{p}@x.iam.gserviceaccount.com" for p in tokens)],
            env={"PIGEON_PUBLISH_BYTES_PER_S": str(a.quota)}).start()
        try:
            ch = grpc.insecure_channel(srv.address)
            for p in ("quiet", "noisy"):
                ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic")(
                    types.Topic.pb()(name=f"projects/{p}/topics/feed").SerializeToString(),
                    metadata=[("authorization", f"Bearer {tokens['admin']}")], timeout=10)
            alone = asyncio.run(_quiet(srv.address, tokens["quiet"], a.seconds))
            q = multiprocessing.Queue()
            noisy = multiprocessing.Process(target=_noisy, args=(srv.address, tokens["noisy"], a.seconds + 1,
                                                                 a.lanes, q))
            noisy.start()
            time.sleep(0.5)
            beside = asyncio.run(_quiet(srv.address, tokens["quiet"], a.seconds))
            noisy.join()
            print(json.dumps({"quota_bytes_per_s": a.quota, "quiet_alone": alone, "quiet_beside_noisy": beside,
                              "noisy": q.get(timeout=10),
                              "p50_ratio": round(beside["p50_ms"] / alone["p50_ms"], 3),
                              "throughput_ratio": round(beside["msgs_per_s"] / alone["msgs_per_s"], 3)}, indent=1))
        finally:
            srv.kill()


if __name__ == "__main__":
    main()
