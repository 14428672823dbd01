"""Drives Pigeon's REST/JSON API (the HTTP port) for the publish workload: the same requests as the gRPC driver's,
as a client of the REST API would send them — JSON bodies with base64 data, pre-built — over aiohttp with
keep-alive connections, one per request in flight. Topics and subscriptions are made over gRPC."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time

from pigeon.bench.grpc_client import GrpcDriver


class RestDriver(GrpcDriver):
    supports = frozenset({"publish"})

    def __init__(self, grpc_address: str, base_url: str):
        super().__init__(grpc_address, "aiohttp, pre-built JSON bodies (base64 data), keep-alive")
        self.base_url = base_url

    async def publish(self, key: str, size: int, batch: int, inflight: int, gate) -> dict:
        import aiohttp

        body = json.dumps({"messages": [{"data": base64.b64encode(os.urandom(size)).decode()}
                                        for _ in range(batch)]}).encode()
        url = f"{self.base_url}/v1/{self.topic(key)}:publish"
        count = 0
        connector = aiohttp.TCPConnector(limit=inflight)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
            async def lane():
                nonlocal count
                while gate.claim(batch):
                    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                        if r.status != 200:
                            raise RuntimeError(f"REST publish answered {r.status}: {(await r.text())[:200]}")
                        await r.read()
                    count += batch
                    gate.add(batch)

            await gate.wait_start()
            await asyncio.gather(*[lane() for _ in range(inflight)])
        return {"count": count, "t_end": time.monotonic()}
