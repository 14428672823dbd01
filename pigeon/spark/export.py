"""Export subscriptions: a Spark structured-streaming job per subscription created with the Pub/Sub API's
`cloud_storage_config` (Parquet, Avro or text files) or `bigquery_config` (a Delta table written with `deltalake`).
Owns the rules:
- the subscription itself is the job's cursor: the job reads its topic by offset ranges from the
  subscription's ack floor, and once a micro-batch is written the floor moves past it (so backlog and
  retention are the subscription's, as for any other subscriber);
- a replayed micro-batch changes nothing and reads nothing: a batch whose files were all written has a
  manifest (under the job's checkpoint), a Delta commit carries the batch id as an application
  transaction, and a batch found done is skipped before its rows are read — they may already be gone,
  since the subscription's floor moves past a batch as soon as it is written;
- a file's name is a function of its content (the publish time and the (shard, offset) of its first
  row), and so are its bytes (an Avro file's sync marker is drawn from its name): it is written under a temporary
  name and renamed, so writing the same rows again gives the same file;
- a file ends at max_messages rows or about max_bytes bytes; a micro-batch (and so a file) starts once
  max_messages are waiting, or max_duration after the first waiting message (the source holds the trigger until
  then: minRowsPerTrigger, maxTriggerDelay) — Pub/Sub's rule for when a file is finished;
- within a file (and a Delta commit) rows are sorted by (shard, offset): one ordering key lives on one
  shard, so per-key order is the row order, and across files it is recoverable from shard and offset;
- the subscription's filter is honoured (rows it rejects are not exported).

Formats (pigeon.broker.exports.output_format): `text_config` — each message's data and a newline; `avro_config` —
an Avro container file of records {data} or, with write_metadata, {subscription_name, message_id, publish_time
(timestamp-micros), attributes (the ordering key among them, as "ordering_key"), data}, as Pub/Sub writes them;
neither — Parquet with the connector's columns.

Layout under the export root:  <bucket>/<prefix><datetime>_<shard>-<offset><suffix>  (Cloud Storage analogue),
_bigquery/<project>/<dataset>/<table>  (Delta tables), _checkpoints/<project>/<subscription>  (Spark)."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import hashlib

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pigeon.broker import exports
from pigeon.broker.filter import compile_filter
from pigeon.core import names
from pigeon.spark import options as opt
from pigeon.spark.client import PigeonClient

log = logging.getLogger("pigeon.export")

bigquery_trigger_s = 5.0  # a Delta commit this often while messages come (Pub/Sub's BigQuery writes stream)
storage_poll_s = 5.0  # how often a Cloud Storage export asks whether a file is due (max_messages or max_duration)
max_rows_per_trigger_default = 200_000
row_overhead_bytes = {"parquet": 64, "avro": 48, "text": 1}  # a row's bytes in a file beyond its data (estimate)
rescan_s_default = 30.0
_TOKENS = {"YYYY": "%Y", "MM": "%m", "DD": "%d", "hh": "%H", "mm": "%M", "ss": "%S"}


@dataclass(frozen=True)
class ExportSpec:
    """One export subscription, as the job needs it."""

    subscription: str
    topic: str
    kind: str  # "storage" | "bigquery"
    config: object  # CloudStorageConfig or BigQueryConfig proto
    filter: str

    @property
    def job_id(self) -> str:
        project, sub = names.split(self.subscription, "subscriptions")
        return f"{project}/{sub}"


def spec_of(sub) -> ExportSpec | None:
    if sub.detached or not sub.topic or sub.topic == names.DELETED_TOPIC:
        return None
    kind = exports.kind(sub)
    if not kind:
        return None
    return ExportSpec(sub.name, sub.topic, kind, sub.cloud_storage_config if kind == "storage" else
                      sub.bigquery_config, sub.filter)


def find_exports(client: PigeonClient, projects: list[str]) -> list[ExportSpec]:
    out = []
    for p in projects:
        out.extend(s for s in map(spec_of, client.list_subscriptions(p)) if s is not None)
    return out


# --- pure helpers ---------------------------------------------------------------------------------
def strftime_pubsub(fmt: str, t: datetime) -> str:
    """Pub/Sub's filename_datetime_format (YYYY MM DD hh mm ss; anything else is literal)."""
    return "".join(t.strftime(_TOKENS[p]) if p in _TOKENS else p
                   for p in re.split(r"(YYYY|MM|DD|hh|mm|ss)", fmt or exports.DATETIME_FORMAT_DEFAULT))


