"""Recovery from damaged data directories. A real server builds the data (publishes known payloads, acks
some), then the files are damaged: a flipped bit in a WAL record, a truncated segment, garbage after the
last record, a flipped bit in or a truncation of the newest checkpoint. For each:

  * `pigeon fsck` reports it (exit 1, a BROKEN line naming the place) and changes no file;
  * the server starts, logs what it dropped (file, byte, how many bytes) or which checkpoint it skipped;
  * it serves exactly the messages the records before the broken point leave unacked — same ids, same
    payloads — and nothing after it;
  * it keeps working on the repaired log (acks and publishes after the repair survive another kill -9);
  * afterwards `pigeon fsck` is clean again.

What "before the broken point" leaves unacked is computed from the records themselves, decoded with
pigeon.storage (PUBLISH: the stored messages; ACK: message numbers)."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys

import pytest

import crashkit as ck
from pigeon.broker.state import Contradiction
from pigeon.node import recovery
from pigeon.storage import checkpoint, record, records
from pigeon.storage.record import HEADER_BYTES, Broken
from pigeon.storage.journal import MARKERS
from pigeon.storage.records import Malformed, RecordType
from pigeon.testing.server import ServerProcess

pytestmark = pytest.mark.e2e

TOPIC = f"projects/{ck.PROJECT}/topics/damage"
SUB = f"projects/{ck.PROJECT}/subscriptions/damage-sub"
SEED = 20240607


# --- building data directories with a real server -------------------------------------------------

def _life(data_dir: str, life: int, end: str, published: dict, rng: random.Random) -> None:
    """One server lifetime: publish singles and small batches, ack about half of what is pulled, then
    end with SIGTERM ("term": a checkpoint is written) or SIGKILL ("kill": the WAL alone holds it)."""
    srv = ServerProcess(data_dir).start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            pub, sub = ck.clients(srv.address, mp)
            try:
                if life == 0:
                    pub.create_topic(name=TOPIC)
                    sub.create_subscription(name=SUB, topic=TOPIC, ack_deadline_seconds=60)
                for block in range(3):
                    futs = []
                    for j in range(6):
                        data = f"life{life}-block{block}-msg{j}-".encode() + rng.randbytes(rng.randint(0, 300))
                        attrs = {"life": str(life), "j": str(j)}
                        f = pub.publish(TOPIC, data, **attrs)
                        if j < 3:  # one record each
                            published[f.result(timeout=10)] = (data, attrs)
                        else:  # a batch of several messages in one record
                            futs.append((f, data, attrs))
                    for f, data, attrs in futs:
                        published[f.result(timeout=10)] = (data, attrs)
                    got = ck.pull_now(sub, SUB, max_messages=100)
                    chosen = [m for m in got if rng.random() < 0.5]
                    _nack(sub, got)  # locks survive restarts: none is left behind, whichever record a test cuts
                    if chosen:
                        sub.acknowledge(subscription=SUB, ack_ids=[m.ack_id for m in chosen], retry=None, timeout=10)
            finally:
                ck.close_clients(pub, sub)
    finally:
        if end == "term":
            assert srv.stop() == 0, srv.log()
        else:
            srv.kill()


def _nack(sub, received) -> None:
    """Release locks (a nack): a lock is a record, so a message pulled and neither acked nor nacked would stay
    locked across the restarts below for the whole ack deadline. Sent before an ack, whose answer waits until
    everything logged before it is durable."""
    if received:
        sub.modify_ack_deadline(subscription=SUB, ack_ids=[m.ack_id for m in received], ack_deadline_seconds=0,
                                retry=None, timeout=10)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Two data directories, built once per module:
    "kill": one lifetime ended by kill -9 (WAL only, no checkpoint);
    "ckpt": two lifetimes ended by SIGTERM (two checkpoints), a third by kill -9 (WAL records after them)."""
    rng = random.Random(SEED)
    out = {}
    for name, ends in (("kill", ["kill"]), ("ckpt", ["term", "term", "kill"])):
        d = str(tmp_path_factory.mktemp(f"pristine-{name}") / "data")
        published: dict = {}
        for life, end in enumerate(ends):
            _life(d, life, end, published, rng)
        cks = ck.checkpoints(d)
        assert len(cks) == (2 if name == "ckpt" else 0), f"{name}: checkpoints {cks}"
        cp = ck.fsck(d)
        assert cp.returncode == 0, f"the undamaged {name} directory is not clean:\n{cp.stdout}{cp.stderr}"
        recs = ck.wal_records(d)
        full = ck.model(recs)
        # the decoded records agree with what the client was told
        assert all(published[mid] == v for mid, v in full.items()), "stored messages differ from the published"
        assert 0 < len(full) < len(published), "the build should leave some messages acked and some not"
        out[name] = (d, published)
    return out


