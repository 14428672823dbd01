"""NATS JetStream driver (a lean protocol connection for throughput — JetStream is driven by its subjects, as
`nats bench` does — and nats-py for setup and the latency run). Owns the rule: a publish counts once its PubAck arrived (stored; fsync'd before the ack only
with `sync_interval: always`), a message counts as consumed once it was acked — a pull consumer with
`ack_policy: all`, acking the last message of each pull batch."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from importlib.metadata import version

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType

from pigeon.bench.nats_wire import NatsWire, pub_frames
from pigeon.bench.workers import open_loop

CONSUMER = "c"


def _subject(key: str) -> str:
    return f"bench.{key}"


class NatsDriver:
    supports = frozenset({"publish", "consume", "mixed", "latency", "backlog", "restart"})

    def __init__(self, host: str, port: int, replicas: int = 1):
        self.host, self.port, self.replicas = host, port, replicas
        self.url = f"nats://{host}:{port}"
        self.client = (f"lean NATS protocol over asyncio (pre-serialized PUB windows, pipelined PubAcks, pull "
                       f"batches, ack_policy all); nats-py {version('nats-py')} for setup and latency")

    async def setup(self, key: str, ordered: bool = False) -> None:
        nc = await nats.connect(self.url)
        js = nc.jetstream()
        await js.add_stream(name=key, subjects=[_subject(key)], storage=StorageType.FILE, num_replicas=self.replicas)
        await js.add_consumer(key, ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.ALL, ack_wait=60,
                                                  max_ack_pending=-1, max_waiting=512))
        await nc.close()

    async def serving(self, key: str, expect: int) -> bool:
        try:
            nc = await nats.connect(self.url, connect_timeout=1, max_reconnect_attempts=0, allow_reconnect=False)
        except Exception:  # noqa: BLE001 — not up yet, whatever the reason
            return False
        try:
            info = await nc.jetstream(timeout=2).stream_info(key)
            return info.state.messages >= expect
        except Exception:  # noqa: BLE001 — JetStream still recovering
            return False
        finally:
            await nc.close()

    async def publish(self, key: str, size: int, batch: int, inflight: int, gate) -> dict:
        wire = await NatsWire().open(self.host, self.port)
        prefix = f"_INBOX.bench{os.getpid()}"
        frames = [pub_frames(_subject(key), f"{prefix}.{i}", os.urandom(size), batch) for i in range(inflight)]
        acks = [0] * inflight
        errors = [0]
        events = [asyncio.Event() for _ in range(inflight)]

        def on_ack(sid, reply, payload, status):
            lane = sid - 1
            if status is not None or b'"error"' in payload:
                errors[0] += 1
            acks[lane] += 1
            if acks[lane] == batch:
                events[lane].set()

        wire.on_msg = on_ack
        for i in range(inflight):
            wire.sub(f"{prefix}.{i}", i + 1)
        await wire.flush()
        count = 0

        async def lane(i):
            nonlocal count
            while gate.claim(batch):
                acks[i] = 0
                events[i].clear()
                wire.write(frames[i])
                await wire.drain()
                await asyncio.wait_for(events[i].wait(), 60)
                count += batch
                gate.add(batch)

        await gate.wait_start()
        await asyncio.gather(*[lane(i) for i in range(inflight)])
        t_end = time.monotonic()
        await wire.close()
        assert errors[0] == 0, f"{errors[0]} publishes were refused"
        return {"count": count, "t_end": t_end}

    async def consume(self, key: str, outstanding: int, gate) -> dict:
        wire = await NatsWire().open(self.host, self.port)
        inbox = f"_INBOX.pull{os.getpid()}"
        pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{key}.{CONSUMER}"
        half = max(1, outstanding // 2)
        pull = json.dumps({"batch": half, "expires": 1_000_000_000}).encode()
        st = {"count": 0, "since_pull": 0, "unacked": 0, "reply": b"", "t_last": 0.0, "t_recv": 0.0}

        def ack() -> None:
            wire.pub(st["reply"].decode(), b"+ACK")  # ack_policy all: acks everything up to this one
            gate.add(st["unacked"])
            st["unacked"] = 0
            st["t_last"] = time.monotonic()

        def on_msg(sid, reply, payload, status):
            if status is not None:  # 408 (the pull expired), 404, 409: ask again
                wire.pub(pull_subject, pull, inbox)
                return
            st["count"] += 1
            st["since_pull"] += 1
            st["unacked"] += 1
            st["reply"] = reply
            st["t_recv"] = time.monotonic()
            if st["since_pull"] >= half:  # a pull's worth arrived: ack it and ask for the next
                st["since_pull"] = 0
                ack()
                wire.pub(pull_subject, pull, inbox)

        wire.on_msg = on_msg
        wire.sub(inbox, 1)
        await wire.flush()
        await gate.wait_start()
        for _ in range(2):  # two pulls in flight
            wire.pub(pull_subject, pull, inbox)
        while not gate.finished():
            await asyncio.sleep(0.01)
            if st["unacked"] and time.monotonic() - st["t_last"] > 0.02:  # a tail smaller than a pull
                ack()
        if st["reply"]:
            wire.pub(st["reply"].decode(), b"+ACK")
        await wire.flush()
        await wire.close()
        return {"count": st["count"], "t_first": 0.0, "t_last": st["t_recv"]}

    async def latency_publish(self, key: str, size: int, rate: int, gate) -> dict:
        pad, subject = os.urandom(max(0, size - 8)), _subject(key)
        nc = await nats.connect(self.url)
        js = nc.jetstream()

        async def send(due: float) -> float:
            await js.publish(subject, struct.pack(">q", int(due * 1e9)) + pad)
            return time.monotonic() - due

        out = await open_loop(send, rate, gate)
        await nc.close()
        return out

    async def latency_consume(self, key: str, outstanding: int, gate, grace_s: float) -> dict:
        """Eight one-message pulls waiting at the server; each message is acked and replaced by a new pull."""
        wire = await NatsWire().open(self.host, self.port)
        inbox = f"_INBOX.lat{os.getpid()}"
        pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{key}.{CONSUMER}"
        pull = json.dumps({"batch": 1, "expires": 1_000_000_000}).encode()
        lat_us: list[float] = []

        def on_msg(sid, reply, payload, status):
            if status is None:
                lat_us.append((time.monotonic_ns() - struct.unpack_from(">q", payload)[0]) / 1e3)
                wire.pub(reply.decode(), b"+ACK")
            wire.pub(pull_subject, pull, inbox)

        wire.on_msg = on_msg
        wire.sub(inbox, 1)
        await wire.flush()
        await gate.wait_start()
        for _ in range(8):
            wire.pub(pull_subject, pull, inbox)
        while not gate.finished():
            await asyncio.sleep(0.02)
        await asyncio.sleep(grace_s)
        await wire.flush()
        await wire.close()
        return {"lat_us": lat_us}