def file_name(cfg, first_publish: datetime, shard: int, offset: int) -> str:
    """<prefix><datetime>_<shard>-<offset><suffix>, of the file's first row (unique: each row is exported once)."""
    # ':' (in Pub/Sub's default format) is not allowed in Hadoop file names, so Spark could not read them
    stamp = strftime_pubsub(cfg.filename_datetime_format, first_publish).replace(":", "-")
    return f"{cfg.filename_prefix}{stamp}_{shard}-{offset:012d}{cfg.filename_suffix}"


def bigquery_path(root: str, table: str) -> str:
    """project.dataset.table (or project:dataset.table) → <root>/_bigquery/project/dataset/table"""
    return os.path.join(root, "_bigquery", *exports.table_parts(table))


def checkpoint_path(root: str, spec: ExportSpec) -> str:
    return os.path.join(root, "_checkpoints", spec.job_id)


def split_rows(table: pa.Table, max_messages: int, max_bytes: int, overhead: int = row_overhead_bytes["parquet"]
               ) -> list[pa.Table]:
    """Consecutive slices with at most max_messages rows and about max_bytes bytes (at least one row)."""
    n = table.num_rows
    if n == 0:
        return []
    sizes = pc.add(pc.fill_null(pc.binary_length(table["data"]), 0), overhead).to_pylist()
    out, start, acc = [], 0, 0
    for i, s in enumerate(sizes):
        rows = i - start
        if rows and ((max_messages and rows >= max_messages) or (max_bytes and acc + s > max_bytes)):
            out.append(table.slice(start, rows))
            start, acc = i, 0
        acc += s
    out.append(table.slice(start, n - start))
    return out


def _prepare(table: pa.Table, flt) -> pa.Table:
    if flt is not None and table.num_rows:
        keep = [flt.matches(dict(a or ())) for a in table["attributes"].to_pylist()]
        table = table.filter(pa.array(keep, pa.bool_()))
    return table.sort_by([("shard", "ascending"), ("offset", "ascending")])


def _ends(table: pa.Table, shard_count: int) -> list[int]:
    """Per shard, the offset after the last row of the batch (0 where the batch has none)."""
    ends = [0] * shard_count
    if table.num_rows:
        grouped = table.group_by("shard").aggregate([("offset", "max")])
        for s, o in zip(grouped["shard"].to_pylist(), grouped["offset_max"].to_pylist()):
            ends[s] = o + 1
    return ends


# --- sinks ------------------------------------------------------------------------------------------
def _atomic(path: str, write) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    d = os.open(os.path.dirname(path), os.O_RDONLY)
    try:  # the rename too: a manifest must not outlive a file it lists
        os.fsync(d)
    finally:
        os.close(d)


def manifest_path(root: str, spec: ExportSpec, batch_id: int) -> str:
    return os.path.join(checkpoint_path(root, spec), "pigeon-files", f"{batch_id}.json")


AVRO_DATA = {"type": "record", "name": "PubsubMessage", "fields": [{"name": "data", "type": "bytes"}]}
AVRO_WITH_METADATA = {"type": "record", "name": "PubsubMessageWithMetadata", "fields": [
    {"name": "subscription_name", "type": "string"}, {"name": "message_id", "type": "string"},
    {"name": "publish_time", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "attributes", "type": {"type": "map", "values": "string"}}, {"name": "data", "type": "bytes"}]}


def _write_text(part: pa.Table, path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"".join((d or b"") + b"\n" for d in part["data"].to_pylist()))


