"""The router role of a cluster node (docs/cluster.md, "Parties"): a call about a topic or subscription whose
bundle another node owns is forwarded to that node, bytes as they came, and its answer (or its status, with its
details) passed back as it came — so a client may use any node. Owns the rules:

  * a topic's bundle is known from its name alone; a subscription's is its topic's, from the metadata every node
    holds (caught up from etcd first when the name is not known here yet);
  * a call is forwarded at most once: a node that receives a forwarded call for a bundle it does not own (the
    ownership moved meanwhile) answers UNAVAILABLE, which the clients retry, rather than forwarding again;
  * a bundle with no owner (moving between nodes) answers UNAVAILABLE as well — of a spread topic's shards,
    only the ones a call needs: a keyless publish goes to a shard that has an owner;
  * a forwarded call that waits by design (Pull, StreamingPull, Take) ends with UNAVAILABLE as soon as the
    bundle's owner is no longer the node it went to: a paused or cut-off owner would otherwise hold it until
    its own deadline, long after the bundle moved (the client's retry reaches the new owner);
  * on a secured cluster a forwarded call goes over mutual TLS with this node's certificate and carries the
    caller's verified principal, never its credential (api.access believes it only from a node);
  * in a deployment of regions (docs/regions.md) the shards another region stores are that region's part of a
    topic: a call about them goes to one of its gateways, marked as from another region, and a node that takes
    such a call serves its own region's shards only (so a call crosses regions at most once);
  * a topic's message storage policy (docs/regions.md, "Publish nearby"): a publish taken in a region the policy
    leaves out is forwarded whole to the nearest allowed region — unless the policy enforces it in transit, when
    it is refused with FAILED_PRECONDITION, as a Pull or StreamingPull taken there is."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from typing import NamedTuple

import grpc

from pigeon.api import access
from pigeon.core.pubsub_types import types
from pigeon.api.errors import Relayed
from pigeon.core import limits
from pigeon.core.bundles import META_LOG, bundle_log
from pigeon.core.regions import copy_region, is_region_log, region_log, slot_of_log
from pigeon.core.errors import FailedPrecondition, Unavailable, Unimplemented
from pigeon.node.engine import SHUTTING_DOWN
from pigeon.ops import tls

log = logging.getLogger("pigeon.router")

FORWARDED = "x-pigeon-forwarded"
REGION = access.REGION  # a call from another region's node: about this region's shards only
_FROM_REGION: contextvars.ContextVar[bool] = contextvars.ContextVar("pigeon_from_region", default=False)
_MOVED = "The topic's bundle moved to another node; retry."


class Owner(NamedTuple):
    """Where a call goes: the owner's address, and the logs it owns that the call is about (a spread topic's
    shards' that it owns, or one bundle's) — or a gateway of another region, for the shards that region stores
    (its address "" while none is known: a call to it fails)."""
    address: str
    log_ids: tuple[int, ...]
    gateway: bool = False

    def moved(self, cluster) -> bool:
        """Whether the routes name another owner of one of its logs now."""
        return any(cluster.address_of(log) != self.address for log in self.log_ids)


class Part(NamedTuple):
    """One owner's share of a spread topic: where (None: this node) and which shards."""
    owner: Owner | None
    shards: tuple[int, ...]

_same = lambda b: b  # noqa: E731 — bytes pass through unparsed
_RETRYABLE = "The topic's bundle is moving between nodes; retry."
_PUBLISH = "/google.pubsub.v1.Publisher/Publish"
_PublishRequest = types.PublishRequest.pb()


