"""RabbitMQ driver (a lean AMQP connection for throughput, aiormq for the latency run). Owns the rule: a publish counts
only once its publisher confirm arrived (persistent message, durable queue: RabbitMQ confirms after fsync), a
message counts as consumed once its ack was sent (manual acks, `multiple=True` once per window)."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from importlib.metadata import version

import aiormq
from pamqp.commands import Basic

from pigeon.bench.amqp_wire import AmqpWire, ConfirmTracker, ack_frame, publish_frames
from pigeon.bench.workers import open_loop

_PERSISTENT = Basic.Properties(delivery_mode=2)


class AmqpDriver:
    supports = frozenset({"publish", "consume", "mixed", "latency", "backlog", "restart"})

    def __init__(self, host: str, port: int, queue_type: str, replicas: int = 0):
        assert queue_type in ("classic", "quorum")
        self.host, self.port, self.queue_type = host, port, queue_type
        self.replicas = replicas  # a quorum queue's members (0: the broker's default)
        self.url = f"amqp://guest:guest@{host}:{port}/"
        self.client = (f"lean AMQP 0-9-1 over asyncio (pamqp {version('pamqp')} frames, pre-serialized, confirms "
                       f"pipelined, multiple acks); aiormq {version('aiormq')} for latency")

    async def setup(self, key: str, ordered: bool = False) -> None:
        conn = await aiormq.connect(self.url)
        try:
            ch = await conn.channel()
            args = {"x-queue-type": self.queue_type}
            if self.replicas:
                args["x-quorum-initial-group-size"] = self.replicas
            await ch.queue_declare(key, durable=True, arguments=args)
        finally:
            await conn.close()

    async def serving(self, key: str, expect: int) -> bool:
        logging.getLogger("aiormq").setLevel(logging.CRITICAL)  # "connection refused" is the expected answer
        try:
            conn = await asyncio.wait_for(aiormq.connect(self.url), 2)
        except (OSError, asyncio.TimeoutError, aiormq.exceptions.AMQPError):
            return False
        try:
            ch = await conn.channel()
            ok = await asyncio.wait_for(ch.queue_declare(key, passive=True), 2)
            return ok.message_count >= expect
        except (asyncio.TimeoutError, aiormq.exceptions.AMQPError):
            return False
        finally:
            await conn.close()

    async def publish(self, key: str, size: int, batch: int, inflight: int, gate) -> dict:
        frames = publish_frames(key, [os.urandom(size)] * batch)
        wire = await AmqpWire().open(self.host, self.port, confirms=True)
        confirms = ConfirmTracker()
        wire.on_confirm = confirms
        wire.start()
        sent = count = 0

        async def lane():
            nonlocal sent, count
            while gate.claim(batch):
                wire.write(frames)  # publish tags are dense per channel: this window is (sent, sent + batch]
                sent += batch
                last = sent
                await wire.drain()
                await confirms.wait_for(last)
                count += batch
                gate.add(batch)

        await gate.wait_start()
        await asyncio.gather(*[lane() for _ in range(inflight)])
        t_end = time.monotonic()
        await wire.close()
        assert confirms.nacks == 0, f"{confirms.nacks} publishes were nacked"
        return {"count": count, "t_end": t_end}

    async def consume(self, key: str, outstanding: int, gate) -> dict:
        wire = await AmqpWire().open(self.host, self.port)
        ack_every = max(1, outstanding // 4)
        st = {"count": 0, "unacked": 0, "tag": 0, "t_first": 0.0, "t_last": 0.0, "t_recv": 0.0}

        def on_deliver(tag: int) -> None:
            st["t_recv"] = time.monotonic()
            st["count"] += 1
            st["unacked"] += 1
            st["tag"] = tag
            if st["unacked"] >= ack_every:
                wire.write(ack_frame(tag))  # multiple: everything delivered up to this tag
                gate.add(st["unacked"])
                st["unacked"] = 0
                st["t_last"] = time.monotonic()
                st["t_first"] = st["t_first"] or st["t_last"]

        wire.on_deliver = on_deliver
        await gate.wait_start()
        await wire.consume(key, outstanding)
        wire.start()
        while not gate.finished():
            await asyncio.sleep(0.01)
            if st["unacked"]:  # a tail smaller than a window: ack it too
                wire.write(ack_frame(st["tag"]))
                gate.add(st["unacked"])
                st["unacked"] = 0
                st["t_last"] = time.monotonic()
        await wire.drain()
        await asyncio.sleep(0.1)
        await wire.close()
        return {"count": st["count"], "t_first": st["t_first"], "t_last": st["t_recv"]}

    async def _consumer(self, key: str, outstanding: int, on_body, gate, extra_s: float = 0.0) -> tuple:
        conn = await aiormq.connect(self.url)
        ch = await conn.channel(publisher_confirms=False)
        await ch.basic_qos(prefetch_count=outstanding)
        ack_every = max(1, outstanding // 4)
        state = {"count": 0, "unacked": 0, "tag": 0, "t_first": 0.0, "t_last": 0.0}

        async def on_message(m):
            on_body(m.body)
            state["count"] += 1
            state["unacked"] += 1
            state["t_last"] = time.monotonic()
            state["t_first"] = state["t_first"] or state["t_last"]
            tag = m.delivery.delivery_tag
            if tag > state["tag"]:
                state["tag"] = tag
            if state["unacked"] >= ack_every:
                state["unacked"] = 0
                await ch.basic_ack(state["tag"], multiple=True)
            gate.add(1)

        await gate.wait_start()
        await ch.basic_consume(key, on_message, no_ack=False)
        while not gate.finished():
            await asyncio.sleep(0.02)
        await asyncio.sleep(extra_s)
        if state["tag"]:
            await ch.basic_ack(state["tag"], multiple=True)
        await asyncio.sleep(0.1)
        await conn.close()
        return state

    async def latency_publish(self, key: str, size: int, rate: int, gate) -> dict:
        pad = os.urandom(max(0, size - 8))
        conn = await aiormq.connect(self.url)
        ch = await conn.channel(publisher_confirms=True)

        async def send(due: float) -> float:
            await ch.basic_publish(struct.pack(">q", int(due * 1e9)) + pad, routing_key=key, properties=_PERSISTENT)
            return time.monotonic() - due

        out = await open_loop(send, rate, gate)
        await conn.close()
        return out

    async def latency_consume(self, key: str, outstanding: int, gate, grace_s: float) -> dict:
        lat_us: list[float] = []

        def on_body(body):
            lat_us.append((time.monotonic_ns() - struct.unpack_from(">q", body)[0]) / 1e3)

        await self._consumer(key, 100, on_body, gate, grace_s)
        return {"lat_us": lat_us}