def _write_avro(spec: ExportSpec, part: pa.Table, path: str, name: str) -> None:
    import fastavro

    data = part["data"].to_pylist()
    if spec.config.avro_config.write_metadata:
        schema = AVRO_WITH_METADATA
        micros = pc.cast(pc.cast(part["publish_time"], pa.timestamp("us", "UTC")), pa.int64()).to_pylist()
        records = []
        for mid, t, attrs, key, d in zip(part["message_id"].to_pylist(), micros, part["attributes"].to_pylist(),
                                         part["ordering_key"].to_pylist(), data):
            attrs = dict(attrs or ())
            if key:
                attrs["ordering_key"] = key
            records.append({"subscription_name": spec.subscription, "message_id": mid, "publish_time": t,
                            "attributes": attrs, "data": d or b""})
    else:
        schema, records = AVRO_DATA, [{"data": d or b""} for d in data]
    with open(path, "wb") as f:  # a sync marker of the name's: the same rows give the same bytes
        fastavro.writer(f, fastavro.parse_schema(schema), records,
                        sync_marker=hashlib.sha256(name.encode()).digest()[:16])


def write_files(spec: ExportSpec, root: str, table: pa.Table, batch_id: int, ends: list[int]) -> list[str]:
    """The batch's rows as files of the subscription's format in the bucket directory, then the batch's manifest;
    returns the files' paths."""
    cfg = spec.config
    fmt = exports.output_format(cfg)
    bucket = os.path.join(root, cfg.bucket)
    paths = []
    for part in split_rows(table, cfg.max_messages, cfg.max_bytes, row_overhead_bytes[fmt]):
        first = part["publish_time"][0].as_py().astimezone(timezone.utc)
        name = file_name(cfg, first, part["shard"][0].as_py(), part["offset"][0].as_py())
        path = os.path.join(bucket, name)
        if fmt == "text":
            _atomic(path, lambda tmp, part=part: _write_text(part, tmp))
        elif fmt == "avro":
            _atomic(path, lambda tmp, part=part, name=name: _write_avro(spec, part, tmp, name))
        else:
            _atomic(path, lambda tmp, part=part: pq.write_table(part, tmp))
        paths.append(path)
    body = json.dumps({"files": [os.path.relpath(p, root) for p in paths], "ends": ends}).encode()
    _atomic(manifest_path(root, spec, batch_id), lambda tmp: open(tmp, "wb").write(body))
    return paths


def files_done(spec: ExportSpec, root: str, batch_id: int) -> list[int] | None:
    """The `ends` of a batch whose files are all written, or None."""
    try:
        with open(manifest_path(root, spec, batch_id), "rb") as f:
            return json.loads(f.read())["ends"]
    except FileNotFoundError:
        return None


def delta_done(spec: ExportSpec, root: str, batch_id: int) -> bool:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        done = DeltaTable(bigquery_path(root, spec.config.table)).transaction_version(_app_id(spec))
    except TableNotFoundError:
        return False
    return done is not None and done >= batch_id


def _app_id(spec: ExportSpec) -> str:
    return f"pigeon-export:{spec.subscription}"


