"""Invariant S1 across logs (docs/cluster.md, "Scale-out" 4.3 step 4): a pair handed over names its older batches
in the logs it came from, so a log's own need counts its own batches only (broker.images.bundle_need), each other
log keeps what the pairs handed out of it still name (broker.images.lent_map, the `lent/` keys of
node.ledger_upkeep), and a batch of a log this node does not own is read from that log's ledgers — of its open
ledger only what is durable on a quorum (node.log_reads)."""

from __future__ import annotations

import asyncio
from array import array
from types import SimpleNamespace

import pytest
from google.pubsub_v1 import types
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.broker import images
from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.state import BrokerState
from pigeon.cluster import metadata as M
from pigeon.cluster.ledgers import LedgerInfo
from pigeon.core.bundles import LOG_ADDRESS, bundle_log, log_address, split_log_address
from pigeon.node.bundle_logs import OwnedLog
from pigeon.node.ledger_upkeep import LedgerUpkeep, lend, unlend
from pigeon.node.log_reads import LogReads
from pigeon.node.meta_local import LocalMetadata
from pigeon.node.reader import MessageReader, NotCached
from pigeon.storage import records as R

# log ids alike in their low byte (1, 257, 65537) or not: an address's log is its bits 40-61, three bytes
LOGS = [1, 2, 257, 65537, (1 << 21) - 1]


@st.composite
def indexes(draw):
    """(a log, an index of a pair of it): the batches of the logs the pair stayed in before, in turn (a log may
    come again, this one too), then its present stay — log addresses of earlier owners, then journal positions —
    and a prefix trimmed off (acks)."""
    own = draw(st.sampled_from(LOGS))
    stays = draw(st.lists(st.tuples(st.sampled_from(LOGS), st.integers(0, 70)), max_size=6))
    stays.append((own, draw(st.integers(0, 70))))
    pos, next_offset = [], {}
    for log, n in stays:
        offset = next_offset.get(log, 0)
        for gap in draw(st.lists(st.integers(1, 1 << 30), min_size=n, max_size=n)):
            offset += gap
            pos.append(log_address(log, offset))
        next_offset[log] = offset + 1
    pos += sorted(draw(st.lists(st.integers(0, LOG_ADDRESS - 1), max_size=20)))
    return own, array("q", pos[draw(st.integers(0, len(pos))):])


def _naive(own: int, pos: array) -> tuple[int, dict[int, tuple[int, int]]]:
    first = next((i for i, a in enumerate(pos) if a < LOG_ADDRESS or split_log_address(a)[0] == own), len(pos))
    spans: dict[int, tuple[int, int]] = {}
    for a in pos:
        if a >= LOG_ADDRESS and split_log_address(a)[0] != own:
            log, offset = split_log_address(a)
            low, high = spans.get(log, (offset, offset))
            spans[log] = (min(low, offset), max(high, offset))
    return first, spans


@settings(max_examples=300, deadline=None)
@given(indexes())
def test_an_index_names_its_own_log_from_its_first_own_batch_and_each_other_log_from_its_lowest(case):
    own, pos = case
    first, spans = _naive(own, pos)
    assert images.own_first(pos, own) == first
    assert images.foreign_spans(pos, own) == spans


def test_the_runs_of_a_long_index_are_found_whole():
    pos = array("q", [log_address(257, o) for o in range(0, 200_000, 2)] + [log_address(1, 7)] +
                [log_address(257, 10**6 + o) for o in range(50_000)] + [log_address(65537, 3)] + list(range(10)))
    assert images.own_first(pos, 2) == len(pos) - 10
    assert images.foreign_spans(pos, 2) == {257: (0, 10**6 + 49_999), 1: (7, 7), 65537: (3, 3)}
    assert images.own_first(pos, 257) == 0 and images.foreign_spans(pos, 257) == {1: (7, 7), 65537: (3, 3)}


# --- a pair handed over, in broker state ----------------------------------------------------------------------
BUNDLES = 16
T, S = "projects/p/topics/hot", "projects/p/subscriptions/s"
SHARDS, MOVED = 4, 1
HOME = bundle_log(T, BUNDLES)  # the together topic's one log
NEW = 1 + (HOME % BUNDLES)  # another bundle's log


def num(offset: int, shard: int) -> int:
    return offset << 6 | shard


def fresh() -> BrokerState:
    st_ = BrokerState()
    st_.dispatch_off()
    st_.apply(R.TopicPut(1, SHARDS, Topic(name=T).SerializeToString()))
    st_.apply(R.SubPut(2, 1, Subscription(name=S, topic=T, ack_deadline_seconds=10).SerializeToString(),
                       [0] * SHARDS))
    return st_


