"""NATS JetStream driver (nats-py's core connection, used leanly: JetStream is driven by its subjects, as
`nats bench` does). Owns the rule: a publish counts once its PubAck arrived (stored; fsync'd before the ack only
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

from pigeon.bench.procs import open_loop

CONSUMER = "c"


def _subject(key: str) -> str:
    return f"bench.{key}"


class NatsDriver:
    supports = frozenset({"publish", "consume", "latency", "backlog", "restart"})

    def __init__(self, url: str):
        self.url = url
        self.client = f"nats-py {version('nats-py')} core connection (Python asyncio), pipelined PubAcks, pull batches"

    async def setup(self, key: str, ordered: bool = False) -> None:
        nc = await nats.connect(self.url)
        js = nc.jetstream()
        await js.add_stream(name=key, subjects=[_subject(key)], storage=StorageType.FILE)
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
        body, subject = os.urandom(size), _subject(key)
        nc = await nats.connect(self.url, pending_size=64 << 20)
        prefix = nc.new_inbox()
        acks = [0] * inflight
        errors = [0]
        events = [asyncio.Event() for _ in range(inflight)]

        async def on_ack(msg):
            lane = int(msg.subject.rsplit(".", 1)[1])
            if b'"error"' in msg.data or not msg.data:
                errors[0] += 1
            acks[lane] += 1
            if acks[lane] == batch:
                events[lane].set()

        await nc.subscribe(f"{prefix}.*", cb=on_ack, pending_msgs_limit=-1, pending_bytes_limit=-1)
        count = 0

        async def lane(i):
            nonlocal count
            reply = f"{prefix}.{i}"
            while gate.claim(batch):
                acks[i] = 0
                events[i].clear()
                for _ in range(batch):
                    await nc.publish(subject, body, reply=reply)
                await asyncio.wait_for(events[i].wait(), 60)
                count += batch
                gate.add(batch)

        await gate.wait_start()
        await asyncio.gather(*[lane(i) for i in range(inflight)])
        t_end = time.monotonic()
        await nc.close()
        assert errors[0] == 0, f"{errors[0]} publishes were refused"
        return {"count": count, "t_end": t_end}

    async def _consumer(self, key: str, outstanding: int, on_data, gate, extra_s: float = 0.0) -> dict:
        nc = await nats.connect(self.url, pending_size=64 << 20)
        inbox = nc.new_inbox()
        pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{key}.{CONSUMER}"
        half = max(1, outstanding // 2)
        pull = json.dumps({"batch": half, "expires": 1_000_000_000}).encode()
        state = {"count": 0, "since_pull": 0, "last_reply": None, "t_first": 0.0, "t_last": 0.0}

        async def on_msg(msg):
            if not msg.data:  # a status message (408: the pull expired, 404/409): ask again
                if msg.headers and msg.headers.get("Status"):
                    await nc.publish(pull_subject, pull, reply=inbox)
                return
            on_data(msg.data)
            state["count"] += 1
            state["since_pull"] += 1
            state["last_reply"] = msg.reply
            state["t_last"] = time.monotonic()
            state["t_first"] = state["t_first"] or state["t_last"]
            if state["since_pull"] >= half:
                state["since_pull"] = 0
                await nc.publish(msg.reply, b"+ACK")  # ack_policy all: acks everything up to this one
                await nc.publish(pull_subject, pull, reply=inbox)
            gate.add(1)

        await nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        await gate.wait_start()
        for _ in range(2):  # two pulls in flight
            await nc.publish(pull_subject, pull, reply=inbox)
        while not gate.finished():
            await asyncio.sleep(0.02)
        await asyncio.sleep(extra_s)
        if state["last_reply"]:
            await nc.publish(state["last_reply"], b"+ACK")
        await nc.flush()
        await nc.close()
        return state

    async def consume(self, key: str, outstanding: int, gate) -> dict:
        s = await self._consumer(key, outstanding, lambda d: None, gate)
        return {"count": s["count"], "t_first": s["t_first"], "t_last": s["t_last"]}

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
        lat_us: list[float] = []

        def on_data(data):
            lat_us.append((time.monotonic_ns() - struct.unpack_from(">q", data)[0]) / 1e3)

        # small pulls: a message is acked (with those before it) at most every 2 messages
        await self._consumer(key, 4, on_data, gate, grace_s)
        return {"lat_us": lat_us}