def _copy(pristine, name: str, tmp_path) -> tuple[str, dict]:
    src, published = pristine[name]
    dst = str(tmp_path / "data")
    shutil.copytree(src, dst)
    return dst, published


def _tail_records(data_dir: str) -> list[ck.Rec]:
    """PUBLISH and ACK records of the last segment after the newest checkpoint's position."""
    cks = ck.checkpoints(data_dir)
    start = ck.checkpoint_pos(cks[-1]) if cks else 0
    last = ck.segments(data_dir)[-1]
    recs = [r for r in ck.wal_records(data_dir)
            if r.path == last and r.pos >= start and r.rtype in (RecordType.PUBLISH, RecordType.ACK)]
    assert len(recs) >= 6, f"too few records to damage: {len(recs)}"
    return recs


def _middle(recs: list[ck.Rec], rtype: int) -> ck.Rec:
    """The record of type `rtype` nearest the middle, with records of any type after it."""
    mid = len(recs) // 2
    cands = sorted((r for r in recs[1:-1] if r.rtype == rtype), key=lambda r: abs(recs.index(r) - mid))
    assert cands, f"no {rtype!r} record in the middle"
    return cands[0]


# --- the checks --------------------------------------------------------------------------------------

def _fsck_reports(data_dir: str, pattern: str) -> str:
    before = ck.tree_digest(data_dir)
    cp = ck.fsck(data_dir)
    out = cp.stdout + cp.stderr
    assert "Traceback" not in out, out
    assert cp.returncode == 1, f"fsck exit {cp.returncode} on a damaged directory:\n{out}"
    lines = ck.broken_lines(cp)
    assert any(re.search(pattern, ln) for ln in lines), f"no BROKEN line matches {pattern!r}:\n{out}"
    assert ck.tree_digest(data_dir) == before, "fsck changed files"
    return cp.stdout


def _served(srv, monkeypatch) -> tuple[dict, list]:
    """Every message the server delivers now: (id → (data, attributes), the ReceivedMessages, leased for
    60 s and not acked). Also checks there are no duplicates."""
    pub, sub = ck.clients(srv.address, monkeypatch)
    try:
        got = ck.drain(sub, SUB, empty_rounds=2)
    finally:
        ck.close_clients(pub, sub)
    out = {}
    for m in got:
        mid, data, attrs = ck.key(m.message)
        assert mid not in out, f"message {mid} delivered twice within its ack deadline"
        out[mid] = (data, attrs)
    return out, got


def _describe(diff_keys, published) -> str:
    return ", ".join(f"{k}={published.get(k, ('?',))[0][:24]!r}" for k in sorted(diff_keys)[:8])


def _assert_serves(srv, monkeypatch, expected: dict, published: dict, ctx: str) -> list:
    got, received = _served(srv, monkeypatch)
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    assert not missing, f"{ctx}: {len(missing)} messages that should be served (unacked, before the broken point " \
                        f"or published after the repair) are not: {_describe(missing, published)}"
    assert not extra, f"{ctx}: {len(extra)} messages served that should not be (acked, or after the broken " \
                      f"point): {_describe(extra, published)}"
    bad = [k for k in got if got[k] != expected[k]]
    assert not bad, f"{ctx}: served with different data/attributes: {bad[:5]}"
    return received


