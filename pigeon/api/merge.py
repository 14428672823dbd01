"""A StreamingPull that a node serves through other nodes' streams, merged into the client's: of a topic whose shards
are spread over the cluster's nodes (docs/cluster.md, "Scale-out", step 3), one stream to each owner of its shards
— this node's own share too, served in this process as a stream of its own; of a topic in one bundle that another node owns, one stream to
that owner; and a client's stream this node served itself until the subscription's bundle, or a shard of its
topic, moved away (`follow`: the client's requests read meanwhile wait for the merge, `Handoff`). Owns the rules:

  * the owners' responses go down as they come; the client's acks and deadline changes go up to the owner of
    each id's shard (an id it cannot read: to the first stream, whose owner answers for it);
  * the client's flow control is shared among the owners' streams by demand (`demand_shares`; the shares add up
    to the client's limit, though a share shrunk is used up only as the client acks what it holds): a stream
    delivers while it did lately or since its share was last set (silent since, it is held by its share);
  * an owner's stream that ends retryably (its shards moved, its owner died or stepped down: UNAVAILABLE; or
    any status the client libraries reopen a stream on — gRPC's own INTERNAL when the connection to a killed
    owner broke under a write, say) is replaced, not passed on: once the topic's shards have owners again (Router.spread_settled, Router.for_stream)
    a stream is opened to each owner that has none, and the ended stream's shards' acks go to their new owners
    (those it took in its last limits.merge_resend_s too: an owner handing a shard over refuses them) —
    the ids the client holds stay good there (the leases are in each shard's log: docs/cluster.md, invariant O2),
    and what the ended stream had leased and the client never acked comes again after its ack deadline. A client
    thus sees no error while the load balancer, a drain or a failover moves the shards under it. Replacements
    that follow each other back off (limits.merge_reopen_s, doubling up to limits.merge_reopen_s_max); the
    client's stream ends with UNAVAILABLE (which every client retries) only when a shard finds no owner within
    limits.forward_s_max, when this node shuts down, and when regions come or go (it reopens over every
    region's shards);
  * another region's shards are one more stream, through a gateway of that region (docs/regions.md), opened
    again with backoff whenever it ends while the others go on — a region cut off delays its own messages only;
  * any other end of an owner's stream (NOT_FOUND: the subscription was deleted; FAILED_PRECONDITION: detached)
    ends the client's with it; the client's half-close ends nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import NamedTuple

import grpc

from pigeon.api.errors import Relayed
from pigeon.api.router import Owner, Part
from pigeon.api.spread import shard_of
from pigeon.core import hot, limits
from pigeon.core.errors import Unavailable
from pigeon.core.pubsub_types import types

_StreamingPullRequest = types.StreamingPullRequest.pb()
_STREAMING_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"
_REGIONS_CHANGED = "The regions serving the subscription's topic changed; reconnect."
# the statuses on which the client libraries open a StreamingPull again (google-cloud-pubsub's
# _RETRYABLE_STREAM_ERRORS): an owner's stream ending so is replaced, not passed on
_REOPENED = frozenset((grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                       grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED))

log = logging.getLogger("pigeon.router")


class _Up:
    """One owner's stream of a merge: its requests' queue (the first its head), when it last delivered, and its
    share of the client's flow control (messages, bytes)."""

    def __init__(self, owner: Owner, here: bool, key, now: float):
        self.owner, self.here, self.key = owner, here, key
        self.q: asyncio.Queue = asyncio.Queue()
        self.last = now
        self.share: tuple[int, int] | None = None  # (None until its head is queued)
        self.delivered = False  # whether it delivered since its share was last set (then silent: held by it)
        self.ended = False
        self.sent: deque = deque()  # (when, request) of the acks and deadline changes sent up lately


async def streaming_pull(router, t, first, requests, context, here):
    """The responses of one stream to each owner of spread topic `t`'s shards, merged (see the module's rules).
    `here(first, requests)`: this node's share, served in this process (grpc_api's `own_share`)."""
    merge = _Merge(router, lambda: router.spread_settled(t), first, context, here, regions=True)
    async for resp in merge.run(requests, await router.spread_settled(t)):
        yield resp


async def forwarded(router, owner: Owner, first, requests, context, here):
    """A StreamingPull of a topic in one bundle, which `owner` serves: forwarded there as a merge of one stream,
    so that it too outlives a move of the bundle (replaced by a stream to the bundle's next owner — this node's
    own stream when that is this node — or, once a shard of the topic was handed to another bundle, by one
    to each shard's owner)."""
    async def settled():
        t = await router.spread_subscription(first.subscription, context)  # (a shard of it handed to another
        if t is not None:  # bundle since: every shard's owner)
            return await router.spread_settled(t)
        return [Part(await router.for_stream(first.subscription, context), ())]

    merge = _Merge(router, settled, first, context, here, regions=False)
    async for resp in merge.run(requests, [Part(owner, ())]):
        yield resp


