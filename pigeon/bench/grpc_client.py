"""A lean Pub/Sub v1 client over raw gRPC, for Pigeon and Google's emulator. Owns the rule: the load generator is
not the bottleneck — publish requests are serialized once before the clock starts, StreamingPull responses are
split with a raw protobuf view (no per-message Python objects), ack ids are sliced out of the bytes."""

from __future__ import annotations

import asyncio
import os
import struct
import time

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.pubsub_v1 import types

from pigeon.bench.workers import open_loop

PROJECT = "bench"
_PUBLISH = "/google.pubsub.v1.Publisher/Publish"
_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"
_OPTIONS = [("grpc.max_send_message_length", 32 << 20), ("grpc.max_receive_message_length", 32 << 20)]
# What the official publisher sends again, after its default backoff (from 0.1 s, ×1.3 a time): a cluster refuses a
# publish with UNAVAILABLE while the topic's shard moves to another node, and a user's client retries it — so does
# the benchmark's, the wait counted in its figures. (Not CANCELLED, not DEADLINE_EXCEEDED: here those are the
# benchmark's own doing.)
_RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL,
                      grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN})
_RETRY_S_MAX = 60.0  # … for at most this long


async def retried(call, request: bytes, timeout: float, retries: list[int]):
    """`call(request)`, sent again on a code the official client retries; `retries[0]` counts the sends again."""
    delay, give_up = 0.1, time.monotonic() + _RETRY_S_MAX
    while True:
        try:
            return await call(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() not in _RETRIED or time.monotonic() + delay > give_up:
                raise
        retries[0] += 1
        await asyncio.sleep(delay)
        delay *= 1.3


def _raw_types():
    """Views of StreamingPullResponse that keep nested messages as bytes: parsing them costs one C call."""
    f = descriptor_pb2.FileDescriptorProto(name="bench/raw.proto", package="bench", syntax="proto3")
    B, S = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES, descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    REP = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    m = f.message_type.add(name="Response")
    m.field.add(name="received_messages", number=1, type=B, label=REP)
    m = f.message_type.add(name="Received")
    m.field.add(name="ack_id", number=1, type=S)
    m.field.add(name="message", number=2, type=B)
    m = f.message_type.add(name="Message")
    m.field.add(name="data", number=1, type=B)
    m.field.add(name="ordering_key", number=5, type=S)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = lambda n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"bench.{n}"))  # noqa: E731
    return get("Response"), get("Received"), get("Message")


RawResponse, RawReceived, RawMessage = _raw_types()
_PullRequest = types.StreamingPullRequest.pb()
_PublishRequest = types.PublishRequest.pb()
_Message = types.PubsubMessage.pb()


def ack_ids(response: bytes) -> list[str]:
    """Ack ids of one StreamingPullResponse; field 1 of each ReceivedMessage is its ack id."""
    out = []
    for rm in RawResponse.FromString(response).received_messages:
        if rm[0] == 0x0A and rm[1] < 0x80:  # short ack id first: slice it
            out.append(rm[2:2 + rm[1]].decode())
        else:
            out.append(RawReceived.FromString(rm).ack_id)
    return out


def messages(response: bytes) -> tuple[list[str], list[bytes], list[str]]:
    """Ack ids, data and ordering keys of one StreamingPullResponse."""
    ids, datas, keys = [], [], []
    for rm in RawResponse.FromString(response).received_messages:
        r = RawReceived.FromString(rm)
        m = RawMessage.FromString(r.message)
        ids.append(r.ack_id)
        datas.append(m.data)
        keys.append(m.ordering_key)
    return ids, datas, keys


def channel(address: str, own_connection: bool = False, secure: tuple[bytes, str] | None = None) -> grpc.aio.Channel:
    """`secure`: (the CA's PEM or b"", a bearer token) — TLS (or, without a CA, loopback in the clear) and the token
    on every call, as an authenticated client."""
    opts = list(_OPTIONS)
    if own_connection:  # channels with equal arguments otherwise share one TCP connection
        opts.append(("grpc.use_local_subchannel_pool", 1))
    if secure is not None:
        ca, token = secure
        # without a CA: a token on loopback in the clear (gRPC sends call credentials over "local" TCP only)
        transport = grpc.ssl_channel_credentials(ca) if ca else grpc.local_channel_credentials(
            grpc.LocalConnectionType.LOCAL_TCP)
        creds = grpc.composite_channel_credentials(transport, grpc.access_token_call_credentials(token))
        return grpc.aio.secure_channel(address, creds, options=opts)
    return grpc.aio.insecure_channel(address, options=opts)