class Router:
    def __init__(self, engine, cluster):
        self.engine, self.cluster = engine, cluster
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._waiting: set[_MoveWatch] = set()  # forwarded calls that wait by design, open now
        self._forwards: dict = {}  # the other forwarded calls in flight → their owner
        self._cut: set = set()  # … those cut because their owner moved
        self._cutter: asyncio.Task | None = None  # cuts those whose owner moved (_cut_moved)
        self.forwarded = 0  # calls passed to another node
        self._turn = 0  # keyless publishes of a spread topic none of whose shards is here: the owners in turn
        self._silent: dict[tuple[int, ...], float] = {}  # another region's logs → until when a Pull skips it
        self._refused: dict[tuple[int, str], list[float]] = {}  # (log, why) → [refused since, last, last said]

    # --- where a call goes ---------------------------------------------------------------------------------
    def _owner(self, log_id: int, context) -> Owner | None:
        """None to serve here; else the owner."""
        if log_id == META_LOG or self.engine.owns(log_id):
            return None
        self.engine.check_open()
        if any(k == FORWARDED for k, _ in (context.invocation_metadata() or ())):
            self._refusing(log_id, "a call forwarded here, for a log this node does not serve")
            raise Unavailable(_RETRYABLE)
        address = self.cluster.address_of(log_id)
        if address is None or address == self.cluster.info.dial:  # no owner, or this node is taking it over
            self._refusing(log_id, "no owner in this node's routes" if address is None else
                           "this node's routes name it the owner, but it does not serve the log (yet)")
            raise Unavailable(_RETRYABLE)
        return Owner(address, (log_id,))

    def _refusing(self, log_id: int, why: str) -> None:
        """Say why calls about `log_id` are refused — once a while (limits.refusal_log_s): a move refuses them for
        a fraction of a second, and a refusal that goes on for longer should name itself in the log."""
        now = time.monotonic()  # (what is said, not what is done: the wall's clock, loop or none)
        seen = self._refused.get((log_id, why))
        if seen is None or now - seen[1] > 1.0:  # (refusals a second apart: a new spell)
            seen = self._refused[(log_id, why)] = [now, now, now]
        seen[1] = now
        if now - seen[2] >= limits.refusal_log_s:
            seen[2] = now
            log.warning("calls about log %d refused with UNAVAILABLE for %.0f s: %s", log_id, now - seen[0], why)

    @staticmethod
    def forwarded_call(context) -> bool:
        return any(k == FORWARDED for k, _ in (context.invocation_metadata() or ()))

    def for_topic(self, topic: str, context) -> Owner | None:
        t = self.engine.state.topics.get(topic)
        if t is not None and t.spread:  # each shard's owner answers for its own: a call about them all is split
            if self.forwarded_call(context):
                return None
            raise Unimplemented(f"This call about the topic {topic}, whose shards are spread over the cluster's "
                                "nodes (--topic-layout spread), is not supported yet.")
        return self._owner(bundle_log(topic, self.engine.config.bundles), context)

    def shard_owner(self, t, shard: int) -> Owner | None:
        """The owner of one shard of spread topic `t` (None: this node, or a shard it does not have: answered
        here); Unavailable while that shard has no owner (moving) — another's moving does not matter."""
        moving: list[int] = []
        parts = self.spread(t, moving)
        if shard in moving:
            raise Unavailable(_RETRYABLE)
        return next((p.owner for p in parts if shard in p.shards), None)

    def spread(self, topic, moving: list[int] | None = None) -> list[Part] | None:
        """The owners of a spread topic's shards (this node's share first, other regions' gateways last), or None
        for a topic together in one bundle. Unavailable while a shard of this region has no owner (moving) —
        unless the caller gives `moving`: such shards are then left out of the parts and listed there (a call that
        needs some shards only need not wait for another's move). A call from another region sees this region's
        shards only."""
        if topic is None or not topic.spread:
            return None
        groups: dict[str | int | None, tuple[list[int], list[int]]] = {}
        here_only = _FROM_REGION.get()
        lost = self.cluster.gateways.lost if self.cluster.gateways is not None else ()
        copies = topic.copies
        for k, log in enumerate(self.engine.state.shard_logs(topic, self.engine.config.bundles)):
            if copies and k in copies and (slot := k // (len(topic.shards) // self.engine.region.slots)) not in lost:
                log = region_log(slot)  # (a copy held back here: its region serves it — api.region_copies)
            elif lost and is_region_log(log) and slot_of_log(log) in lost:
                log = self._copied_to(topic, lost)  # (a region lost for good: its copies serve, where there are)
                if log is None:
                    continue
            if is_region_log(log):
                if not here_only and self.cluster.region_held(log):
                    shards, logs = groups.setdefault(slot_of_log(log), ([], []))
                    shards.append(k)
                    logs.append(log)
                continue
            address = None
            if not self.engine.owns(log):
                address = self.cluster.address_of(log)
                if address is None or address == self.cluster.info.dial:
                    if moving is None:
                        self._refusing(log, "a shard of a spread topic has no owner in this node's routes" if
                                       address is None else "this node's routes name it the owner of a shard's "
                                       "log, but it does not serve the log (yet)")
                        raise Unavailable(_RETRYABLE)
                    moving.append(k)
                    continue
            shards, logs = groups.setdefault(address, ([], []))
            shards.append(k)
            logs.append(log)
        return sorted((Part(self._owner_of_group(a, tuple(logs)), tuple(shards)) for a, (shards, logs) in groups.items()),
                      key=lambda p: 0 if p.owner is None else 2 if p.owner.gateway else 1)

    def _copied_to(self, topic, lost) -> int | None:
        """The region log of the region `topic` is copied to (its label), when that region is there."""
        name = copy_region(topic.config.labels)
        slot = next((s for s, n in self.cluster.gateways.names.items() if n == name), None) if name else None
        return None if slot is None or slot in lost else region_log(slot)

    def _owner_of_group(self, key, logs: tuple[int, ...]) -> Owner | None:
        if isinstance(key, int):  # another region's slot: one of its gateways
            return Owner(self.cluster.address_of(logs[0]) or "", logs, gateway=True)
        return None if key is None else Owner(key, logs)

    def answers(self, gateway: Owner) -> bool:
        """Whether a Pull asks another region now: not for limits.region_silent_s after it did not answer."""
        until = self._silent.get(gateway.log_ids)
        return until is None or asyncio.get_running_loop().time() >= until

    def silent(self, gateway: Owner) -> None:
        self._silent[gateway.log_ids] = asyncio.get_running_loop().time() + limits.region_silent_s

    @staticmethod
    def _take_region_mark(context) -> None:
        """A call another region's node sent: from now on, in this call, a topic's parts are this region's."""
        if any(k == REGION for k, _ in (context.invocation_metadata() or ())):
            _FROM_REGION.set(True)

    async def spread_topic(self, name: str, context):
        """The spread topic `name` when this call must be split over its shards' owners; None to route as
        always (a topic together in one bundle, or a call another node forwarded here: this node's share). A
        topic not known here yet is looked for in the cluster's metadata first: its layout decides the route."""
        self._take_region_mark(context)
        if name not in self.engine.state.topics and self.engine.meta_log is not None:
            await self.engine.meta_log.catch_up()
        t = self.engine.state.topics.get(name)
        return t if t is not None and t.spread and not self.forwarded_call(context) else None

    async def spread_subscription(self, name: str, context):
        """`spread_topic` for a subscription's topic."""
        self._take_region_mark(context)
        state = self.engine.state
        if name not in state.subs and self.engine.meta_log is not None:
            await self.engine.meta_log.catch_up()
        s = state.subs.get(name)
        t = s.topic if s is not None else None
        return t if t is not None and t.spread and not self.forwarded_call(context) else None

    async def for_subscription(self, name: str, context) -> Owner | None:
        state = self.engine.state
        if name not in state.subs and self.engine.meta_log is not None:
            await self.engine.meta_log.catch_up()
        if name not in state.subs:
            return None  # answered here: NOT_FOUND
        t = state.subs[name].topic
        if t is not None and t.spread:  # (the calls served from every shard are split before they come here)
            if self.forwarded_call(context):
                return None
            raise Unimplemented(f"This call about the subscription {name}, whose topic's shards are spread over "
                                "the cluster's nodes (--topic-layout spread), is not supported yet.")
        return self._owner(state.log_of_sub(name, self.engine.config.bundles), context)

    async def for_stream(self, name: str, context) -> Owner | None:
        """`for_subscription` for a StreamingPull: while the bundle has no owner (moving), it waits for one
        (limits.forward_s_max at most) instead of answering UNAVAILABLE at once. The official clients reopen a
        stream at most 5 times in 10 s (google.api_core's bidi throttle): refusals a few milliseconds apart spend
        them all during a move, and delivery then stalls for 10 s where the move took a fraction of one."""
        deadline = asyncio.get_running_loop().time() + limits.forward_s_max
        while True:
            try:
                return await self.for_subscription(name, context)
            except Unavailable:
                if self.engine.closing or asyncio.get_running_loop().time() >= deadline:
                    raise
                await self._routes_change(0.1)

    async def spread_settled(self, topic) -> list[Part]:
        """`spread` for a StreamingPull (one stream to each owner, for the stream's life): while a shard has no
        owner (moving), it waits for one (limits.forward_s_max at most), as `for_stream` does, rather than spend
        one of the client's few reopens on a move that takes a fraction of a second."""
        deadline = asyncio.get_running_loop().time() + limits.forward_s_max
        while True:
            try:
                return self.spread(topic)
            except Unavailable:
                if self.engine.closing or asyncio.get_running_loop().time() >= deadline:
                    raise
                await self._routes_change(0.1)

    async def _routes_change(self, timeout: float) -> None:
        """Until the routes change or `timeout` passed (a takeover ends with this node owning the bundle, which
        the routes do not show: callers check again either way)."""
        try:
            await asyncio.wait_for(self.cluster.routes_changed().wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _until_moved(self, owner: Owner) -> None:
        """A stream forwarded to an owner that cannot be reached (killed, stopping): wait until the routes name
        another (limits.forward_s_max at most), so that the client's reopen, which the UNAVAILABLE that follows
        asks for, finds it rather than spending one of its few reopens (for_stream) on the same dead end."""
        deadline = asyncio.get_running_loop().time() + limits.forward_s_max
        while not self.engine.closing and not owner.moved(self.cluster) and \
                asyncio.get_running_loop().time() < deadline:
            await self._routes_change(0.1)

    # --- forwarding ----------------------------------------------------------------------------------------
    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = tls.peer_channel(self.engine.config, address, [
                ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        return ch

    def _metadata(self, context, owner: Owner | None = None):
        """The call's metadata for the owner, marked forwarded (to another region's gateway: marked from another
        region). On a secured node the caller's credential stays here: its verified principal travels instead,
        believed only from a node (api.access)."""
        caller = access.CALLER.get()
        drop = (access.PRINCIPAL, "authorization") if caller is not None else ()
        mark = REGION if owner is not None and owner.gateway else FORWARDED
        md = tuple((k, v) for k, v in (context.invocation_metadata() or ()) if not k.startswith("grpc-")
                   and k not in drop) + ((mark, self.cluster.info.node_id),)
        return md + ((access.PRINCIPAL, caller),) if caller is not None else md

    def peer_metadata(self) -> tuple:
        """Metadata of a node's own call to a peer on its caller's behalf (the monitoring pages)."""
        caller = access.CALLER.get()
        return ((access.PRINCIPAL, caller),) if caller is not None else ()

    async def unary(self, owner: Owner, method: str, request: bytes, context, waits: bool = False,
                    extra: tuple = ()) -> bytes:
        """Forward one call. One that does not wait by design (all but a Pull) gets at most
        limits.forward_s_max: an owner that does not answer by then is paused or cut off, and the client's
        retry finds the bundle's new owner once it has been taken over (UNAVAILABLE meanwhile). One that waits
        ends when the bundle moves away from the owner."""
        call = self.channel(owner.address).unary_unary(method, request_serializer=_same,
                                                        response_deserializer=_same)
        self.forwarded += 1
        left = context.time_remaining()
        timeout = left if waits else min(left or limits.forward_s_max, limits.forward_s_max)
        pending = call(request, timeout=timeout, metadata=self._metadata(context, owner) + extra)
        try:
            if not waits:
                return await self._unless_moved(owner, pending)
            async with self._cut_when_moved(owner, pending):
                return await pending
        except grpc.aio.AioRpcError as e:
            raise _relayed(e, owner.address) from None

    async def _unless_moved(self, owner: Owner, pending) -> bytes:
        """`pending`'s answer — or Unavailable once the routes name another owner of its logs (the client's retry
        goes there): an owner that was paused, or cut off, past its session would hold the call until its
        deadline, though its bundles are served elsewhere by then."""
        if self._cutter is None or self._cutter.done():
            self._cutter = asyncio.get_running_loop().create_task(self._cut_moved())
        self._forwards[pending] = owner
        try:
            return await pending
        except asyncio.CancelledError:
            if pending in self._cut:  # (cut here, not by our caller)
                raise Unavailable(_MOVED) from None
            raise
        finally:
            del self._forwards[pending]
            self._cut.discard(pending)

    async def _cut_moved(self) -> None:
        """One task for every forwarded call that does not wait by design: cuts those whose owner moved."""
        while self._forwards:
            await self.cluster.routes_changed().wait()
            for call, owner in list(self._forwards.items()):
                if call not in self._cut and owner.moved(self.cluster):
                    self._cut.add(call)
                    call.cancel()

    def publish_owner(self, t, ordering_key: str) -> Owner | None:
        """Where a publish to spread topic `t` is stored (None: here). A keyed batch goes to its key's shard, for
        per-key order; a keyless one to a shard of this node's when it has one (the nearest forwarder: no hop),
        else to the owners in turn. A shard moving between nodes refuses only the batches that must go to it (its
        keys'): a keyless batch goes to a shard that has an owner (refused while any one of many moved, every
        publisher of a topic spread over the nodes would meet UNAVAILABLE at each move the load balancer makes)."""
        moving: list[int] = []
        parts = self.spread(t, moving)
        if ordering_key:
            shard = t.shard_for(ordering_key)
            if shard in moving:
                raise Unavailable(_RETRYABLE)
            return next(p.owner for p in parts if shard in p.shards)
        copies = t.copies  # (a lost region's copies are served here, never published to: api.region_copies)
        parts = [p for p in parts if not copies or not copies.issuperset(p.shards)]
        if parts and parts[0].owner is None:
            return None
        parts = [p for p in parts if not p.owner.gateway]  # (stored in this region: docs/regions.md)
        if not parts:
            raise Unavailable(_RETRYABLE)
        self._turn += 1
        return parts[self._turn % len(parts)].owner

    def storage_owner(self, t) -> Owner | None:
        """Where a publish to `t` taken here is stored by its message storage policy: in this region (None) when
        the policy allows it (or there is none), else at a gateway of the nearest region it allows. Refused when
        the policy enforces it in transit; Unavailable when no allowed region can be reached now — or when the call
        came from another region already (the policy changed meanwhile: the client's retry goes the new way)."""
        policy = t.config.message_storage_policy
        region = self.engine.region
        if region is None or not policy.allowed_persistence_regions or region.name in policy.allowed_persistence_regions:
            return None
        self.check_in_transit(t)
        slot = None if _FROM_REGION.get() else self.cluster.gateways.nearest(policy.allowed_persistence_regions)
        if slot is None:
            raise Unavailable(f"None of the regions the message storage policy of {t.name} allows "
                              f"({', '.join(policy.allowed_persistence_regions)}) can be reached now; retry.")
        log_id = region_log(slot)
        return Owner(self.cluster.address_of(log_id), (log_id,), gateway=True)

    def check_in_transit(self, t) -> None:
        """FAILED_PRECONDITION for a publish, pull or streaming pull of `t` taken in a region that its message
        storage policy leaves out and enforces in transit (as Pub/Sub refuses it)."""
        policy = t.config.message_storage_policy
        region = self.engine.region
        if region is not None and policy.enforce_in_transit and policy.allowed_persistence_regions and \
                region.name not in policy.allowed_persistence_regions and not _FROM_REGION.get():
            raise FailedPrecondition(f"The message storage policy of {t.name} allows the regions "
                                     f"{', '.join(policy.allowed_persistence_regions)} and enforces it in transit: "
                                     f"this request was received in region {region.name}, which it does not allow.")

    async def publish_at_owner(self, topic: str, request: bytes) -> None:
        """A publish of this node's own (a dead-lettered message) to a topic another node owns: sent to the owner
        as a forwarded call; Unavailable when it has none now or does not answer (the caller tries again)."""
        t = self.engine.state.topics.get(topic)
        if t is not None and t.spread:
            key = _PublishRequest.FromString(request).messages[0].ordering_key
            owner = self.publish_owner(t, key)
            address = owner.address if owner is not None else None
        else:
            address = self.cluster.address_of(bundle_log(topic, self.engine.config.bundles))
        if address is None or address == self.cluster.info.dial:
            raise Unavailable(_RETRYABLE)
        call = self.channel(address).unary_unary(_PUBLISH, request_serializer=_same, response_deserializer=_same)
        self.forwarded += 1
        try:
            await call(request, timeout=limits.forward_s_max,
                       metadata=((FORWARDED, self.cluster.info.node_id),) + self.peer_metadata())
        except grpc.aio.AioRpcError as e:
            raise Unavailable(f"Publishing to {topic} at its owner ({address}) failed: {e.code().name} "
                              f"{e.details() or ''}".rstrip()) from None

    async def stream(self, owner: Owner, method: str, first: bytes, requests, context, watch: bool = True):
        """Forward a bidirectional stream: `first` then every later request (parsed: re-encoded) up, every
        response down, until the bundle moves away from the owner (unless not `watch`ed: one whose server ends it
        when its shards move)."""
        call = self.channel(owner.address).stream_stream(method, request_serializer=_same,
                                                          response_deserializer=_same)
        self.forwarded += 1
        it = call(metadata=self._metadata(context, owner))

        async def up():
            """The requests, written by a task this call ends: one grpc.aio runs itself, given an iterator, is
            ended by a cancel only while the call is open — after the owner ended the stream it waited on
            `requests` for good, and was destroyed pending when collected."""
            try:
                await it.write(first)
                async for req in requests:
                    await it.write(req.SerializeToString())
                await it.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                pass  # (the call ended: its status comes with the responses)
            except Exception:  # noqa: BLE001 — a bug on this side: the call ends CANCELLED, and says so here
                log.exception("forwarding a stream's requests to %s failed", owner.address)
                it.cancel()

        writer = asyncio.ensure_future(up())
        try:
            async with self._cut_when_moved(owner, it) if watch else contextlib.nullcontext():
                async for resp in it:
                    yield resp
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE and watch:
                await self._until_moved(owner)
            raise _relayed(e, owner.address) from None
        finally:
            it.cancel()
            writer.cancel()

    def _cut_when_moved(self, owner: Owner, call) -> "_MoveWatch":
        return _MoveWatch(self.cluster, owner, call, self._waiting)

    def end_waiting(self) -> None:
        """Shutting down: every forwarded call that waits by design ends now with UNAVAILABLE, which its client
        retries on another node (left open, the server's grace period would end it CANCELLED: final)."""
        for watch in list(self._waiting):
            watch.cut(SHUTTING_DOWN)

    async def close(self) -> None:
        if self._cutter is not None:
            self._cutter.cancel()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()


class _MoveWatch:
    """While its block runs, cancels `call` once the cluster's routes say `owner` no longer owns the log (or
    the node shuts down); the block then raises Unavailable (the cancellation is this watch's, not the
    caller's)."""

    def __init__(self, cluster, owner: Owner, call, open_watches: set):
        self.cluster, self.owner, self.call = cluster, owner, call
        self.why: str | None = None  # set when this watch cut the call
        self._open = open_watches
        self._task: asyncio.Task | None = None

    def cut(self, why: str) -> None:
        self.why = why
        self.call.cancel()

    async def _watch(self) -> None:
        while True:
            await self.cluster.routes_changed().wait()
            if self.owner.moved(self.cluster):
                return self.cut(_MOVED)

    async def __aenter__(self):
        self._task = asyncio.get_running_loop().create_task(self._watch())
        self._open.add(self)
        return self

    async def __aexit__(self, kind, exc, tb):
        self._task.cancel()
        self._open.discard(self)
        if self.why and (kind is None or issubclass(kind, (asyncio.CancelledError, grpc.aio.AioRpcError))):
            raise Unavailable(self.why)
        return False


def _relayed(e: grpc.aio.AioRpcError, address: str) -> Relayed:
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED or (e.code() == grpc.StatusCode.UNAVAILABLE and not e.details()):
        return Relayed(grpc.StatusCode.UNAVAILABLE, f"The node that owns this topic ({address}) cannot be reached; "
                                                     "retry.")
    return Relayed(e.code(), e.details() or "", e.trailing_metadata())