async def follow(router, first, requests, context, here):
    """A client's stream this node served until the subscription's bundle (or a shard of its topic) moved away:
    it goes on as a merge of the streams of the subscription's owners now — the leases it held are theirs, and the
    client's acks of them go there."""
    t = await router.spread_subscription(first.subscription, context)
    if t is not None:
        moved = streaming_pull(router, t, first, requests, context, here)
    else:
        moved = forwarded(router, await router.for_stream(first.subscription, context), first, requests, context,
                          here)
    async for resp in moved:
        yield resp


class Handoff:
    """A stream's client requests, read by the task that reads them for the stream served here, passed on once
    the stream follows its subscription elsewhere (`follow`): a request iterator cannot change hands (a read
    cancelled closes it). Those read after the stream here broke and before it follows wait for it."""

    def __init__(self):
        self.q: asyncio.Queue | None = None
        self._early: list = []

    def put(self, req) -> None:
        """A client request (None: the client half-closed)."""
        if self.q is None:
            self._early.append(req)
        else:
            self.q.put_nowait(req)

    def requests(self):
        """The client's requests from here on, for `follow`."""
        self.q = asyncio.Queue()
        for req in self._early:
            self.q.put_nowait(req)
        self._early.clear()
        return _requests(self.q)


class _Merge:
    def __init__(self, router, settled, first, context, here, regions: bool):
        self.router, self.settled, self.first, self.context, self.here = router, settled, first, context, here
        self.regions = regions  # (a spread topic's: regions that come or go end the client's stream)
        self.head = _StreamingPullRequest()  # what a newly opened owner's stream starts with (its share set then)
        self.head.CopyFrom(first)
        del self.head.ack_ids[:], self.head.modify_deadline_ack_ids[:], self.head.modify_deadline_seconds[:]
        self.limit = (first.max_outstanding_messages, first.max_outstanding_bytes)
        loop = asyncio.get_running_loop()
        self.now = loop.time
        self.ups: list[_Up] = []
        self.owner_of: dict[int, _Up] = {}  # shard → the stream its acks go up
        self.held: list = []  # acks and deadline changes for a shard whose stream ended, until it has another
        self.down: asyncio.Queue = asyncio.Queue()  # the owners' responses, then what ended the merge (_Ended)
        self.tasks: set[asyncio.Task] = set()
        self.reopen_s, self.reopened_at = limits.merge_reopen_s, -1e9
        self._routed: tuple | None = None  # (owner_of, first stream, `_routes`' answer) as last worked out

    async def run(self, requests, parts):
        self.open(parts)
        self.route(self.first)
        self.spawn(self.client(requests))
        if self.regions:
            self.spawn(self.regions_change())
        if any(x > 0 for x in self.limit):
            self.spawn(self.steer())
        try:
            while True:
                resp = await self.down.get()
                if type(resp) is _Ended:
                    raise resp.why
                yield resp
        finally:
            for task in list(self.tasks):
                task.cancel()

    def spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        """A task's failure ends the client's stream, after the responses the owners sent before it."""
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.down.put_nowait(_Ended(task.exception()))

    # --- the owners' streams -----------------------------------------------------------------------------
    def open(self, parts) -> None:
        """A stream to each owner in `parts` that has none open; every shard's acks to its owner's stream, and the
        flow control shared anew among them all."""
        dial = self.router.cluster.info.dial
        have = {u.key: u for u in self.ups}
        owner_of: dict[int, _Up] = {}
        for p in parts:
            owner = p.owner or Owner(dial, ())  # (this node's share: served in this process)
            key = ("region", owner.log_ids) if owner.gateway else owner.address
            u = have.get(key)
            if u is None:
                u = have[key] = _Up(owner, p.owner is None, key, self.now())
                self.ups.append(u)
                self.spawn(self.across(u) if owner.gateway else self.upstream(u))
            for k in p.shards:
                owner_of[k] = u
        self.owner_of = owner_of
        self.share_out(self._busy(new=True))  # (a stream opened now counts as delivering: it may hold a moved
        #                                        shard's backlog)

    def share_out(self, busy: set[int]) -> None:
        """Give each owner's stream its share of the client's flow control (`busy`: the streams that delivered
        lately): in its head for a stream not started yet, else as a request of its own."""
        n = len(self.ups)
        if not n:  # (its only stream ended, and is being replaced)
            return
        new = [demand_shares(x, n, busy) for x in self.limit]
        for i, u in enumerate(self.ups):
            share = (new[0][i], new[1][i])
            if u.share is None:
                head = _StreamingPullRequest()
                head.CopyFrom(self.head)
                head.max_outstanding_messages, head.max_outstanding_bytes = share
                u.q.put_nowait(head)
            elif share != u.share:
                u.q.put_nowait(_StreamingPullRequest(max_outstanding_messages=share[0], max_outstanding_bytes=share[1]))
                u.delivered = False
            u.share = share

    def _busy(self, new: bool = False) -> set[int]:
        """The streams that deliver: those that did within the last two turns of the steering, and those that did
        since their share was last set — silent since, they are held by it, not out of messages (`new`: and those
        not started yet)."""
        now, window = self.now(), 2 * limits.merge_steer_s
        return {i for i, u in enumerate(self.ups)
                if now - u.last < window or u.delivered or (new and u.share is None)}

    async def upstream(self, u: _Up) -> None:
        """An owner's stream of this region, replaced when it ends retryably."""
        try:
            head = await u.q.get()
            source = self.here(head, self._sending(u)) if u.here else self.router.stream(
                u.owner, _STREAMING_PULL, head.SerializeToString(), self._sending(u), self.context)
            async with contextlib.aclosing(source):
                async for resp in source:
                    u.last, u.delivered = self.now(), True
                    self.down.put_nowait(resp)
            why = "its stream ended"
        except Unavailable as e:
            why = str(e)
        except Relayed as e:
            if e.code not in _REOPENED:
                raise
            why = e.details
        await self.replace(u, why)

    async def replace(self, u: _Up, why: str) -> None:
        """`u` ended retryably: once every shard has an owner again, a stream to each owner that has none, and the
        acks meant for `u` sent to their shards' owners now."""
        u.ended = True
        self.ups.remove(u)
        now = self.now()
        self.held += [req for at, req in u.sent if now - at <= limits.merge_resend_s]  # (applied there or not)
        while not u.q.empty():
            req = u.q.get_nowait()
            if req.ack_ids or req.modify_deadline_ack_ids:
                self.held.append(req)
        if self.router.engine.closing:
            raise Unavailable(why)
        self.reopen_s = limits.merge_reopen_s if now - self.reopened_at > limits.merge_reopen_quiet_s \
            else min(limits.merge_reopen_s_max, self.reopen_s * 2)
        log.info("a merged stream of %s lost its part at %s (%s); opened again where its shards are now in %.2f s",
                 self.head.subscription, u.owner.address, why, self.reopen_s)
        await asyncio.sleep(self.reopen_s)
        self.reopened_at = self.now()
        self.open(await self.settled())  # (Unavailable after limits.forward_s_max: ends the client's stream)
        held, self.held = self.held, []
        for req in held:
            self.route(req)

    async def _sending(self, u: _Up):
        """`u`'s requests as they go up, the acks and deadline changes among them noted for `merge_resend_s`: an
        owner that ends its stream retryably may not have applied them, and the replacement sends them again
        (an ack or a deadline change applied twice is applied once)."""
        sent, window = u.sent, limits.merge_resend_s
        while (r := await u.q.get()) is not None:
            if r.ack_ids or r.modify_deadline_ack_ids:
                now = self.now()
                sent.append((now, r))
                while sent and sent[0][0] < now - window:
                    sent.popleft()
            yield r

    async def across(self, u: _Up) -> None:
        """Another region's share: opened again whenever it ends (what its stream had leased comes again after
        its ack deadline), at limits.region_reopen_s apart at first, up to limits.region_reopen_s_max."""
        delay, logs, head = limits.region_reopen_s, u.owner.log_ids, (await u.q.get()).SerializeToString()
        while True:
            owner = Owner(self.router.cluster.address_of(logs[0]) or "", logs, gateway=True)
            why = "no gateway of the region is known"
            if owner.address:
                try:
                    async for resp in self.router.stream(owner, _STREAMING_PULL, head, _requests(u.q), self.context,
                                                         watch=False):
                        u.last = self.now()
                        delay = limits.region_reopen_s
                        self.down.put_nowait(resp)
                    why = "its stream ended"
                except Exception as e:  # noqa: BLE001 — any end of another region's stream: opened again
                    why = str(e) or type(e).__name__
            log.info("a stream of %s from another region (%s): %s; opened again in %.1f s", self.head.subscription,
                     owner.address or "-", why, delay)
            await asyncio.sleep(delay)
            delay = min(limits.region_reopen_s_max, delay * 2)

    # --- the client's side -------------------------------------------------------------------------------
    async def client(self, requests) -> None:
        async for req in requests:
            if hasattr(req, "refused"):  # (api.errors.Unparsable: the stream ends with its error)
                raise req.refused()
            self.route(req)
            if req.stream_ack_deadline_seconds:
                self.head.stream_ack_deadline_seconds = req.stream_ack_deadline_seconds
                for u in self.ups:
                    u.q.put_nowait(_StreamingPullRequest(stream_ack_deadline_seconds=req.stream_ack_deadline_seconds))

    def route(self, req) -> None:
        """A client request's ack ids and deadline changes, each to the stream of its shard's owner (one it cannot
        read goes to the first, whose owner answers for it); held while that stream is being replaced."""
        if not (req.ack_ids or req.modify_deadline_ack_ids) or not self.ups:
            if req.ack_ids or req.modify_deadline_ack_ids:
                self.held.append(req)
            return
        first = self.ups[0]
        if len(self.ups) == 1 and not self.owner_of:  # (a topic in one bundle: all to its owner, whole)
            return first.q.put_nowait(_StreamingPullRequest(
                ack_ids=req.ack_ids, modify_deadline_ack_ids=req.modify_deadline_ack_ids,
                modify_deadline_seconds=req.modify_deadline_seconds))
        out: dict[_Up, object] = {}

        def to(u: _Up):
            o = out.get(u)
            if o is None:
                o = out[u] = _StreamingPullRequest()
            return o

        if req.ack_ids:  # (the many: split in one compiled pass)
            targets, table = self._routes(first)
            for u, ids in zip(targets, hot.ack_groups(req.ack_ids, table, len(targets), limits.shard_bits)):
                if ids:
                    to(u).ack_ids.extend(ids)
        for a, sec in zip(req.modify_deadline_ack_ids, req.modify_deadline_seconds):
            o = to(self.owner_of.get(shard_of(a), first))
            o.modify_deadline_ack_ids.append(a)
            o.modify_deadline_seconds.append(sec)
        for u, o in out.items():
            (self.held.append if u.ended else u.q.put_nowait)(o)

    def _routes(self, first: _Up) -> tuple[list[_Up], list[int]]:
        """The streams the shards' acks go up (`first` first: it takes those of shards no stream has, and ids it
        cannot read), and each shard's index among them — kept until `owner_of` or the first stream changes."""
        cached = self._routed
        if cached is not None and cached[0] is self.owner_of and cached[1] is first:
            return cached[2], cached[3]
        targets, at, table = [first], {first: 0}, []
        for k in range(max(self.owner_of, default=-1) + 1):
            u = self.owner_of.get(k, first)
            i = at.get(u)
            if i is None:
                i = at[u] = len(targets)
                targets.append(u)
            table.append(i)
        self._routed = (self.owner_of, first, targets, table)
        return targets, table

    async def steer(self) -> None:
        """Move the client's flow control to the owners whose shards deliver: an owner silent for two turns keeps
        a floor of it (its first messages go out at once; then it is steered more)."""
        while True:
            await asyncio.sleep(limits.merge_steer_s)
            self.share_out(self._busy())

    async def regions_change(self) -> None:
        """A region that comes to hold its slot has shards of the topic to serve, and one declared lost has its
        copies serve in its place: the client's stream ends (it reopens over every region's)."""
        gateways = self.router.cluster.gateways
        if gateways is None:
            return
        held, lost = set(gateways.held), set(gateways.lost)
        while gateways.held == held and gateways.lost == lost:
            await gateways.changed.wait()
        raise Unavailable(_REGIONS_CHANGED)


class _Ended(NamedTuple):
    why: BaseException


async def _requests(q: asyncio.Queue):
    while (r := await q.get()) is not None:
        yield r


def demand_shares(limit: int, n: int, busy: set[int]) -> list[int]:
    """A client's flow-control limit (messages or bytes; 0 or less: none) shared among n owners' streams: evenly
    while all or none deliver, else a floor (an eighth of an even share, at least 1) to each silent one and the
    rest evenly to the busy ones. None stays none."""
    if limit <= 0:
        return [0] * n
    if not busy or len(busy) == n:
        return [max(1, limit // n)] * n
    floor = max(1, limit // (8 * n))
    rest = max(1, (limit - floor * (n - len(busy))) // len(busy))
    return [rest if i in busy else floor for i in range(n)]