def publish_request(topic: str, datas: list[bytes], ordering_key: str = "") -> bytes:
    return _PublishRequest(topic=topic, messages=[_Message(data=d, ordering_key=ordering_key) for d in datas]
                           ).SerializeToString()


class StreamingPull:
    """One StreamingPull stream whose acks go back on the stream; `responses()` yields raw response bytes until
    `stop()`."""

    def __init__(self, ch: grpc.aio.Channel, subscription: str, max_outstanding: int):
        self._acks: asyncio.Queue = asyncio.Queue()
        self._acks.put_nowait(_PullRequest(subscription=subscription, stream_ack_deadline_seconds=60,
                                           max_outstanding_messages=max_outstanding))
        method = ch.stream_stream(_PULL, request_serializer=_PullRequest.SerializeToString,
                                  response_deserializer=None)
        self.call = method(self._requests())

    async def _requests(self):
        while True:
            r = await self._acks.get()
            if r is None:
                return
            yield r

    def ack(self, ids: list[str]) -> None:
        if ids:
            self._acks.put_nowait(_PullRequest(ack_ids=ids))

    async def responses(self):
        try:
            async for r in self.call:
                yield r
        except asyncio.CancelledError:
            return
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise

    async def stop(self, linger_s: float = 0.2) -> None:
        await asyncio.sleep(linger_s)  # let the last acks leave
        self._acks.put_nowait(None)
        self.call.cancel()


async def _stop_when(gate, stream: StreamingPull, extra_s: float = 0.0) -> None:
    while not gate.finished():
        await asyncio.sleep(0.02)
    await asyncio.sleep(extra_s)
    await stream.stop()


