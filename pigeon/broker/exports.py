"""Export subscriptions' configuration (`cloud_storage_config`, `bigquery_config`). Owns the rules:
- Pub/Sub's limits on a Cloud Storage subscription's files (max_duration 1-10 minutes, max_bytes 1 KB-10 GiB,
  max_messages at least 1,000; a suffix does not end in "/") and on a bucket's name, checked at create and update;
- a bucket, a file name and a BigQuery table name stay inside the export root: a bucket is one directory under it,
  a prefix, datetime format or suffix holds no ".." segment and no absolute path, a table is project.dataset.table
  of letters, digits, '_' and '-' — so no subscription can make a node write elsewhere;
- one kind of delivery per subscription (push, Cloud Storage, BigQuery), as Pub/Sub has it;
- what Pigeon cannot honour there is refused (a topic schema's columns), never stored and ignored.
Pure: the supervisor of the exports (pigeon.node.exports) and the Spark job (pigeon.spark.export) read names and
defaults from here."""

from __future__ import annotations

import re

from pigeon.core.errors import InvalidArgument, Unimplemented

max_duration_s_min = 60.0  # Pub/Sub's bounds on CloudStorageConfig.max_duration
max_duration_s_max = 600.0
max_duration_s_default = 300.0  # a new file at least every 5 minutes when max_duration is unset
max_bytes_min = 1000  # "Min 1 KB, max 10 GiB"
max_bytes_max = 10 << 30
max_messages_min = 1000
DATETIME_FORMAT_DEFAULT = "YYYY-MM-DDThh:mm:ssZ"

_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]\Z")
_TABLE_PART = re.compile(r"[A-Za-z0-9_\-]+\Z")


def kind(sub) -> str:
    """"storage", "bigquery" or "" (not an export subscription) — of a Subscription proto."""
    if sub.HasField("cloud_storage_config") and sub.cloud_storage_config.bucket:
        return "storage"
    if sub.HasField("bigquery_config") and sub.bigquery_config.table:
        return "bigquery"
    return ""


def output_format(cfg) -> str:
    """A CloudStorageConfig's files: "text", "avro", or "parquet" when it names neither (Pigeon's default: Pub/Sub
    has no Parquet, and its default, text, keeps only the data)."""
    return {"text_config": "text", "avro_config": "avro"}.get(cfg.WhichOneof("output_format"), "parquet")


def max_duration_s(cfg) -> float:
    d = cfg.max_duration
    return d.seconds + d.nanos / 1e9 if cfg.HasField("max_duration") else max_duration_s_default


def table_parts(table: str) -> list[str]:
    """project.dataset.table (or project:dataset.table) → its three parts; InvalidArgument otherwise."""
    parts = re.split(r"[.:]", table)
    if len(parts) != 3 or not all(_TABLE_PART.match(p) for p in parts):
        raise InvalidArgument(f"Invalid bigquery_config.table ({table}): it must be project.dataset.table.")
    return parts


def _check_path_part(value: str, field: str) -> None:
    if "\x00" in value or value.startswith("/") or any(p in ("..", ".") for p in value.split("/")):
        raise InvalidArgument(f"Invalid cloud_storage_config.{field} ({value!r}): a file name stays in its bucket "
                              "(no '..' or '.' segment, no leading '/').")


def check(sub) -> None:
    """Validate a Subscription's export configuration (INVALID_ARGUMENT or UNIMPLEMENTED naming the field); its
    `state` is output only (the node's: pigeon.node.exports), so what a client sent there is dropped."""
    has_storage, has_bq = sub.HasField("cloud_storage_config"), sub.HasField("bigquery_config")
    if has_storage + has_bq + bool(sub.push_config.push_endpoint) > 1:
        raise InvalidArgument("A subscription delivers one way: set at most one of push_config.push_endpoint, "
                              "bigquery_config and cloud_storage_config.")
    if has_storage:
        _check_storage(sub.cloud_storage_config)
        sub.cloud_storage_config.ClearField("state")
    if has_bq:
        _check_bigquery(sub.bigquery_config)
        sub.bigquery_config.ClearField("state")


def _check_storage(c) -> None:
    if not _BUCKET.match(c.bucket) or ".." in c.bucket:
        raise InvalidArgument(f"Invalid cloud_storage_config.bucket ({c.bucket!r}): 3 to 63 lowercase letters, "
                              "digits, '-', '_' or '.', starting and ending with a letter or digit, no 'gs://'.")
    _check_path_part(c.filename_prefix, "filename_prefix")
    _check_path_part(c.filename_datetime_format, "filename_datetime_format")
    _check_path_part(c.filename_suffix, "filename_suffix")
    if c.filename_suffix.endswith("/"):
        raise InvalidArgument("Invalid cloud_storage_config.filename_suffix: it must not end in '/'.")
    if c.HasField("max_duration") and not max_duration_s_min <= max_duration_s(c) <= max_duration_s_max:
        raise InvalidArgument(f"Invalid cloud_storage_config.max_duration: it must be between 1 and 10 minutes "
                              f"(got {max_duration_s(c):g}s).")
    if c.max_bytes and not max_bytes_min <= c.max_bytes <= max_bytes_max:
        raise InvalidArgument(f"Invalid cloud_storage_config.max_bytes: it must be between 1 KB and 10 GiB "
                              f"(got {c.max_bytes}).")
    if c.max_messages and c.max_messages < max_messages_min:
        raise InvalidArgument(f"Invalid cloud_storage_config.max_messages: it must be at least {max_messages_min} "
                              f"(got {c.max_messages}).")
    if c.HasField("avro_config") and c.avro_config.use_topic_schema:
        raise Unimplemented("The field cloud_storage_config.avro_config.use_topic_schema is not supported by "
                            "Pigeon: Avro files carry the message data as bytes; leave it unset.")


def _check_bigquery(c) -> None:
    table_parts(c.table)
    for field in ("use_topic_schema", "use_table_schema"):
        if getattr(c, field):
            raise Unimplemented(f"The field bigquery_config.{field} is not supported by Pigeon: the Delta table "
                                "holds the message data as bytes (with write_metadata, the message's fields "
                                "beside it); leave it unset.")