def handed_over() -> tuple[BrokerState, BrokerState]:
    """(HOME's owner's state, NEW's owner's): shard MOVED published at HOME offsets 100, 104, 108 (the others at
    101..), handed to NEW, then published twice at NEW (journal positions 5000, 6000)."""
    old = fresh()
    for i in range(3):
        for k in range(SHARDS):
            old.apply(R.Publish(1, k, 2 * i, 1000 + i, 2, 0, b""), log_address(HOME, 100 + 4 * i + (k - MOVED) % 4))
    out = R.ShardOut(1, MOVED, HOME, NEW, 1, 30.0,
                     images.pair_images(old, old.topics_by_uid[1], MOVED))
    old.apply(out)
    new = fresh()
    new.apply(R.ShardIn(1, MOVED, NEW, HOME, 1, 30.0, out.images))
    new.apply(R.Publish(1, MOVED, 6, 2000, 1, 0, b""), 5000)
    new.apply(R.Publish(1, MOVED, 7, 2001, 1, 0, b""), 6000)
    return old, new


def test_a_log_needs_its_own_batches_and_lends_the_others():
    old, new = handed_over()
    assert images.bundle_need(old, HOME, BUNDLES, lambda a: split_log_address(a)[1]) == 101, \
        "the pair handed out is not HOME's own need any more"
    assert images.lent_map(old, HOME, BUNDLES) == {}
    assert images.bundle_need(new, NEW, BUNDLES) == 5000, "only NEW's own batches: not HOME's offsets"
    assert images.lent_map(new, NEW, BUNDLES) == {HOME: {(1, MOVED): 100}}
    assert images.named_top(new, NEW, BUNDLES, HOME) == 108 and images.named_top(new, NEW, BUNDLES, 3) == -1
    new.apply(R.Ack(2, [num(o, MOVED) for o in range(4)]))
    new.trim_indexes(0.0)  # the first two batches acked: they go
    assert images.lent_map(new, NEW, BUNDLES) == {HOME: {(1, MOVED): 108}}
    new.apply(R.Ack(2, [num(o, MOVED) for o in range(4, 7)]))
    new.trim_indexes(0.0)
    assert images.lent_map(new, NEW, BUNDLES) == {}, "nothing of HOME named any more"
    assert images.bundle_need(new, NEW, BUNDLES) == 6000


def test_lent_keys_name_their_log_and_pair():
    key = M.lent_key(HOME, 12, 3)
    assert key.startswith(M.lent_prefix(HOME)) and key.startswith(M.LENT_PREFIX)
    assert M.split_lent_key(key) == (HOME, 12, 3) and M.split_lent_key(M.ledgers_key(HOME)) is None
    assert not M.lent_key(1, 1, 0).startswith(M.lent_prefix(10))


# --- a batch of a log not owned here -----------------------------------------------------------------------------
OTHER_OWNER = "/pigeon/test/another-owner"  # a key a node's fake owner guard needs absent: put, the node lost its logs


def _node(state: BrokerState, owned: list[int], meta: LocalMetadata | None = None):
    async def durable(end=None, log_id=None):
        return None

    async def catch_up():
        return None
    engine = SimpleNamespace(state=state, reader=MessageReader(None, 1 << 24), durable=durable,
                             meta_log=SimpleNamespace(catch_up=catch_up))
    cluster = SimpleNamespace(engine=engine, config=SimpleNamespace(bundles=BUNDLES))
    logs = {log: OwnedLog(log, 1, LedgerInfo(log << 20, 1, {"n1": "a"}, 0), next_offset=500) for log in owned}
    bundles = SimpleNamespace(cluster=cluster, logs=logs, meta=meta or LocalMetadata(), cluster_format=3,
                              owner_guard=lambda log_id, epoch: M.absent(OTHER_OWNER))  # (the owner: see `_stale`)
    bundles.reads = LogReads(bundles)
    return bundles


_Request, _Message = types.PublishRequest.pb(), types.PubsubMessage.pb()


def _entry(i: int) -> tuple[int, bytes]:
    request = _Request(topic=T, messages=[_Message(data=b"m%d" % i)]).SerializeToString()
    return R.RecordType.PUBLISH, b"".join(R.Publish(1, MOVED, i, 1000 + i, 1, 0, request).parts())


