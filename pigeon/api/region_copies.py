"""The copier of cross-region copies (docs/regions.md, "Cross-region copies"; the rules: node.copies): each node
copies the copy shards it owns from the regions that store them, through their gateways' Ranges API, follows each
subscription's state of them, and lets a lost region's copies go."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pigeon.api.access import COPY, REGION
from pigeon.api.proto import pigeon_ranges_pb2 as ranges_pb
from pigeon.broker.topic import key_hash
from pigeon.core import limits
from pigeon.core.errors import FailedPrecondition, PigeonError, Unavailable
from pigeon.node.copies import copy_batches, publish_request, serve_copies, split_batches
from pigeon.ops import tls
from pigeon.storage import records as R

log = logging.getLogger("pigeon.copies")

_READ = "/pigeon.v1.Ranges/ReadRange"
_CURSOR = "/pigeon.v1.Ranges/GetCursor"
_LATEST = "/pigeon.v1.Ranges/LatestOffsets"
_same = lambda b: b  # noqa: E731


class CopyLag:
    """One topic's copy of one region, as the metrics show it."""
    __slots__ = ("safe_ms", "behind", "copied", "followed_ms")

    def __init__(self):
        self.followed_ms = 0  # when the subscriptions' ack state was last followed whole (ms since the epoch)
        # shard → everything its region stored before this time is in the copy: the publish time of its oldest
        # message not copied yet, or — its last read found nothing new — when that read was asked
        self.safe_ms: dict[int, int] = {}
        self.behind = 0  # messages the region holds that the copy has not (at the last count)
        self.copied = 0  # messages copied by this node since it started

    def seconds(self, now_ms: int) -> float | None:
        """How far behind the copy is: what its region stored in the last this many seconds may not be in it
        (+Inf: a shard not read yet; None: this node copies none of it now)."""
        if not self.safe_ms:
            return None
        oldest = min(self.safe_ms.values())
        return max(0.0, (now_ms - oldest) / 1000) if oldest else float("inf")