def write_delta(spec: ExportSpec, root: str, table: pa.Table, batch_id: int) -> bool:
    """Append the batch to the Delta table unless a commit of this batch is already there."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    path = bigquery_path(root, spec.config.table)
    if delta_done(spec, root, batch_id):
        return False  # a replay of a committed batch
    if spec.config.write_metadata:
        sub = pa.array([spec.subscription] * table.num_rows, pa.string())
        out = table.select(["message_id", "publish_time", "attributes", "data", "shard", "offset", "ordering_key"])
        out = out.add_column(0, "subscription_name", sub)
    else:
        out = table.select(["data"])
    os.makedirs(path, exist_ok=True)
    write_deltalake(path, out, mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(_app_id(spec), batch_id)]))
    return True


# --- the streaming job -----------------------------------------------------------------------------
def start_export(spark, endpoint: str, spec: ExportSpec, root: str, *, once: bool = False,
                 max_rows_per_trigger: int = max_rows_per_trigger_default, access: dict[str, str] | None = None):
    """Start the structured-streaming query for one export subscription; returns the StreamingQuery. `access`: a
    secured node's data source options (tlsCa, token or tokenFile, clientCert and clientKey)."""
    from pigeon.spark import register

    register(spark)
    flt = compile_filter(spec.filter)
    access = access or {}
    client = PigeonClient(endpoint, opt.client_auth(access))
    shard_count = client.latest_offsets(spec.topic).shard_count

    def each_batch(df, batch_id: int) -> None:
        if spec.kind == "storage":
            ends = files_done(spec, root, batch_id)
            if ends is not None:  # a replay of a written batch: its rows may be gone already, read nothing
                client.commit_cursor(spec.subscription, ends)
                return
        elif delta_done(spec, root, batch_id):
            return
        table = df.toArrow()
        ends = _ends(table, shard_count)
        table = _prepare(table, flt)
        if spec.kind == "storage":
            write_files(spec, root, table, batch_id, ends)
        elif table.num_rows:
            write_delta(spec, root, table, batch_id)
        if any(ends):  # written: the subscription's floor moves now, not one trigger later
            client.commit_cursor(spec.subscription, ends)

    rows_per_trigger, hold = max_rows_per_trigger, {}
    if spec.kind == "storage" and not once:  # a file is due at max_messages rows or max_duration
        m = spec.config.max_messages
        if m:  # batches of whole files
            rows_per_trigger = max(m, m * (max_rows_per_trigger // m))
        hold = {"minRowsPerTrigger": str(m or rows_per_trigger),
                "maxTriggerDelay": f"{exports.max_duration_s(spec.config):g}"}
    stream = (
        spark.readStream.format("pigeon")
        .option("endpoint", endpoint)
        .option("topic", spec.topic)
        .option("cursor", spec.subscription)
        .option("startingPosition", "cursor")
        .option("failOnDataLoss", "false")  # what the subscription's retention dropped is gone for it
        .option("maxRowsPerTrigger", str(rows_per_trigger))
        .options(**hold, **access)
        .load()
    )
    w = stream.writeStream.foreachBatch(each_batch).option("checkpointLocation", checkpoint_path(root, spec))
    w = w.queryName("pigeon-export:" + spec.job_id.replace("/", ":"))
    if once:
        w = w.trigger(availableNow=True)
    elif spec.kind == "storage":  # (the source holds each micro-batch until its file is due)
        w = w.trigger(processingTime=f"{storage_poll_s:g} seconds")
    else:
        w = w.trigger(processingTime=f"{bigquery_trigger_s:g} seconds")
    return w.start()


def session(master: str | None = None, app_name: str = "pigeon-export"):
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    elif not os.environ.get("SPARK_REMOTE") and not os.environ.get("MASTER"):
        b = b.master("local[*]")
    return b.getOrCreate()


def run(endpoint: str, projects: list[str], root: str, *, once: bool = False, master: str | None = None,
        rescan_s: float = rescan_s_default, max_rows_per_trigger: int = max_rows_per_trigger_default,
        spark=None, access: dict[str, str] | None = None) -> int:
    """Run one job per export subscription of `projects`. once: drain what is there now and return the
    number of jobs; otherwise keep them running, starting and stopping jobs as subscriptions come and go.
    `access`: a secured node's data source options (options.access_options), for this job and its queries."""
    client = PigeonClient(endpoint, opt.client_auth(access or {}))
    specs = find_exports(client, projects)  # a node that refuses the access (or is not there) fails before Spark
    spark = spark or session(master)
    if once:
        for spec in specs:
            q = start_export(spark, endpoint, spec, root, once=True, max_rows_per_trigger=max_rows_per_trigger,
                             access=access)
            q.awaitTermination()
            log.info("exported %s", spec.subscription)
        return len(specs)
    running: dict[str, tuple[ExportSpec, object]] = {}
    while True:
        wanted = {s.subscription: s for s in specs}
        for name, (spec, q) in list(running.items()):
            if wanted.get(name) != spec or not q.isActive:
                if q.isActive:
                    q.stop()
                elif q.exception() is not None:
                    log.error("export of %s failed (restarting): %s", name, q.exception())
                del running[name]
        for name, spec in wanted.items():
            if name not in running:
                log.info("starting export of %s (%s)", name, spec.kind)
                running[name] = (spec, start_export(spark, endpoint, spec, root,
                                                    max_rows_per_trigger=max_rows_per_trigger, access=access))
        time.sleep(rescan_s)
        specs = find_exports(client, projects)
