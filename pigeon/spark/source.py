"""The `pigeon` Spark data source (Spark 4 Python data source API). Owns the rules:
- a read is a set of per-shard offset ranges fixed on the driver; an executor turns a range into Arrow
  record batches with ReadRange calls, so a replay of the same ranges yields the same rows (Spark's
  checkpoint then gives exactly-once output into an idempotent sink);
- a streaming query's offsets are {"topic_uid", "shards": {shard: next offset}}; `commit(end)` moves the
  cursor subscription (if any) to `end`, so retention holds what the query has not finished;
- admission control: at most maxRowsPerTrigger rows per micro-batch, shared fairly between shards; with
  minRowsPerTrigger, no micro-batch until that many rows wait or maxTriggerDelay has passed since the first of
  them was seen (Spark's Kafka source's minOffsetsPerTrigger and maxTriggerDelay);
- the writer publishes every row with the idempotency key "{sink_id}:{batch_id}:{partition}:{index}"
  (attribute pigeon-idempotency-key): a replayed micro-batch publishes the same keys, which Pigeon
  stores once within the topic's idempotency window."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from pigeon.spark import options as opt
from pigeon.spark.client import PigeonClient
from pigeon.spark.publish import publish_batches

log = logging.getLogger("pigeon.spark")


class DataLossError(RuntimeError):
    """Messages the query should read are no longer retained (failOnDataLoss=true)."""


# --- planning (driver) ------------------------------------------------------------------------------
class RangePartition(InputPartition):
    """Offsets [start, end) of one shard of a topic (whose uid must not change)."""

    def __init__(self, shard: int, start: int, end: int, topic_uid: int):
        self.shard, self.start, self.end, self.topic_uid = shard, start, end, topic_uid

    def __repr__(self) -> str:
        return f"RangePartition(shard={self.shard}, start={self.start}, end={self.end})"


def plan(start: list[int], end: list[int], topic_uid: int, rows_per_partition: int) -> list[RangePartition]:
    """One partition per shard with messages to read, split every `rows_per_partition` offsets."""
    out = []
    for shard, (s, e) in enumerate(zip(start, end)):
        while s < e:
            out.append(RangePartition(shard, s, min(e, s + rows_per_partition), topic_uid))
            s += rows_per_partition
    return out


def admit(start: list[int], end: list[int], max_rows: int) -> list[int]:
    """Cap the rows between start and end at max_rows, shared evenly (water-filling) across shards."""
    want = [max(0, e - s) for s, e in zip(start, end)]
    if sum(want) <= max_rows:
        return list(end)
    give = [0] * len(want)
    left = max_rows
    open_ = [i for i, w in enumerate(want) if w > 0]
    while left > 0 and open_:
        share = max(1, left // len(open_))
        for i in list(open_):
            take = min(share, want[i] - give[i], left)
            give[i] += take
            left -= take
            if give[i] == want[i]:
                open_.remove(i)
            if left == 0:
                break
    return [s + g for s, g in zip(start, give)]


def trigger_due(pending: int, min_rows: int, waited_s: float, max_delay_s: float) -> bool:
    """Whether a micro-batch should take the `pending` rows now (minRowsPerTrigger, maxTriggerDelay)."""
    return pending > 0 and (pending >= min_rows or waited_s >= max_delay_s)


def _offsets(d: dict) -> list[int]:
    shards = d["shards"]
    return [int(shards[str(i)]) for i in range(len(shards))]


def _offset_dict(topic_uid: int, offsets: list[int]) -> dict:
    return {"topic_uid": topic_uid, "shards": {str(i): int(o) for i, o in enumerate(offsets)}}


def _start_offsets(c: PigeonClient, o: opt.Options, lo) -> list[int]:
    """Where a query without a checkpoint starts, per shard."""
    if o.starting_offsets is not None:
        if len(o.starting_offsets) != lo.shard_count:
            raise ValueError(f"startingOffsets lists {len(o.starting_offsets)} offsets; {o.topic} has "
                             f"{lo.shard_count} shards")
        return list(o.starting_offsets)
    if o.starting_position == "earliest":
        return [s.earliest for s in lo.shards]
    if o.starting_position == "latest":
        return [s.latest for s in lo.shards]
    if o.starting_position == "time":
        return [s.at_time for s in lo.shards]
    cur = c.create_cursor(o.cursor, o.topic, [])  # a missing cursor starts at the latest offsets
    return list(cur.offsets)


# --- reading (executors) ----------------------------------------------------------------------------
def _fail(e: grpc.RpcError, o: opt.Options, p: RangePartition):
    if e.code() == grpc.StatusCode.FAILED_PRECONDITION and "retained" in (e.details() or ""):
        raise DataLossError(f"{e.details()} Set failOnDataLoss=false to skip lost messages.") from None
    raise RuntimeError(f"pigeon: reading shard {p.shard} [{p.start}, {p.end}) of {o.topic} failed: "
                       f"{e.code().name}: {e.details()}") from None


_tuned = False
_MALLOC_TRIM_THRESHOLD, _MALLOC_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
malloc_trim_bytes = 64 << 20
malloc_mmap_bytes = 32 << 20  # (glibc's largest)


def _tune_worker() -> None:
    """In a Spark Python worker, once (outside a Spark task — tests, a driver — nothing is done):

    - gc.freeze: what the process holds by now (modules, classes, functions: with pyspark's, this package's
      imports — gRPC, protobuf, the Pub/Sub client — ~90,000 objects) is moved out of the garbage collector's
      reach. A reused worker runs a full gc.collect() after every task, which walked them all each time: ~40 ms
      of CPU a task, ~0.15 CPU s per million rows read in partitions of 250,000. They live as long as the
      process anyway; the garbage among them is collected first.
    - glibc's malloc keeps freed memory for the next response (mallopt: blocks up to 32 MiB from its heaps, up
      to 64 MiB free kept): each response (~8 MB) is otherwise allocated four times over (gRPC's bytes, the
      protobuf parse, its messages field, the decoded columns) in memory mapped afresh and faulted in page by
      page, ~0.1 CPU s of kernel time per million rows. The worker holds its peak (a few responses) instead.
      Only where the C library is glibc."""
    global _tuned
    if _tuned:
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    _tuned = True
    import gc
    import platform

    gc.collect()
    gc.freeze()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        import ctypes

        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            return
        mallopt(_MALLOC_TRIM_THRESHOLD, malloc_trim_bytes)
        mallopt(_MALLOC_MMAP_THRESHOLD, malloc_mmap_bytes)


def read_partition(o: opt.Options, p: RangePartition) -> Iterator:
    """The messages of one range as Arrow record batches, fetching the next call's data while the last
    one is converted."""
    from pigeon.spark.arrow import to_record_batch

    if not isinstance(p, RangePartition):  # Spark reads one placeholder partition when a plan has none
        return
    _tune_worker()
    c = PigeonClient(o.endpoint, o.auth)
    kw = dict(max_messages=o.read_messages_per_call, max_bytes=o.read_bytes_per_call,
              allow_data_loss=not o.fail_on_data_loss, topic_uid=p.topic_uid)
    try:
        pos = p.start
        pending = c.read_range_future(o.topic, p.shard, pos, p.end, **kw)
        while pos < p.end:
            try:
                r = pending.result()
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                r = c.read_range(o.topic, p.shard, pos, p.end, **kw)  # with retries
            if r.data_lost:
                log.warning("pigeon: shard %d of %s: offsets [%d, %d) were no longer retained and are skipped",
                            p.shard, o.topic, pos, r.start_offset)
            nxt = r.next_offset
            if nxt < p.end:
                if nxt <= pos:
                    raise RuntimeError(f"pigeon: no progress reading shard {p.shard} of {o.topic} at {pos}")
                pending = c.read_range_future(o.topic, p.shard, nxt, p.end, **kw)
            if r.lengths:
                yield to_record_batch(r, p.shard)
            pos = nxt
    except grpc.RpcError as e:
        _fail(e, o, p)
    finally:
        c.close()


class PigeonBatchReader(DataSourceReader):
    def __init__(self, o: opt.Options):
        self.o = o

    def partitions(self):
        c = PigeonClient(self.o.endpoint, self.o.auth)
        try:
            lo = c.latest_offsets(self.o.topic, self.o.starting_time_ms)
            if self.o.starting_position == "cursor" and self.o.starting_offsets is None:
                start = list(c.get_cursor(self.o.cursor).offsets)
            else:
                start = _start_offsets(c, self.o, lo)
        finally:
            c.close()
        end = [s.latest for s in lo.shards]
        return plan([min(s, e) for s, e in zip(start, end)], end, lo.topic_uid, self.o.max_rows_per_partition)

    def read(self, partition):
        return read_partition(self.o, partition)


class PigeonStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, o: opt.Options, clock=time.monotonic):
        self.o = o
        self._client: PigeonClient | None = None
        self._target: list[int] | None = None  # Trigger.AvailableNow: stop here
        self.clock = clock
        self._waiting_since: float | None = None  # when rows were first seen waiting (minRowsPerTrigger)

    @property
    def client(self) -> PigeonClient:
        if self._client is None:
            self._client = PigeonClient(self.o.endpoint, self.o.auth)
        return self._client

    def __getstate__(self):
        return {"o": self.o, "_client": None, "_target": self._target, "clock": self.clock,
                "_waiting_since": self._waiting_since}

    def initialOffset(self) -> dict:
        lo = self.client.latest_offsets(self.o.topic, self.o.starting_time_ms)
        start = _start_offsets(self.client, self.o, lo)
        if self.o.cursor and self.o.starting_position != "cursor":
            self.client.create_cursor(self.o.cursor, self.o.topic, start)
        return _offset_dict(lo.topic_uid, start)

    def _latest(self, start: dict) -> list[int]:
        lo = self.client.latest_offsets(self.o.topic)
        if lo.topic_uid != start["topic_uid"]:
            raise DataLossError(f"{self.o.topic} was deleted and created again since this query's checkpoint")
        begin = _offsets(start)
        if self.o.fail_on_data_loss:
            for i, (b, s) in enumerate(zip(begin, lo.shards)):
                if b < s.earliest:
                    raise DataLossError(
                        f"Messages from offset {b} of shard {i} of {self.o.topic} are no longer retained (oldest: "
                        f"{s.earliest}). Set failOnDataLoss=false to skip lost messages.")
        return [s.latest for s in lo.shards]

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = [s.latest for s in self.client.latest_offsets(self.o.topic).shards]

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.o.max_rows_per_trigger) if self.o.max_rows_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict = None, limit=None) -> dict:
        latest = self._latest(start)
        if self._target is not None:
            latest = [min(a, b) for a, b in zip(latest, self._target)]
        begin = _offsets(start)
        end = [max(b, e) for b, e in zip(begin, latest)]
        if self.o.min_rows_per_trigger and self._target is None and not self._due(sum(end) - sum(begin)):
            return start  # no micro-batch yet
        if isinstance(limit, ReadMaxRows):
            end = admit(begin, end, limit.max_rows)
        return _offset_dict(start["topic_uid"], end)

    def _due(self, pending: int) -> bool:
        now = self.clock()
        if pending and self._waiting_since is None:
            self._waiting_since = now
        waited = now - self._waiting_since if self._waiting_since is not None else 0.0
        if not trigger_due(pending, self.o.min_rows_per_trigger, waited, self.o.max_trigger_delay_s):
            return False
        self._waiting_since = None
        return True

    def reportLatestOffset(self):
        lo = self.client.latest_offsets(self.o.topic)
        return _offset_dict(lo.topic_uid, [s.latest for s in lo.shards])

    def partitions(self, start: dict, end: dict):
        return plan(_offsets(start), _offsets(end), int(start["topic_uid"]), self.o.max_rows_per_partition)

    def read(self, partition):
        return read_partition(self.o, partition)

    def commit(self, end: dict) -> None:
        if not self.o.cursor:
            return
        try:
            self.client.commit_cursor(self.o.cursor, _offsets(end))
        except grpc.RpcError as e:  # the checkpoint is the truth; a stale cursor only holds retention longer
            log.warning("pigeon: committing cursor %s failed: %s", self.o.cursor, e.details())

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# --- writing ------------------------------------------------------------------------------------------
@dataclass
class PigeonCommit(WriterCommitMessage):
    partition: int
    published: int


def _task() -> tuple[int, str | None]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, None
    return ctx.partitionId(), ctx.getLocalProperty("streaming.sql.batchId")


class PigeonWriter(DataSourceArrowWriter):
    """df.write.format("pigeon"): rows (data, attributes, ordering_key) become messages. Set option
    sinkId (and batchId) to make a re-run of the same write publish nothing twice."""

    def __init__(self, o: opt.Options, sink_id: str, batch_id: str):
        self.o, self.sink_id, self.batch_id = o, sink_id, batch_id

    def write(self, iterator):
        partition, _ = _task()
        n = publish_batches(PigeonClient(self.o.endpoint, self.o.auth), self.o.topic, iterator,
                            f"{self.sink_id}:{self.batch_id}:{partition}:")
        return PigeonCommit(partition, n)


class PigeonStreamWriter(DataSourceStreamArrowWriter):
    """writeStream.format("pigeon"): like PigeonWriter, with the micro-batch id in the key."""

    def __init__(self, o: opt.Options, sink_id: str):
        self.o, self.sink_id = o, sink_id

    def write(self, iterator):
        partition, batch_id = _task()
        if batch_id is None:
            raise RuntimeError("pigeon: the streaming writer runs without a micro-batch id")
        n = publish_batches(PigeonClient(self.o.endpoint, self.o.auth), self.o.topic, iterator,
                            f"{self.sink_id}:{batch_id}:{partition}:")
        return PigeonCommit(partition, n)

    def commit(self, messages, batchId) -> None:
        log.info("pigeon: micro-batch %s published %d messages", batchId, sum(m.published for m in messages if m))

    def abort(self, messages, batchId) -> None:
        # what was published stays; the replay of this batch publishes the same keys, which are stored once
        log.warning("pigeon: micro-batch %s aborted; its replay is deduplicated by idempotency key", batchId)


# --- the data source ----------------------------------------------------------------------------------
class PigeonDataSource(DataSource):
    """spark.read / readStream / write / writeStream .format("pigeon")."""

    @classmethod
    def name(cls) -> str:
        return "pigeon"

    def schema(self):
        from pigeon.spark.arrow import SPARK_SCHEMA

        return SPARK_SCHEMA

    def reader(self, schema):
        return PigeonBatchReader(opt.parse(self.options))

    def streamReader(self, schema):
        return PigeonStreamReader(opt.parse(self.options))

    def writer(self, schema, overwrite: bool):
        o = opt.parse(self.options)
        return PigeonWriter(o, o.sink_id or uuid.uuid4().hex, o.batch_id or "0")

    def streamWriter(self, schema, overwrite: bool):
        o = opt.parse(self.options)
        sink_id = o.sink_id or {k.lower(): v for k, v in dict(self.options).items()}.get("checkpointlocation")
        if not sink_id:
            raise ValueError("the pigeon stream writer needs option sinkId (stable across restarts of the query): "
                             "it makes replayed micro-batches publish nothing twice")
        return PigeonStreamWriter(o, sink_id)