def test_a_batch_of_a_foreign_log_is_read_from_its_ledgers_and_of_an_open_one_only_what_is_durable():
    async def go():
        _, new = handed_over()
        y = _node(new, [NEW])
        closed = LedgerInfo(HOME << 20, 1, {"n2": "a", "n3": "b"}, 0, 104)
        open_ = LedgerInfo(HOME << 20 | 1, 1, {"n2": "a", "n3": "b"}, 104)
        lists = {HOME: [closed]}
        held = {closed.id: [_entry(i) for i in range(104)], open_.id: [_entry(i) for i in range(104, 130)]}
        asked: list[tuple[int, int, int]] = []
        listed, moved = [], set()

        async def read_ledgers(log_id):
            listed.append(log_id)
            return None, [lg.copy() for lg in lists[log_id]]

        async def read_range(lg, start, end):
            asked.append((lg.id, start, end))
            if moved & set(lg.members):
                raise ConnectionError("no member answers")
            return held[lg.id][start:end]  # (a member's durable prefix)
        y.read_ledgers, y.read_range = read_ledgers, read_range
        reader = y.cluster.engine.reader
        await y.reads.fetch(log_address(HOME, 100))
        assert reader.cached(log_address(HOME, 100)) and asked[0][:2] == (closed.id, 100)
        assert asked[0][2] == 104, "not past the closed ledger"
        # the batch at 108 is in a ledger the list read first did not have: read again, open now
        lists[HOME] = [closed, open_]
        await y.reads.fetch(log_address(HOME, 108))
        assert asked[-1] == (open_.id, 4, 5), "of the open ledger, up to the highest batch an index here names"
        assert reader.cached(log_address(HOME, 108)) and not reader.cached(log_address(HOME, 109))
        messages = reader.batch(log_address(HOME, 108))[0]
        assert len(messages) == 1 and b"m108" in messages[0]
        with pytest.raises(NotCached):  # (an entry past what is durable is not cached)
            reader.batch(log_address(HOME, 109))
        # a copy moved by a repair: the read fails, and the next one reads the list again first
        moved.add("n2")
        lists[HOME] = [LedgerInfo(closed.id, 1, {"n4": "d", "n3": "b"}, 0, 104), open_]
        before = len(listed)
        with pytest.raises(ConnectionError):
            await y.reads.fetch(log_address(HOME, 50))
        assert len(listed) == before, "the list as read"
        await y.reads.fetch(log_address(HOME, 50))  # (n2 still gone: from the list read again)
        assert len(listed) == before + 1 and reader.cached(log_address(HOME, 50))
    asyncio.run(go())


# --- the owners' side: lent keys kept, a log cut short of them -------------------------------------------------
async def _lent(meta: LocalMetadata) -> dict[str, int]:
    return {kv.key: int(kv.value) for kv in await meta.list(M.LENT_PREFIX)}


def test_a_hand_over_lends_the_old_log_and_the_new_owner_keeps_the_key():
    async def go():
        old, new = handed_over()
        meta = LocalMetadata()
        key = M.lent_key(HOME, 1, MOVED)
        # before the ShardOut: the old owner lends what the pair names of its log, and keeps the key meanwhile
        before = fresh()
        for i in range(3):
            before.apply(R.Publish(1, MOVED, 2 * i, 1000 + i, 2, 0, b""), log_address(HOME, 100 + 4 * i))
        x = _node(before, [HOME], meta)
        upkeep = LedgerUpkeep(x)
        assert not upkeep.lent_about(), "no pair handed over: etcd is not asked"
        assert await lend(x, HOME, 1, MOVED) == 100
        assert upkeep.lent_about()
        assert await upkeep._lent_low(x.logs[HOME]) == (100, 100), "a hand-over under way: its key counts"
        unlend(x, HOME, 1, MOVED)
        assert await upkeep._lent_low(x.logs[HOME]) == (None, 100), "no hand-over after all: the key goes"
        assert await _lent(meta) == {}
        assert await lend(x, HOME, 1, MOVED) == 100
        # the new owner: the key rises with the acks, and goes once the pair names nothing of HOME
        y = _node(new, [NEW], meta)
        assert await LedgerUpkeep(y).keep_lent() == (0, 0) and await _lent(meta) == {key: 100}
        new.apply(R.Ack(2, [num(o, MOVED) for o in range(4)]))
        new.trim_indexes(0.0)
        assert await LedgerUpkeep(y).keep_lent() == (1, 0) and await _lent(meta) == {key: 108}
        # a stale pass (a state from before those acks) writes nothing lower: the values only rise
        _, stale = handed_over()
        assert await LedgerUpkeep(_node(stale, [NEW], meta)).keep_lent() == (0, 0)
        assert await _lent(meta) == {key: 108}
        new.apply(R.Ack(2, [num(o, MOVED) for o in range(4, 7)]))
        new.trim_indexes(0.0)
        assert await LedgerUpkeep(y).keep_lent() == (0, 1) and await _lent(meta) == {}
        # the old owner, the ShardOut in its state: the pair is not its any more, nor its mark
        await meta.put(key, b"100")
        x.cluster.engine.state = old
        assert await LedgerUpkeep(x).keep_lent() == (0, 0) and not x.reads.lending
    asyncio.run(go())


