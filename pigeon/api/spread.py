"""Calls about a topic whose shards are spread over a cluster's nodes (docs/cluster.md, "Scale-out", step 3): split
over the shards' owners and joined. Owns the rules:

  * an ack, a deadline change or a nack goes to the owner of its ack id's shard (the id names its message number,
    hence its shard); a call is answered once every owner answered, with the first failure if one failed — the
    acks an owner took are durable there whatever the others answered; one is refused (UNAVAILABLE) while a
    shard it names moves between nodes, not while another does;
  * a Pull asks every owner without waiting first (a shard moving between nodes: left out) and answers with all they had; with nothing anywhere and a client
    that waits, it waits on them all and answers with the first that has messages (the others are cancelled: a
    message one of them leased meanwhile comes back after its ack deadline);
  * a StreamingPull is one stream to each owner, merged (api.merge: it outlives its shards' moves);
  * a subscription starts at the end each shard's owner reports for its own shards;
  * another region's shards are one more part, served through a gateway of that region (docs/regions.md): a
    Pull takes nothing from a region that does not answer within limits.region_answer_s (while the Pull waits
    for messages, until its own deadline), nor asks it again for limits.region_silent_s."""

from __future__ import annotations

import asyncio
import logging

from pigeon.api.proto import pigeon_ranges_pb2 as ranges_pb
from pigeon.broker import commands
from pigeon.broker.topic import SHARD_MASK
from pigeon.core import limits
from pigeon.core.errors import InvalidArgument, Unavailable
from pigeon.core.pubsub_types import types

_PublishResponse = types.PublishResponse.pb()
_PUBLISH = "/google.pubsub.v1.Publisher/Publish"
_PullRequest = types.PullRequest.pb()
_PULL = "/google.pubsub.v1.Subscriber/Pull"
_LATEST = "/pigeon.v1.Ranges/LatestOffsets"
_GET_CURSOR = "/pigeon.v1.Ranges/GetCursor"
_MOVING = "The topic's shards are moving between nodes; retry."

log = logging.getLogger("pigeon.router")


SHARD = "x-pigeon-shard"  # a forwarded publish's shard, chosen by the node that took it (its idempotency keys')


def shard_asked(context) -> int | None:
    """The shard a forwarded publish must be stored in (None: the owner chooses)."""
    for k, v in context.invocation_metadata() or ():
        if k == SHARD:
            return int(v)
    return None


async def publish_by_key(router, t, cmd, context, here) -> bytes:
    """A keyless publish with idempotency keys to spread topic `t`: each message stored by the shard its key hashes
    to, so that a retry through any node, batched as it may be, meets the window that holds the key (messages
    without a key go with the first group); `here(cmd, shard)` stores this node's part. Answered with every
    message's id in the request's order once every part was."""
    keys = cmd.idempotency_keys
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(t.shard_for(k) if k else -1, []).append(i)
    loose = groups.pop(-1, [])  # (`cmd.idempotency_keys` is None unless some message has one)
    first = next(iter(groups))
    groups[first] = sorted(groups[first] + loose)
    calls, order = [], []
    for shard, idx in groups.items():
        part = commands.PublishCommand(cmd.topic, commands.keep_messages(cmd.request, idx), len(idx), "",
                                       [keys[i] for i in idx],
                                       [cmd.activations[i] for i in idx] if cmd.activations else None)
        owner = router.shard_owner(t, shard)
        order.append(idx)
        if owner is None:
            calls.append(here(part, shard))
        else:
            calls.append(_ids(router.unary(owner, _PUBLISH, part.request, context, extra=((SHARD, str(shard)),))))
    ids = [""] * cmd.count
    for idx, got in zip(order, await _all(calls)):
        for i, mid in zip(idx, got):
            ids[i] = mid
    return _PublishResponse(message_ids=ids).SerializeToString()


async def _ids(call) -> list[str]:
    return list(_PublishResponse.FromString(await call).message_ids)


def shard_of(ack_id: str) -> int | None:
    """The shard of an ack id ("sub.num.version"), None when it cannot be read (its owner — here — says so)."""
    try:
        return int(ack_id.split(".")[1]) & SHARD_MASK
    except (IndexError, ValueError):
        return None


