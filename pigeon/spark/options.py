"""Options of the `pigeon` Spark data source, parsed once on the driver. Owns the rule: every option has
one name, one default and one check, here; an unknown value fails before a query starts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone

from pigeon.core import names

ENDPOINT_DEFAULT = "localhost:8085"
max_rows_per_partition_default = 1_000_000
read_messages_per_call_default = 50_000  # fewer round trips; the byte cap bounds a call
read_bytes_per_call_default = 8 * 1024 * 1024
POSITIONS = ("earliest", "latest", "cursor", "time")


@dataclass(frozen=True)
class Options:
    endpoint: str
    topic: str  # projects/{project}/topics/{topic}
    starting_position: str  # earliest | latest | cursor | time
    starting_time_ms: int | None
    starting_offsets: list[int] | None  # explicit per-shard offsets (JSON list)
    cursor: str | None  # projects/{project}/subscriptions/{name}
    max_rows_per_trigger: int  # 0: no limit
    max_rows_per_partition: int
    fail_on_data_loss: bool
    read_messages_per_call: int
    read_bytes_per_call: int
    sink_id: str | None
    batch_id: str | None


def _bool(v: str, name: str) -> bool:
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false (got {v!r})")


def _int(v: str, name: str, lo: int = 0) -> int:
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"option {name} must be an integer (got {v!r})") from None
    if n < lo:
        raise ValueError(f"option {name} must be at least {lo} (got {n})")
    return n


def parse_time_ms(v: str) -> int:
    """Milliseconds since the epoch, or an ISO-8601 time (UTC unless it says otherwise)."""
    if v.strip().lstrip("-").isdigit():
        return int(v)
    t = datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp() * 1000)


def _resource(value: str, project: str | None, kind: str, option: str) -> str:
    if value.startswith("projects/"):
        names.split(value, kind)
        return value
    if not project:
        raise ValueError(f"option {option} must be a full name (projects/P/{kind}/NAME) or option project be set")
    full = names.join(project, kind, value)
    names.split(full, kind)
    return full


def parse(options, *, need_topic: bool = True) -> Options:
    o = {k.lower(): v for k, v in dict(options).items()}
    project = o.get("project")
    topic = o.get("topic") or o.get("path")
    if not topic and need_topic:
        raise ValueError("option topic is required (projects/P/topics/NAME, or NAME with option project)")
    topic = _resource(topic, project, "topics", "topic") if topic else ""
    cursor = o.get("cursor") or o.get("subscription")
    if cursor:
        cursor = _resource(cursor, project, "subscriptions", "cursor")
    pos = o.get("startingposition", "cursor" if cursor and "startingposition" not in o else "earliest").lower()
    starting_time = o.get("startingtime") or o.get("startingtimestamp")
    if pos not in POSITIONS:
        try:  # a time given directly as the position
            starting_time, pos = pos, "time"
            parse_time_ms(starting_time)
        except ValueError:
            raise ValueError(f"option startingPosition must be one of {', '.join(POSITIONS)} or a time") from None
    if pos == "cursor" and not cursor:
        raise ValueError("startingPosition cursor needs option cursor (a subscription name)")
    if pos == "time" and not starting_time:
        raise ValueError("startingPosition time needs option startingTime (ms since the epoch or ISO-8601)")
    offsets = None
    if "startingoffsets" in o:
        offsets = json.loads(o["startingoffsets"])
        if not (isinstance(offsets, list) and all(isinstance(x, int) and x >= 0 for x in offsets)):
            raise ValueError("option startingOffsets must be a JSON list of per-shard offsets")
    return Options(
        endpoint=o.get("endpoint") or os.environ.get("PUBSUB_EMULATOR_HOST") or ENDPOINT_DEFAULT,
        topic=topic,
        starting_position=pos,
        starting_time_ms=parse_time_ms(starting_time) if pos == "time" else None,
        starting_offsets=offsets,
        cursor=cursor,
        max_rows_per_trigger=_int(o.get("maxrowspertrigger", "0"), "maxRowsPerTrigger"),
        max_rows_per_partition=_int(o.get("maxrowsperpartition", str(max_rows_per_partition_default)),
                                    "maxRowsPerPartition", 1),
        fail_on_data_loss=_bool(o.get("failondataloss", "true"), "failOnDataLoss"),
        read_messages_per_call=_int(o.get("readmessagespercall", str(read_messages_per_call_default)),
                                    "readMessagesPerCall", 1),
        read_bytes_per_call=_int(o.get("readbytespercall", str(read_bytes_per_call_default)), "readBytesPerCall", 1),
        sink_id=o.get("sinkid"),
        batch_id=o.get("batchid"),
    )