def test_a_cut_keeps_the_ledgers_a_pair_handed_out_still_names():
    async def go():
        old, _ = handed_over()
        meta = LocalMetadata()
        x = _node(old, [HOME], meta)
        ol = x.logs[HOME]
        lists = {HOME: [LedgerInfo(HOME << 20 | i, 1, {"n1": "a"}, 100 * i, 100 * i + 100) for i in range(5)]}
        ol.ledgers = [lg.copy() for lg in lists[HOME]]
        ol.snapshots = [(450, True)]

        async def read_ledgers(log_id):
            return None, [lg.copy() for lg in lists[log_id]]

        async def put_ledgers(log_id, epoch, kv, ledgers):
            lists[log_id] = ledgers
            ol.ledgers = ledgers
        x.read_ledgers, x.put_ledgers = read_ledgers, put_ledgers
        upkeep = LedgerUpkeep(x)

        async def deleted(ledgers):
            return None
        upkeep._delete = deleted
        await meta.put(M.lent_key(HOME, 1, MOVED), b"50")
        await meta.put(M.lent_key(HOME, 77, 0), b"0")  # a topic gone for good (deleted, no subscription left)
        old.next_uid = max(old.next_uid, 78)
        assert await upkeep.cut(ol), "the reading point moves on"
        assert [lg.first for lg in lists[HOME]] == [0, 100, 200, 300, 400], "from the pair's 50 on (own need: 101)"
        assert lists[HOME][-1].start == 450
        assert await _lent(meta) == {M.lent_key(HOME, 1, MOVED): 50}, "the gone topic's key deleted"
        await meta.put(M.lent_key(HOME, 1, MOVED), b"350")
        old.apply(R.Ack(2, [num(o, k) for k in range(SHARDS) for o in range(6)]))
        old.trim_indexes(0.0)
        assert await upkeep.cut(ol)
        assert [lg.first for lg in lists[HOME]] == [300, 400]
    asyncio.run(go())


def test_a_cut_whose_log_is_lost_meanwhile_deletes_no_lent_key():
    """The cluster simulator (seed 8455, under the owner's lease since taken back) lost 29 acknowledged messages: a
    cut of the old home went on after its node had lost the log, whose state that loss reset — the pair handed out
    looked back in the log, with no hand-over under way — and deleted the pair's lent key; the log's next owner,
    finishing the hand-over, cut the log past the pair's batches before the new home's owner wrote the key again.
    A key is deleted only by the log's owner, on a state that is the log's."""
    async def go():
        old, _ = handed_over()
        meta = LocalMetadata()
        x = _node(old, [HOME], meta)
        ol = x.logs[HOME]
        key = M.lent_key(HOME, 1, MOVED)
        await meta.put(key, b"100")
        listed = meta.list

        async def list_and_lose(prefix):  # the log is lost while etcd answers: its state is reset
            meta.list = listed
            kvs = await listed(prefix)
            del x.logs[HOME]
            ol.released = True
            old.apply(R.Reset(HOME, BUNDLES))
            return kvs
        meta.list = list_and_lose
        await LedgerUpkeep(x)._lent_low(ol)
        assert await _lent(meta) == {key: 100}
    asyncio.run(go())


def test_an_owner_that_lost_its_log_unknowing_deletes_no_lent_key():
    """A node whose log was taken over without its knowing yet (cut off, paused) has a state behind its
    successor's: the pair its successor began to hand out is in the log there, no hand-over under way. Its
    deletes of lent keys require its owner key, so the key the successor lent stays."""
    async def go():
        old, new = handed_over()
        meta = LocalMetadata()
        stale = _node(fresh(), [HOME], meta)  # (the pair's batches in HOME, as before any hand-over)
        for i in range(3):
            stale.cluster.engine.state.apply(R.Publish(1, MOVED, 2 * i, 1000 + i, 2, 0, b""),
                                             log_address(HOME, 100 + 4 * i))
        key = M.lent_key(HOME, 1, MOVED)
        await meta.put(key, b"100")  # the successor's lend
        await meta.put(OTHER_OWNER, b"n2")
        assert (await LedgerUpkeep(stale)._lent_low(stale.logs[HOME]))[0] == 100
        assert await LedgerUpkeep(stale).keep_lent() == (0, 0)
        assert await _lent(meta) == {key: 100}
        await meta.delete(OTHER_OWNER)  # (had it been the owner: the key of a pair back in the log goes)
        assert (await LedgerUpkeep(stale)._lent_low(stale.logs[HOME]))[0] is None and await _lent(meta) == {}
    asyncio.run(go())
