"""Cross-region copies (docs/regions.md, "Cross-region copies"): a topic labelled `pigeon-copy-to: C` when it was
made has every other region's shards copied into region C as they are stored there, so that a region lost for good
loses at most what its copy had not caught up with. Owns the rules:

  * a copy shard is the same shard number in C (core.regions.copy_shards), in one of C's bundle logs: its owner
    copies it, batch after batch in offset order, from the region that stores it (that region's gateway, the
    Ranges API's ReadRange), keeping each message's offset and publish time — so a message id and an ack id name
    the same message in both regions, and nothing is copied twice or skipped: the copy's next offset is where the
    next read starts (a shard's owner is its one writer, fenced as any);
  * what the region no longer holds when the copy gets there (nobody needed it) is skipped only while the copy
    holds nothing of its own (broker.state: the copy starts over there): offsets stay the region's;
  * each subscription's state of a copy shard follows the region's (its ack floor and the acks above it, read
    every limits.copy_floors_s through GetCursor): a Seek record of that shard when it changed;
  * a copy is held back (TopicState.held): nothing of it is handed out while its region serves it. When the
    region is declared lost (`pigeon cluster regions lose NAME`: a key of the global store), C hands its copies
    out from then on and stops copying them; the router sends the region's part of every call to C
    (api.router).

The lag a copy reports (`pigeon_region_copy_lag_seconds`): what its region stored in the last this many seconds
may not be in the copy yet — the age of the oldest message not copied, or, caught up, of the copy's last read.

This module holds what the copies do to this node's state; api.region_copies, the copier, talks to the regions."""

from __future__ import annotations

from array import array

from pigeon.core import wire
from pigeon.core.errors import FailedPrecondition, Unavailable
from pigeon.storage import records as R


async def copy_batches(engine, t, shard: int, batches) -> int:
    """Store batches of another region's shard — (first offset, publish ms, PublishRequest bytes, count, key hash)
    each, in offset order — in its copy here, at the offsets and publish times they have there; returns the
    messages stored, once durable (one wait for them all: the records are committed in order, to one log). The
    copy's next offset must be the first batch's — or, holding nothing, below it (the region had dropped what lay
    between)."""
    engine.check_open()
    if shard not in t.copies or shard not in engine.owned_shards(t):
        raise Unavailable(f"The copy of shard {shard} of {t.name} is another node's now.")
    end = log_id = None
    stored = 0
    for base, publish_ms, request, count, key in batches:
        ix = t.shards[shard]
        if base != ix.next and not (base > ix.next and not ix.base):
            raise FailedPrecondition(f"The copy of shard {shard} of {t.name} is at offset {ix.next}, not {base}.")
        rec = R.Publish(t.uid, shard, base, max(publish_ms, ix.ms[-1]) if ix.ms else publish_ms, count, key,
                        request)
        end = engine.commit(rec)
        log_id = engine.delivery.show_when_durable(t, rec, end)
        stored += count
    if end is not None:
        await engine.durable(end, log_id)
    return stored


def serve_copies(engine, slot: int) -> int:
    """Region `slot` was declared lost: the copies of its shards stored here are handed out from now on. Returns
    how many shards were let go."""
    let = 0
    for t in engine.state.topics.values():
        if t.copies:
            per = len(t.shards) // engine.region.slots
            for k in t.serve_copies(range(slot * per, (slot + 1) * per)):
                let += 1
                engine.delivery.shown(t, t.shards[k])
    return let


def split_batches(resp) -> list[tuple[int, int, list[bytes]]]:
    """A ReadRange answer as (first offset, publish ms, stored messages) per publish batch it covers."""
    sizes = array("I")
    sizes.frombytes(resp.lengths)
    data, at = memoryview(resp.messages), 0
    msgs = []
    for n in sizes:
        msgs.append(bytes(data[at:at + n]))
        at += n
    out = []
    starts, times = list(resp.batch_starts), list(resp.batch_publish_ms)
    for i, (start, ms) in enumerate(zip(starts, times)):
        lo = max(start, resp.start_offset)
        hi = min(starts[i + 1] if i + 1 < len(starts) else resp.next_offset, resp.next_offset)
        if hi > lo:
            out.append((lo, ms, msgs[lo - resp.start_offset:hi - resp.start_offset]))
    return out


def publish_request(topic: str, msgs: list[bytes]) -> bytes:
    """The PublishRequest a copied batch is stored as (as its region stored it: its messages, the topic)."""
    return wire.length_delimited(1, topic.encode()) + b"".join(wire.length_delimited(2, m) for m in msgs)