def _recover_and_check(server_factory, monkeypatch, data_dir: str, published: dict, expected: dict,
                       log_patterns: list[str], ctx: str) -> list[str]:
    """Start on the damaged directory, check the log and what is served, keep working, then check that
    the directory is clean and the work after the repair survives a kill -9. An unclean fsck is returned
    (not raised) so that the later checks still run; the caller asserts the list is empty."""
    srv = server_factory(data_dir=data_dir)
    log = ck.read_log(srv)
    for pat in log_patterns:
        assert re.search(pat, log), f"{ctx}: server log lacks {pat!r}:\n{log[-3000:]}"
    received = _assert_serves(srv, monkeypatch, expected, published, ctx + ", first start")

    # keep working on the repaired log: publish a few, ack a few old and a few new
    pub, sub = ck.clients(srv.address, monkeypatch)
    try:
        # what the first drain took is leased for 60 s: nothing but new publishes may arrive now
        again = ck.drain(sub, SUB, empty_rounds=1)
        assert not again, f"{ctx}: {len(again)} messages delivered twice within the ack deadline"
        new = {}
        for i in range(5):
            data = f"after-repair-{i}".encode()
            new[pub.publish(TOPIC, data, after="1").result(timeout=10)] = (data, {"after": "1"})
        fresh = ck.drain(sub, SUB)
        assert {m.message.message_id for m in fresh} == set(new), f"{ctx}: new publishes not served after repair"
        to_ack = received[:3] + fresh[:2]
        _nack(sub, received + fresh)
        sub.acknowledge(subscription=SUB, ack_ids=[m.ack_id for m in to_ack], retry=None, timeout=10)
    finally:
        ck.close_clients(pub, sub)
    srv.kill()

    problems = []
    cp = ck.fsck(data_dir)
    assert "Traceback" not in cp.stdout + cp.stderr, cp.stderr
    if cp.returncode != 0:
        problems.append(f"{ctx}: fsck after recovery (and a kill -9) is not clean:\n{cp.stdout}")

    srv = server_factory(data_dir=data_dir)
    acked = {m.message.message_id for m in to_ack}
    want = {k: v for k, v in {**expected, **new}.items() if k not in acked}
    _assert_serves(srv, monkeypatch, want, {**published, **new}, ctx + ", after repair and kill -9")
    srv.kill()
    again = ck.read_log(srv)
    if re.search(r"broken|dropp", again):
        problems.append(f"{ctx}: the start after the repair still reports damage:\n{again[-2000:]}")
    assert "Traceback" not in log + again, f"{ctx}: server logged a traceback:\n{log}\n{again}"
    return problems


# --- WAL damage --------------------------------------------------------------------------------------

WAL_CASES = ["flip-publish", "flip-ack", "flip-length", "truncate-middle", "truncate-last-header",
             "garbage-random"]


def _written_end(path: str) -> int:
    """Where the last non-zero byte of the file ends: past it only the zeros the journal reserves ahead of its
    writes (a killed server leaves them in its active segment), which no report counts as dropped."""
    with open(path, "rb") as f:
        return len(f.read().rstrip(b"\0"))