def by_owner(parts, ack_ids, shard=shard_of) -> dict:
    """Ack ids grouped by the owner of their shard (None: this node, which also takes those it cannot read)."""
    owner_of = {k: p.owner for p in parts for k in p.shards}
    groups: dict = {}
    for a in ack_ids:
        groups.setdefault(owner_of.get(shard(a)), []).append(a)
    return groups


def shard_of_message(message_id: str) -> int | None:
    """The shard of a message id (its number's low bits), None when it is not one."""
    try:
        return int(message_id) & SHARD_MASK
    except ValueError:
        return None


async def _all(calls) -> list:
    """Await every call; raise the first failure once all have ended (none is left running)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


async def split_acks(router, t, req, ids: list[str], method: str, context, here, field: str = "ack_ids",
                     shard=None) -> list:
    """Acknowledge (ModifyAckDeadline, a queue's Ack, Bury, Reschedule, Delete: `field` names the ids, `shard`
    tells an id's shard) split by shard: `here(ids)` for this node's share, a forwarded call with the rest of the
    request for each other owner's; every answer (bytes from another owner), once all came."""
    calls, moving = [], []
    parts = router.spread(t, moving)
    if moving and any((shard or shard_of)(a) in moving for a in ids):  # (the rest need not wait for that move)
        raise Unavailable(_MOVING)
    for owner, part in by_owner(parts, ids, shard or shard_of).items():
        if owner is None:
            calls.append(here(part))
            continue
        sub = type(req)()
        sub.CopyFrom(req)
        del getattr(sub, field)[:]
        getattr(sub, field).extend(part)
        calls.append(router.unary(owner, method, sub.SerializeToString(), context))
    return await _all(calls)


async def pull(router, t, req, context, here, method: str = _PULL, share=None, waits: bool = True) -> bytes:
    """A Pull from every shard's owner: `here(max_messages, return_immediately)` serves this node's share. (A
    queue's Take the same: `method`, and `share(max_messages, wait)` its request to each other owner.) A shard
    moving between nodes is left out: the others' messages are delivered meanwhile."""
    moving: list[int] = []
    parts = router.spread(t, moving)
    if not parts:
        raise Unavailable(_MOVING)
    each = max(1, -(-req.max_messages // len(parts))) if req.max_messages > 0 else req.max_messages
    share = share or (lambda n, wait: _PullRequest(subscription=req.subscription, max_messages=n,
                                                   return_immediately=not wait))

    def asks(wait: bool):
        out = []
        for p in parts:
            if p.owner is None:
                out.append(asyncio.ensure_future(here(each, not wait)))
                continue
            if p.owner.gateway and not router.answers(p.owner):
                out.append(asyncio.ensure_future(_now(b"")))  # (it did not answer lately: asked again later)
                continue
            call = router.unary(p.owner, method, share(each, wait).SerializeToString(), context, waits=True) \
                if p.owner.address else _now(b"")
            if p.owner.gateway:  # (a region that does not answer at once holds up no answer: its share is none)
                call = _or_nothing(call if wait else asyncio.wait_for(call, limits.region_answer_s),
                                   lambda: router.silent(p.owner))
            out.append(asyncio.ensure_future(call))
        return out

    got = await _all(asks(False))
    if any(got) or not waits or req.return_immediately:
        return b"".join(got)
    pending = set(asks(True))
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            got = [d.result() for d in done]
            if any(got):
                return b"".join(got)
        return b""
    finally:
        for task in pending:
            task.cancel()


async def _or_nothing(call, silent) -> bytes:
    """Another region's answer to a Pull, or nothing when it does not answer (it is cut off: its messages wait;
    `silent()` notes it)."""
    try:
        return await call
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001
        log.info("a pull from another region: %s", e or type(e).__name__)
        silent()
        return b""


async def everywhere(router, t, method: str, req, context, here) -> list:
    """A call every owner performs for its own shards (a Seek): `here()` for this node's, the request forwarded to
    each other owner; every answer once all answered (the first failure, if one failed)."""
    calls = [here() if p.owner is None else router.unary(p.owner, method, req.SerializeToString(), context)
             for p in router.spread(t)]
    return await _all(calls)


async def _gather(router, t, method: str, req, context, here, parse) -> list:
    """Each owner's answer to `req` (`here()` for this node's; `parse` of the bytes of another's), as one list
    of what it says of each shard — its own shards' entries taken from each. A shard no part names (a region slot
    no region holds; another region's, in a call from there) is as this node has it: empty."""
    parts = router.spread(t)
    calls = [here() if p.owner is None else router.unary(p.owner, method, req.SerializeToString(), context)
             for p in parts]
    out = [None] * len(t.shards)
    for p, got in zip(parts, await _all(calls)):
        per_shard = parse(got)
        for k in p.shards:
            out[k] = per_shard[k]
    if any(x is None for x in out):
        mine = parse(await here())
        out = [x if x is not None else mine[k] for k, x in enumerate(out)]
    return out


async def subscription_start(router, t, context, here) -> list[int]:
    """Where a new subscription of spread topic `t` begins: each shard's end as its owner reports it (`here()`:
    this node's ends)."""
    req = ranges_pb.LatestOffsetsRequest(topic=t.name)
    return await _gather(router, t, _LATEST, req, context, here, lambda got: got if isinstance(got, list) else [
        s.latest for s in ranges_pb.LatestOffsetsResponse.FromString(got).shards])


async def latest_offsets(router, t, req, context, here) -> bytes:
    """LatestOffsets of a spread topic: each shard's as its owner reports it (`here()`: this node's answer)."""
    parse = lambda got: list(ranges_pb.LatestOffsetsResponse.FromString(got).shards)  # noqa: E731
    shards = await _gather(router, t, _LATEST, req, context, here, parse)
    out = ranges_pb.LatestOffsetsResponse.FromString(await here())  # (the topic's uid and the bit layout)
    del out.shards[:]
    out.shards.extend(shards)
    return out.SerializeToString()


async def ack_state(router, t, sub: str, context) -> tuple[list[int], list[list[int]]]:
    """A subscription's (floors, acked) by shard, each as its shard's owner holds it (a snapshot's content)."""
    req = ranges_pb.GetCursorRequest(name=sub)
    state = router.engine.state.subs[sub]

    def here():
        floors, acked = state.export_state()
        return _now(list(zip(floors, acked)))

    def parse(got):
        if isinstance(got, list):
            return got
        c = ranges_pb.Cursor.FromString(got)
        return list(zip(c.offsets, [list(a.offsets) for a in c.acked]))

    pairs = await _gather(router, t, _GET_CURSOR, req, context, here, parse)
    return [f for f, _ in pairs], [list(a) for _, a in pairs]


def clamped(offsets: list[int], shards, count: int) -> list[int]:
    """Where a cursor starts in each shard: `offsets` (empty: the latest) within each shard's earliest and latest
    offsets (`shards`: LatestOffsetsResponse.shards)."""
    if not offsets:
        return [s.latest for s in shards]
    if len(offsets) != count:
        raise InvalidArgument(f"offsets must list one offset per shard ({count} for this topic).")
    if any(o < 0 for o in offsets):
        raise InvalidArgument("offsets must not be negative.")
    return [max(min(o, s.latest), s.earliest) for o, s in zip(offsets, shards)]


async def cursor(router, t, name: str, context, here, created: bool = False) -> bytes:
    """A cursor (a subscription) of spread topic `t`: each shard's floor, end and acked offsets from its owner
    (`here()`: this node's Cursor), the backlog their sum."""
    def parse(got):
        c = ranges_pb.Cursor.FromString(got)
        return list(zip(c.offsets, c.latest, [list(a.offsets) for a in c.acked]))

    shards = await _gather(router, t, _GET_CURSOR, ranges_pb.GetCursorRequest(name=name), context, here, parse)
    out = ranges_pb.Cursor.FromString(await here())
    out.offsets[:] = [f for f, _, _ in shards]
    out.latest[:] = [end for _, end, _ in shards]
    del out.acked[:]
    out.acked.extend(ranges_pb.AckedAbove(offsets=a) for _, _, a in shards)
    out.backlog = sum(max(0, end - f) - sum(1 for o in a if f <= o < end) for f, end, a in shards)
    out.created = created
    return out.SerializeToString()


async def _now(value):
    return value