class Copier(Collector):
    """Copies the copy shards this node owns, and lets a lost region's go. Runs beside the node's gateways; its
    figures are metrics of the node."""

    def __init__(self, engine, gateways, config):
        self.engine, self.gateways, self.config = engine, gateways, config
        self.lags: dict[tuple[str, str], CopyLag] = {}  # (topic, region) → its lag
        self._copying: dict[tuple[int, int], asyncio.Task] = {}  # (topic uid, shard) → its copy task
        self._served: set[int] = set()  # lost slots whose copies this node lets out
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pigeon-region-copies")

    async def stop(self) -> None:
        tasks = [t for t in [self._task, *self._copying.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in self._channels.values():
            await ch.close()

    async def _run(self) -> None:
        floors_at = 0.0
        while True:
            try:
                self.step()
                if time.monotonic() >= floors_at:
                    floors_at = time.monotonic() + limits.copy_floors_s
                    await self.follow_floors()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 — the loop is the copies' only driver: it goes on
                log.exception("region copies")
            await asyncio.sleep(limits.copy_poll_s)

    # --- which shards to copy ---------------------------------------------------------------------------------
    def _copied_here(self):
        """(topic, shard, slot) of each copy shard this node should copy now: it owns it, and its region holds its
        slot and has not been declared lost."""
        engine, gw = self.engine, self.gateways
        for t in list(engine.state.topics.values()):
            if not t.copies:
                continue
            per = len(t.shards) // engine.region.slots
            owned = None
            for k in sorted(t.copies):
                slot = k // per
                if slot in gw.lost or not gw.holds(slot):
                    continue
                if owned is None:
                    owned = set(engine.owned_shards(t))
                if k in owned:
                    yield t, k, slot

    def step(self) -> None:
        if self.gateways.region.slot in self.gateways.lost and not self.engine.closing:
            log.critical("this node's region %s was declared lost: it serves nothing from now on",
                         self.gateways.region.name)
            self.engine.refuse_calls()
            return
        for slot in self.gateways.lost - self._served:
            self._served.add(slot)
            n = serve_copies(self.engine, slot)
            log.warning("region slot %d was declared lost: %d copy shards here are served from now on", slot, n)
        self._copying = {key: task for key, task in self._copying.items() if not task.done()}
        topics, gone = self.engine.state.topics, {self.gateways.names.get(slot) for slot in self.gateways.lost}
        self.lags = {key: lag for key, lag in self.lags.items()  # (a topic deleted, a region lost: no series)
                     if key[0] in topics and key[1] not in gone}
        for t, k, slot in self._copied_here():
            if (t.uid, k) not in self._copying:
                self._copying[(t.uid, k)] = asyncio.create_task(self._copy(t, k, slot),
                                                                name=f"pigeon-copy-{t.uid}-{k}")

    def _still(self, t, k: int, slot: int) -> bool:
        engine = self.engine
        return (not engine.closing and engine.state.topics_by_uid.get(t.uid) is t and slot not in self.gateways.lost
                and k in engine.owned_shards(t))

    # --- copying one shard ------------------------------------------------------------------------------------
    async def _copy(self, t, k: int, slot: int) -> None:
        lag = self._lag(t, slot)
        lag.safe_ms[k] = 0  # (nothing known to be in the copy until its first read)
        try:
            while self._still(t, k, slot):
                ix = t.shards[k]
                req = ranges_pb.ReadRangeRequest(topic=t.name, shard=k, start_offset=ix.next,
                                                 max_bytes=limits.copy_read_bytes, allow_data_loss=True,
                                                 topic_uid=t.uid)
                asked_ms = int(time.time() * 1000)
                try:
                    resp = ranges_pb.ReadRangeResponse.FromString(await self._call(slot, _READ, req))
                except grpc.aio.AioRpcError as e:
                    log.debug("copy of %s shard %d: %s", t.name, k, e.code().name)
                    await asyncio.sleep(limits.copy_retry_s)
                    continue
                batches = split_batches(resp)
                if not batches:
                    lag.safe_ms[k] = asked_ms  # (caught up with what the region held when asked)
                    await asyncio.sleep(limits.copy_poll_s)
                    continue
                lag.safe_ms[k] = min(batches[0][1], asked_ms)
                if batches[0][0] > ix.next and not ix.base:
                    log.info("copy of %s shard %d starts over at %d: the region no longer holds %d..%d", t.name, k,
                             batches[0][0], ix.next, batches[0][0] - 1)
                elif batches[0][0] > ix.next:  # (a gap: wait until the copy holds nothing of its own)
                    log.info("copy of %s shard %d: the region no longer holds %d..%d; waiting for the copy's own "
                             "to go", t.name, k, ix.next, batches[0][0])
                    await asyncio.sleep(limits.copy_floors_s)
                    continue
                stored = await copy_batches(self.engine, t, k, [
                    (base, ms, publish_request(t.name, msgs), len(msgs),
                     key_hash(ranges_pb.StoredMessage.FromString(msgs[0]).ordering_key)) for base, ms, msgs in batches])
                lag.copied += stored  # (after the wait: another shard's task adds to it meanwhile)
        except (Unavailable, FailedPrecondition) as e:
            log.info("copy of %s shard %d stops here: %s", t.name, k, e)
        except PigeonError as e:
            log.warning("copy of %s shard %d: %s", t.name, k, e)
        finally:
            lag.safe_ms.pop(k, None)

    # --- subscriptions' state ---------------------------------------------------------------------------------
    async def follow_floors(self) -> None:
        """Each subscription's ack state of the copy shards this node copies, as their region has it now (the
        subscriptions asked side by side, limits.copy_follow_calls at a time)."""
        by_topic: dict[tuple[int, int], tuple[object, int, list[int]]] = {}
        for t, k, slot in self._copied_here():
            by_topic.setdefault((t.uid, slot), (t, slot, []))[2].append(k)
        calls = asyncio.Semaphore(limits.copy_follow_calls)
        for t, slot, shards in by_topic.values():
            await self._latest(t, slot, shards)
            started = int(time.time() * 1000)
            subs = [s for uid in list(t.subscriptions)
                    if (s := self.engine.state.subs_by_uid.get(uid)) is not None and not s.config.detached]
            followed = await asyncio.gather(*(self._follow(t, slot, shards, s, calls) for s in subs))
            if all(followed):
                self._lag(t, slot).followed_ms = started

    async def _follow(self, t, slot: int, shards: list[int], s, calls: asyncio.Semaphore) -> bool:
        """Subscription `s`'s state of the copy shards `shards`, as their region has it now: a Seek record of each
        that differs. False when the region did not answer."""
        async with calls:
            try:
                got = await self._call(slot, _CURSOR, ranges_pb.GetCursorRequest(name=s.name))
            except grpc.aio.AioRpcError:
                return False
        cur = ranges_pb.Cursor.FromString(got)
        engine = self.engine
        for k in shards:
            if k >= len(cur.offsets) or not self._still(t, k, slot) or engine.state.subs_by_uid.get(s.uid) is not s:
                continue
            floor, acked = cur.offsets[k], sorted(cur.acked[k].offsets) if k < len(cur.acked) else []
            mine = s.shards[k]
            if floor != mine.floor or set(acked) != {o for o in mine.acked if o >= floor}:
                end = engine.commit(R.Seek(s.uid, [floor], [acked], shard=k))
                await engine.durable(end, engine.state.shard_logs(t, engine.config.bundles)[k])
        return True

    async def _latest(self, t, slot: int, shards: list[int]) -> None:
        """How many of the region's messages the copy shards `shards` have not yet (the lag's count)."""
        try:
            got = ranges_pb.LatestOffsetsResponse.FromString(
                await self._call(slot, _LATEST, ranges_pb.LatestOffsetsRequest(topic=t.name)))
        except grpc.aio.AioRpcError:
            return
        lag = self._lag(t, slot)
        latest = {s.shard: s.latest for s in got.shards}
        lag.behind = sum(max(0, latest.get(k, 0) - t.shards[k].next) for k in shards)

    def _lag(self, t, slot: int) -> CopyLag:
        return self.lags.setdefault((t.name, self.gateways.names.get(slot, str(slot))), CopyLag())

    async def _call(self, slot: int, method: str, req) -> bytes:
        address = self.gateways.address(slot)
        if not address:
            raise _NoGateway()
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = tls.peer_channel(self.config, address, [
                ("grpc.max_receive_message_length", -1)])
        call = ch.unary_unary(method, request_serializer=_same, response_deserializer=_same)
        return await call(req.SerializeToString(), timeout=limits.copy_call_s,
                          metadata=((REGION, self.config.node_id), (COPY, "1")))

    def statistics(self) -> list[tuple[str, str, float | None, int, int, float]]:
        """(topic, region, lag seconds — None when it copies none of it now —, messages behind, copied, age of the
        ack state) of each copy this node has worked on."""
        now_ms = int(time.time() * 1000)
        return [(topic, region, lag.seconds(now_ms), lag.behind, lag.copied,
                 (now_ms - lag.followed_ms) / 1000 if lag.followed_ms else float("inf"))
                for (topic, region), lag in sorted(self.lags.items())]

    def collect(self):
        labels = ["topic", "region"]
        seconds = GaugeMetricFamily("pigeon_region_copy_lag_seconds", "What the region stored in the last this "
                                    "many seconds may not be in this node's copy of it yet (+Inf: not read yet)",
                                    labels=labels)
        behind = GaugeMetricFamily("pigeon_region_copy_lag_messages", "Messages the region holds that this node's "
                                   "copy of it does not yet (at the last count)", labels=labels)
        copied = CounterMetricFamily("pigeon_region_copied_messages", "Messages this node copied from the region",
                                     labels=labels)
        acks = GaugeMetricFamily("pigeon_region_copy_acks_age_seconds", "How old the subscriptions' ack state in "
                                 "this node's copy of the region is (acks since may come again after a failover)",
                                 labels=labels)
        for topic, region, lag_s, n, done, age in self.statistics():
            copied.add_metric([topic, region], done)
            if lag_s is not None:  # (a copy this node works on now)
                seconds.add_metric([topic, region], lag_s)
                behind.add_metric([topic, region], n)
                acks.add_metric([topic, region], age)
        yield from (seconds, behind, copied, acks)


class _NoGateway(grpc.aio.AioRpcError):
    def __init__(self):
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                         "no gateway of the region is known")
