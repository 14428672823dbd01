"""Export subscriptions: a Spark structured-streaming job per subscription created with the Pub/Sub API's
`cloud_storage_config` (Parquet files) or `bigquery_config` (a Delta table written with `deltalake`).
Owns the rules:
- the subscription itself is the job's cursor: the job reads its topic by offset ranges from the
  subscription's ack floor, and once a micro-batch is written the floor moves past it (so backlog and
  retention are the subscription's, as for any other subscriber);
- a replayed micro-batch changes nothing and reads nothing: a batch whose files were all written has a
  manifest (under the job's checkpoint), a Delta commit carries the batch id as an application
  transaction, and a batch found done is skipped before its rows are read — they may already be gone,
  since the subscription's floor moves past a batch as soon as it is written;
- a file's name is a function of its content (the publish time and the (shard, offset) of its first
  row), written under a temporary name and renamed: writing the same rows again gives the same file;
- within a file (and a Delta commit) rows are sorted by (shard, offset): one ordering key lives on one
  shard, so per-key order is the row order, and across files it is recoverable from shard and offset;
- the subscription's filter is honoured (rows it rejects are not exported).

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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pigeon.broker.filter import compile_filter
from pigeon.core import names
from pigeon.spark import options as opt
from pigeon.spark.client import PigeonClient

log = logging.getLogger("pigeon.export")

DATETIME_FORMAT_DEFAULT = "YYYY-MM-DDThh:mm:ssZ"
file_max_duration_s_default = 300.0  # Pub/Sub's default max_duration (5 min)
file_max_duration_s_min = 60.0
bigquery_trigger_s = 10.0
max_rows_per_trigger_default = 200_000
row_overhead_bytes = 64  # a row's size in a file beyond its data and attributes (estimate)
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
    if sub.HasField("cloud_storage_config") and sub.cloud_storage_config.bucket:
        return ExportSpec(sub.name, sub.topic, "storage", sub.cloud_storage_config, sub.filter)
    if sub.HasField("bigquery_config") and sub.bigquery_config.table:
        return ExportSpec(sub.name, sub.topic, "bigquery", sub.bigquery_config, sub.filter)
    return None


def find_exports(client: PigeonClient, projects: list[str]) -> list[ExportSpec]:
    out = []
    for p in projects:
        out.extend(s for s in map(spec_of, client.list_subscriptions(p)) if s is not None)
    return out


# --- pure helpers ---------------------------------------------------------------------------------
def strftime_pubsub(fmt: str, t: datetime) -> str:
    """Pub/Sub's filename_datetime_format (YYYY MM DD hh mm ss; anything else is literal)."""
    return "".join(t.strftime(_TOKENS[p]) if p in _TOKENS else p
                   for p in re.split(r"(YYYY|MM|DD|hh|mm|ss)", fmt or DATETIME_FORMAT_DEFAULT))


def file_name(cfg, first_publish: datetime, shard: int, offset: int) -> str:
    """<prefix><datetime>_<shard>-<offset><suffix>, of the file's first row (unique: each row is exported once)."""
    # ':' (in Pub/Sub's default format) is not allowed in Hadoop file names, so Spark could not read them
    stamp = strftime_pubsub(cfg.filename_datetime_format, first_publish).replace(":", "-")
    return f"{cfg.filename_prefix}{stamp}_{shard}-{offset:012d}{cfg.filename_suffix}"


def bigquery_path(root: str, table: str) -> str:
    """project.dataset.table (or project:dataset.table) → <root>/_bigquery/project/dataset/table"""
    parts = re.split(r"[.:]", table)
    if len(parts) != 3 or not all(re.fullmatch(r"[A-Za-z0-9_\-]+", p) for p in parts):
        raise ValueError(f"bigquery_config.table must be project.dataset.table (got {table!r})")
    return os.path.join(root, "_bigquery", *parts)


def checkpoint_path(root: str, spec: ExportSpec) -> str:
    return os.path.join(root, "_checkpoints", spec.job_id)


def split_rows(table: pa.Table, max_messages: int, max_bytes: int) -> list[pa.Table]:
    """Consecutive slices with at most max_messages rows and about max_bytes bytes (at least one row)."""
    n = table.num_rows
    if n == 0:
        return []
    sizes = pc.add(pc.fill_null(pc.binary_length(table["data"]), 0), row_overhead_bytes).to_pylist()
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


def manifest_path(root: str, spec: ExportSpec, batch_id: int) -> str:
    return os.path.join(checkpoint_path(root, spec), "pigeon-files", f"{batch_id}.json")


def write_files(spec: ExportSpec, root: str, table: pa.Table, batch_id: int, ends: list[int]) -> list[str]:
    """The batch's rows as Parquet files in the bucket directory, then the batch's manifest; returns the
    files' paths."""
    cfg = spec.config
    bucket = os.path.join(root, cfg.bucket)
    paths = []
    for part in split_rows(table, cfg.max_messages, cfg.max_bytes):
        first = part["publish_time"][0].as_py().astimezone(timezone.utc)
        name = file_name(cfg, first, part["shard"][0].as_py(), part["offset"][0].as_py())
        path = os.path.join(bucket, name)
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

    stream = (
        spark.readStream.format("pigeon")
        .option("endpoint", endpoint)
        .option("topic", spec.topic)
        .option("cursor", spec.subscription)
        .option("startingPosition", "cursor")
        .option("failOnDataLoss", "false")  # what the subscription's retention dropped is gone for it
        .option("maxRowsPerTrigger", str(max_rows_per_trigger))
        .options(**access)
        .load()
    )
    w = stream.writeStream.foreachBatch(each_batch).option("checkpointLocation", checkpoint_path(root, spec))
    w = w.queryName("pigeon-export:" + spec.job_id.replace("/", ":"))
    if once:
        w = w.trigger(availableNow=True)
    elif spec.kind == "storage":
        d = spec.config.max_duration
        seconds = d.seconds + d.nanos / 1e9 if spec.config.HasField("max_duration") else file_max_duration_s_default
        w = w.trigger(processingTime=f"{max(seconds, file_max_duration_s_min):g} seconds")
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