@pytest.mark.parametrize("build", ["kill", "ckpt"])
@pytest.mark.parametrize("case", WAL_CASES)
def test_damaged_wal_is_cut_at_the_first_broken_record(pristine, server_factory, tmp_path, monkeypatch, build, case):
    data_dir, published = _copy(pristine, build, tmp_path)
    recs = _tail_records(data_dir)
    seg = recs[0].path
    size = ck.read_records(seg)[1]  # where its records end (zeros reserved after them: the server was killed)
    rng = random.Random(f"{SEED}-{build}-{case}")
    if case in ("flip-publish", "flip-ack"):
        r = _middle(recs, RecordType.PUBLISH if case == "flip-publish" else RecordType.ACK)
        ck.flip_bit(seg, r.at + HEADER_BYTES + rng.randrange(len(r.payload)), rng.randrange(8))
        cut, reason = r, r"crc mismatch"
    elif case == "flip-length":
        r = _middle(recs, RecordType.PUBLISH)
        ck.flip_bit(seg, r.at + 3, 7)  # the length's top bit: far beyond any record
        cut, reason = r, r"bad length \d+"
    elif case == "truncate-middle":
        r = _middle(recs, RecordType.PUBLISH)
        ck.truncate(seg, r.at + HEADER_BYTES + len(r.payload) // 2)
        cut, reason = r, r"short record"
    elif case == "truncate-last-header":
        r = recs[-1]
        assert r.end == size, "the last record should end the segment"
        ck.truncate(seg, r.at + 5)
        cut, reason = r, r"short header"
    else:  # a torn write of garbage right after the last record
        ck.write_at(seg, size, rng.randbytes(rng.randint(20, 200)))
        cut, reason = None, r"[^)]+"
    at = cut.at if cut else size
    dropped = _written_end(seg) - at
    pristine_recs = ck.wal_records(pristine[build][0])
    expected = ck.model(pristine_recs, before=cut.pos if cut else None)
    full = ck.model(pristine_recs)
    if case != "garbage-random":
        assert expected != full, "the damage should cost something (test set-up)"
    ctx = f"{build}/{case} (cut at byte {at} of {os.path.basename(seg)}, {dropped} bytes dropped)"

    _fsck_reports(data_dir, rf"wal {re.escape(seg)}: broken record at byte {at} \({reason}\); {dropped} bytes")
    problems = _recover_and_check(
        server_factory, monkeypatch, data_dir, published, expected,
        [rf"wal {re.escape(seg)}: broken record at byte {at} \({reason}\); dropping {dropped} bytes"], ctx)
    assert not problems, "\n".join(problems)


def test_zeros_after_the_last_record_are_no_damage(pristine, server_factory, tmp_path, monkeypatch):
    """The journal reserves its active segment ahead of its writes, and a crash may leave zeros past the records
    (more of them here, at the file's end): fsck is clean, the server drops nothing and serves every message."""
    data_dir, published = _copy(pristine, "kill", tmp_path)
    seg = ck.segments(data_dir)[-1]
    recs, end, reason = ck.read_records(seg)
    assert reason is None and os.path.getsize(seg) > end, "a killed server leaves its reserve (test set-up)"
    ck.append(seg, bytes(64))
    cp = ck.fsck(data_dir)
    assert cp.returncode == 0 and not ck.broken_lines(cp), cp.stdout + cp.stderr
    srv = server_factory(data_dir=data_dir)
    assert "broken" not in ck.read_log(srv)
    received = _assert_serves(srv, monkeypatch, ck.model(ck.wal_records(pristine["kill"][0])), published, "zeros")
    # an ack is answered once durable, and with it the deliveries' records before it: a lease alone rides with the
    # next group commit, which the kill could beat on a loaded machine (and then no record followed the old ones)
    pub, sub = ck.clients(srv.address, monkeypatch)
    try:
        sub.acknowledge(subscription=SUB, ack_ids=[received[0].ack_id], retry=None, timeout=10)
    finally:
        ck.close_clients(pub, sub)
    srv.kill()
    after = ck.read_records(seg)[0]
    assert after[:len(recs)] == recs and after[len(recs)].at == end, "the records go on where they were"


# --- checkpoint damage -------------------------------------------------------------------------------

CK_CASES = [(case, "older-checkpoint") for case in ("flip-middle", "flip-end", "truncate-middle", "drop-end",
                                                      "bad-count")] + [("flip-middle", "wal-replay"),
                                                                       ("drop-end", "wal-replay")]


@pytest.mark.parametrize("case,fallback", CK_CASES, ids=[f"{c}-{f}" for c, f in CK_CASES])
def test_damaged_checkpoint_falls_back(pristine, server_factory, tmp_path, monkeypatch, case, fallback):
    data_dir, published = _copy(pristine, "ckpt", tmp_path)
    older, newest = ck.checkpoints(data_dir)
    if fallback == "wal-replay":  # only one checkpoint: when it is broken, the WAL is replayed from its start
        os.unlink(older)
        older = None
    recs, end, reason = ck.read_records(newest)
    assert reason is None and recs[0].rtype == checkpoint.HEADER and recs[-1].rtype == checkpoint.END
    assert len(recs) >= 4, "header, shards, subscription, end"
    rng = random.Random(f"{SEED}-{case}-{fallback}")
    mid = recs[len(recs) // 2]
    if case == "flip-middle":
        ck.flip_bit(newest, mid.at + HEADER_BYTES + rng.randrange(len(mid.payload)), rng.randrange(8))
        why = rf"crc mismatch at byte {mid.at}"
    elif case == "flip-end":
        ck.flip_bit(newest, recs[-1].at + HEADER_BYTES + rng.randrange(len(recs[-1].payload)), rng.randrange(8))
        why = rf"crc mismatch at byte {recs[-1].at}"
    elif case == "truncate-middle":
        ck.truncate(newest, mid.at + HEADER_BYTES + len(mid.payload) // 2)
        why = rf"short record at byte {mid.at}"
    elif case == "drop-end":  # every record intact, the end marker missing: an unfinished write
        ck.truncate(newest, recs[-1].at)
        why = r"incomplete checkpoint"
    else:  # framing valid (correct CRC), content inconsistent
        ck.truncate(newest, recs[-1].at)
        ck.append(newest, record.encode(checkpoint.END, (len(recs)).to_bytes(8, "little")))
        why = r"record count mismatch"

    wal = ck.wal_records(data_dir)
    start = ck.checkpoint_pos(older) if older else 0
    replayed = sum(1 for r in wal if r.pos >= start and r.rtype not in MARKERS)  # fences are not applied
    expected = ck.model(wal)
    ctx = f"{case}/{fallback}"
    out = _fsck_reports(data_dir, rf"checkpoint {re.escape(newest)}: broken \({why}\); not used")
    assert re.search(rf"^checkpoint: {re.escape(older) if older else 'none'}$", out, re.M), \
        f"{ctx}: fsck did not fall back to {older or 'WAL replay'}:\n{out}"
    assert re.search(rf"^records replayed after it: {replayed}$", out, re.M), \
        f"{ctx}: fsck should replay the {replayed} WAL records after position {start}:\n{out}"
    problems = _recover_and_check(
        server_factory, monkeypatch, data_dir, published, expected,
        [rf"checkpoint {re.escape(newest)} is broken \({why}\); trying an older one",
         rf"recovered 1 topics, 1 subscriptions, {replayed} records replayed"], ctx)

    # a graceful stop writes a new checkpoint and keeps "the two newest": a broken file must not be
    # among the kept ones (it would push out a good one and be useless as the fallback)
    srv = server_factory(data_dir=data_dir)
    assert srv.stop() == 0, srv.log()
    for path in ck.checkpoints(data_dir):
        try:
            header, meta, images = checkpoint.decode(ck.OsDisk().read_file(path))
            recovery.BrokerTarget().load(header, meta, images)
        except (Broken, Malformed, Contradiction) as e:
            problems.append(f"{ctx}: after recovery and a graceful stop, the kept checkpoint {path} is broken ({e}); "
                            f"checkpoints now: {[os.path.basename(p) for p in ck.checkpoints(data_dir)]}")
    kept = ck.checkpoints(data_dir)
    if older is not None and older not in kept and newest in kept:
        problems.append(f"{ctx}: the good older checkpoint {os.path.basename(older)} was deleted while the broken "
                        f"{os.path.basename(newest)} was kept")
    assert not problems, "\n".join(problems)


# --- a record that decodes but cannot be applied -----------------------------------------------------

@pytest.mark.parametrize("build", ["kill", "ckpt"])
def test_unappliable_record_stops_start_up_and_deletes_nothing(pristine, server_factory, tmp_path, monkeypatch,
                                                               build):
    """A PUBLISH record with valid framing and CRC whose offset contradicts the state (what a bug would write):
    the server refuses to start and names file, byte and type, changing no file; fsck explains it; only
    `fsck --repair` truncates there, after saying what it drops; then the server serves what came before."""
    data_dir, published = _copy(pristine, build, tmp_path)
    recs = _tail_records(data_dir)
    r = _middle(recs, RecordType.PUBLISH)
    log, epoch, offset, body = record.split_entry(r.payload)
    rec = records.decode(RecordType.PUBLISH, body)
    rec.base += 1000  # the shard is not at that offset
    bad = record.encode_entry(RecordType.PUBLISH, log, epoch, offset, rec.parts())
    assert len(bad) == r.end - r.at
    with open(r.path, "r+b") as f:
        f.seek(r.at)
        f.write(bad)
    later = [p for p in ck.segments(data_dir) if p > r.path]
    tail_bytes = ck.read_records(r.path)[1] - r.at  # (its records, not the zeros reserved after them)
    expect_dropped = tail_bytes + sum(os.path.getsize(p) for p in later)
    before = ck.tree_digest(data_dir)
    named = rf"wal {re.escape(r.path)}: the PUBLISH record at byte {r.at} decodes but cannot be applied"

    with pytest.raises(RuntimeError) as refused:
        server_factory(data_dir=data_dir)
    assert re.search(named, str(refused.value)), str(refused.value)
    assert "Nothing was deleted" in str(refused.value) and "Traceback" not in str(refused.value)
    assert ck.tree_digest(data_dir) == before, "a refused start changed files"

    cp = ck.fsck(data_dir)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 1 and "Traceback" not in out, out
    assert any(re.search(named, ln) for ln in ck.broken_lines(cp)), out
    assert f"dropping {expect_dropped} bytes" in out, out
    assert ck.tree_digest(data_dir) == before, "fsck without --repair changed files"

    cp = subprocess.run([sys.executable, "-m", "pigeon", "fsck", "--repair", data_dir], capture_output=True,
                        text=True, timeout=60)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0 and "Traceback" not in out, out
    assert re.search(rf"REPAIR: dropping {tail_bytes} bytes of {re.escape(r.path)}", out), out
    assert os.path.getsize(r.path) == r.at and not any(os.path.exists(p) for p in later)

    expected = ck.model(ck.wal_records(pristine[build][0]), before=r.pos)
    srv = server_factory(data_dir=data_dir)
    _assert_serves(srv, monkeypatch, expected, published, f"{build}/unappliable, after fsck --repair")
    assert ck.fsck(data_dir).returncode == 0