class GrpcDriver:
    """Drives a Pub/Sub v1 gRPC server (Pigeon, Google's emulator)."""

    supports = frozenset({"publish", "consume", "mixed", "latency", "ordered", "connections", "idle", "backlog",
                          "restart"})

    def __init__(self, address: str, client: str = "raw grpc.aio, pre-serialized requests, raw protobuf views",
                 secure: tuple[bytes, str] | None = None):
        self.address = address
        self.client = client
        self.secure = secure  # (CA PEM, token): plain bytes, so the driver crosses a fork; channels made after

    def _chan(self, own_connection: bool = False) -> grpc.aio.Channel:
        return channel(self.address, own_connection, self.secure)

    @staticmethod
    def topic(key: str) -> str:
        return f"projects/{PROJECT}/topics/{key}"

    @staticmethod
    def subscription(key: str) -> str:
        return f"projects/{PROJECT}/subscriptions/{key}"

    # -- setup and probes (run in a forked child) --

    async def setup(self, key: str, ordered: bool = False) -> None:
        async with self._chan() as ch:
            create_topic = ch.unary_unary("/google.pubsub.v1.Publisher/CreateTopic",
                                          request_serializer=types.Topic.pb().SerializeToString,
                                          response_deserializer=None)
            create_sub = ch.unary_unary("/google.pubsub.v1.Subscriber/CreateSubscription",
                                        request_serializer=types.Subscription.pb().SerializeToString,
                                        response_deserializer=None)
            await create_topic(types.Topic.pb()(name=self.topic(key)), timeout=30)
            await create_sub(types.Subscription.pb()(name=self.subscription(key), topic=self.topic(key),
                                                     ack_deadline_seconds=60, enable_message_ordering=ordered),
                             timeout=30)

    async def serving(self, key: str, expect: int) -> bool:
        """Does a Pull hand out a backlogged message? (Pull leases it: used only after the backlog workloads.)"""
        try:
            async with self._chan() as ch:
                pull = ch.unary_unary("/google.pubsub.v1.Subscriber/Pull",
                                      request_serializer=types.PullRequest.pb().SerializeToString,
                                      response_deserializer=types.PullResponse.pb().FromString)
                r = await pull(types.PullRequest.pb()(subscription=self.subscription(key), max_messages=1),
                               timeout=2)
                return len(r.received_messages) > 0
        except grpc.aio.AioRpcError:
            return False

    # -- load --

    async def publish(self, key: str, size: int, batch: int, inflight: int, gate) -> dict:
        req = publish_request(self.topic(key), [os.urandom(size) for _ in range(batch)])
        count, retries = 0, [0]
        async with self._chan() as ch:
            call = ch.unary_unary(_PUBLISH, request_serializer=None, response_deserializer=None)

            async def lane():
                nonlocal count
                while gate.claim(batch):
                    await retried(call, req, 60, retries)
                    count += batch
                    gate.add(batch)

            await gate.wait_start()
            await asyncio.gather(*[lane() for _ in range(inflight)])
        return {"count": count, "t_end": time.monotonic(), "publish_retries": retries[0]}

    async def consume(self, key: str, outstanding: int, gate) -> dict:
        """Receive and ack until the gate closes; a stream the server ends with an error is opened again, as the
        official clients do (the count of such errors is returned)."""
        count, t_first, t_last = 0, 0.0, 0.0
        errors: dict[str, int] = {}
        async with self._chan() as ch:
            await gate.wait_start()
            while not gate.finished():
                stream = StreamingPull(ch, self.subscription(key), outstanding)
                stopper = asyncio.create_task(_stop_when(gate, stream))
                try:
                    async for resp in stream.responses():
                        ids = ack_ids(resp)
                        stream.ack(ids)
                        t_last = time.monotonic()
                        t_first = t_first or t_last
                        count += len(ids)
                        gate.add(len(ids))
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
                    await asyncio.sleep(0.1)
                stopper.cancel()
                stream.call.cancel()
        return {"count": count, "t_first": t_first, "t_last": t_last, "stream_errors": errors}

    async def latency_publish(self, key: str, size: int, rate: int, gate) -> dict:
        topic, pad = self.topic(key), os.urandom(max(0, size - 8))
        async with self._chan() as ch:
            call = ch.unary_unary(_PUBLISH, request_serializer=None, response_deserializer=None)
            await ch.channel_ready()
            await call(publish_request(topic, [bytes(8) + pad]), timeout=30)  # warm: connected, first call done

            retries = [0]

            async def send(due: float) -> float:
                # stamped with the time it was due (open loop): a late send counts as latency, nothing is omitted
                await retried(call, publish_request(topic, [struct.pack(">q", int(due * 1e9)) + pad]), 30, retries)
                return time.monotonic() - due

            out = await open_loop(send, rate, gate)
            return dict(out, publish_retries=retries[0]) if retries[0] else out

    async def latency_consume(self, key: str, outstanding: int, gate, grace_s: float) -> dict:
        """Receive and ack, noting each message's latency; a stream the server ends with an error is opened again,
        as the official clients do (as `consume`)."""
        lat_us: list[float] = []
        errors: dict[str, int] = {}
        async with self._chan() as ch:
            stream = StreamingPull(ch, self.subscription(key), outstanding)
            await gate.wait_start()
            while True:
                stopper = asyncio.create_task(_stop_when(gate, stream, grace_s))
                try:
                    async for resp in stream.responses():
                        now_ns = time.monotonic_ns()
                        ids, datas, _ = messages(resp)
                        stream.ack(ids)
                        stamps = [struct.unpack_from(">q", d)[0] for d in datas]
                        lat_us.extend((now_ns - t) / 1e3 for t in stamps if t)  # 0: the warm-up message
                    await stopper
                    break
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
                    stopper.cancel()
                    stream.call.cancel()
                    await asyncio.sleep(0.1)
                    stream = StreamingPull(ch, self.subscription(key), outstanding)
        return {"lat_us": lat_us, "stream_errors": errors}

    async def ordered_publish(self, key: str, keys: range, per_key: int, batch: int, size: int, gate) -> dict:
        """One task per ordering key sends its requests one after another (each waits for the previous one's
        answer, as an ordering client must); data is `key:seq` padded to `size`."""
        topic = self.topic(key)
        reqs = {k: [publish_request(topic, [f"{k}:{s}".encode().ljust(size, b".")
                                            for s in range(j, j + batch)], ordering_key=f"k{k}")
                    for j in range(0, per_key, batch)] for k in keys}
        count, retries = 0, [0]
        async with self._chan() as ch:
            call = ch.unary_unary(_PUBLISH, request_serializer=None, response_deserializer=None)

            async def one_key(k):
                nonlocal count
                for r in reqs[k]:
                    if time.monotonic() >= gate.until:
                        return
                    await retried(call, r, 60, retries)
                    count += batch
                    gate.add(batch)

            await gate.wait_start()
            await asyncio.gather(*[one_key(k) for k in keys])
        return {"count": count, "t_end": time.monotonic(), "publish_retries": retries[0]}

    async def ordered_consume(self, key: str, outstanding: int, gate) -> dict:
        """Receive, ack, and check that each key's sequence numbers arrive in order (a repeat of an earlier
        number is a redelivery, a jump is an ordering violation)."""
        next_seq: dict[bytes, int] = {}
        count = redelivered = violations = 0
        t_first = t_last = 0.0
        async with self._chan() as ch:
            stream = StreamingPull(ch, self.subscription(key), outstanding)
            await gate.wait_start()
            stopper = asyncio.create_task(_stop_when(gate, stream))
            async for resp in stream.responses():
                ids, datas, _ = messages(resp)
                stream.ack(ids)
                t_last = time.monotonic()
                t_first = t_first or t_last
                for d in datas:
                    k, _, s = d.rstrip(b".").partition(b":")
                    s = int(s)
                    want = next_seq.get(k, 0)
                    if s == want:
                        next_seq[k] = s + 1
                    elif s < want:
                        redelivered += 1
                    else:
                        violations += 1
                        next_seq[k] = s + 1
                count += len(ids)
                gate.add(len(ids))
            await stopper
        return {"count": count, "t_first": t_first, "t_last": t_last, "redelivered": redelivered,
                "violations": violations, "keys_seen": len(next_seq)}

    async def many_publishers(self, key: str, tasks: int, channels: int, batch: int, size: int, gate) -> dict:
        req = publish_request(self.topic(key), [os.urandom(size) for _ in range(batch)])
        chans = [self._chan(own_connection=True) for _ in range(channels)]
        calls = [c.unary_unary(_PUBLISH, request_serializer=None, response_deserializer=None) for c in chans]
        per_task = [0] * tasks
        errors: dict[str, int] = {}

        async def publisher(i):
            call = calls[i % channels]
            while gate.claim(batch):
                try:
                    await call(req, timeout=60)
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
                    continue
                per_task[i] += batch
                gate.add(batch)

        for c in chans:
            await c.channel_ready()
        await gate.wait_start()
        await asyncio.gather(*[publisher(i) for i in range(tasks)])
        for c in chans:
            await c.close()
        return {"count": sum(per_task), "active": sum(1 for n in per_task if n), "errors": errors}

    async def hold_idle(self, key: str, streams: int, channels: int, opened, release) -> dict:
        """Open `streams` StreamingPull streams on a subscription nobody publishes to, over `channels` TCP
        connections; count them in `opened` (a shared Value) once sent, hold them until `release` (an Event) is set,
        reopening any that fails (as the client libraries do); report how many were open then and what ended
        the others."""
        chans = [self._chan(own_connection=True) for _ in range(channels)]
        for c in chans:
            await c.channel_ready()
        ended: dict[str, int] = {}
        first: dict[str, str] = {}
        held: list[StreamingPull | None] = [None] * streams

        async def hold(i: int):
            while not release.is_set():
                s = held[i] = StreamingPull(chans[i % channels], self.subscription(key), 100)
                try:
                    async for _ in s.responses():
                        pass
                    if release.is_set():
                        return
                    why = "CANCELLED"  # responses() ends quietly on that
                except grpc.aio.AioRpcError as e:
                    why = e.code().name
                    first.setdefault(why, e.details())
                ended[why] = ended.get(why, 0) + 1
                await asyncio.sleep(0.1)

        tasks = []
        for i in range(streams):
            tasks.append(asyncio.create_task(hold(i)))
            if i % 200 == 199:
                await asyncio.sleep(0)  # let the first requests leave
                opened.value = i + 1
        await asyncio.sleep(0.5)
        opened.value = streams
        while not release.is_set():
            await asyncio.sleep(0.1)
        still_open = sum(1 for t in tasks if not t.done())
        await asyncio.gather(*[s.stop(0) for s in held if s is not None])
        await asyncio.gather(*tasks)
        for c in chans:
            await c.close()
        return {"still_open": still_open, "ended": ended, "first_errors": first}

    async def many_subscribers(self, key: str, tasks: int, channels: int, outstanding: int, gate) -> dict:
        chans = [self._chan(own_connection=True) for _ in range(channels)]
        for c in chans:
            await c.channel_ready()
        streams = [StreamingPull(chans[i % channels], self.subscription(key), outstanding) for i in range(tasks)]
        per_task = [0] * tasks
        errors: dict[str, int] = {}

        async def subscriber(i):
            s = streams[i]
            try:
                async for resp in s.responses():
                    ids = ack_ids(resp)
                    s.ack(ids)
                    per_task[i] += len(ids)
            except grpc.aio.AioRpcError as e:
                errors[e.code().name] = errors.get(e.code().name, 0) + 1

        runners = [asyncio.create_task(subscriber(i)) for i in range(tasks)]
        await gate.wait_start()
        t0 = time.monotonic()
        while time.monotonic() < gate.until:
            await asyncio.sleep(0.05)
        counted = sum(per_task)  # received within the measured window
        t1 = time.monotonic()
        await asyncio.gather(*[s.stop(0) for s in streams])
        await asyncio.gather(*runners)
        for c in chans:
            await c.close()
        return {"count": counted, "seconds": t1 - t0, "active": sum(1 for n in per_task if n), "errors": errors}
