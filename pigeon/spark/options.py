"""Options of the `pigeon` Spark data source, parsed once on the driver. Owns the rule: every option has
one name, one default and one check, here; an unknown value fails before a query starts.

A secured node: tlsCa (a CA file: TLS, verifying the server), token or tokenFile (a bearer token), clientCert and
clientKey (mutual TLS); unset, the environment's PIGEON_CA_FILE, PIGEON_TOKEN, PIGEON_TOKEN_FILE,
PIGEON_CLIENT_CERT and PIGEON_CLIENT_KEY (as the command line takes them). The files are read here, on the
driver, and their contents travel to the executors with the options (pigeon.client.access)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from pigeon.client.access import ClientAuth
from pigeon.core import names

ENDPOINT_DEFAULT = "localhost:8085"
max_rows_per_partition_default = 1_000_000
read_messages_per_call_default = 50_000  # fewer round trips; the byte cap bounds a call
read_bytes_per_call_default = 8 * 1024 * 1024
POSITIONS = ("earliest", "latest", "cursor", "time")
MAX_TRIGGER_DELAY_DEFAULT = "15m"  # (Spark's Kafka source's default for the same option)
# the options of a secured node: ClientAuth.from_files's argument → (option, environment variable)
ACCESS = {"ca_file": ("tlsCa", "PIGEON_CA_FILE"), "token": ("token", "PIGEON_TOKEN"),
          "token_file": ("tokenFile", "PIGEON_TOKEN_FILE"), "cert_file": ("clientCert", "PIGEON_CLIENT_CERT"),
          "key_file": ("clientKey", "PIGEON_CLIENT_KEY")}


@dataclass(frozen=True)
class Options:
    endpoint: str
    topic: str  # projects/{project}/topics/{topic}
    starting_position: str  # earliest | latest | cursor | time
    starting_time_ms: int | None
    starting_offsets: list[int] | None  # explicit per-shard offsets (JSON list)
    cursor: str | None  # projects/{project}/subscriptions/{name}
    max_rows_per_trigger: int  # 0: no limit
    min_rows_per_trigger: int  # 0: a micro-batch as soon as anything is new; else once this many rows wait…
    max_trigger_delay_s: float  # … or this long after the first of them came (Kafka's minOffsetsPerTrigger)
    max_rows_per_partition: int
    fail_on_data_loss: bool
    read_messages_per_call: int
    read_bytes_per_call: int
    sink_id: str | None
    batch_id: str | None
    auth: ClientAuth | None = None  # a secured node's (None: plaintext)


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


def _seconds(v: str, name: str) -> float:
    """A duration: seconds, or a number with s, m or h."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(s|m|h)?\s*", v.lower())
    if not m:
        raise ValueError(f"option {name} must be a duration: seconds, or a number with s, m or h (got {v!r})")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]


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


def client_auth(options, env=None) -> ClientAuth | None:
    """The access the options give (each unset option from its environment variable; a token or token file
    given as an option replaces both of the environment's); None for plaintext. ValueError when they are wrong."""
    o = {k.lower(): v for k, v in dict(options).items() if v not in (None, "")}
    env = os.environ if env is None else env
    given = {arg: o.get(name.lower()) for arg, (name, _) in ACCESS.items()}
    from_env = {arg: env.get(var) or None for arg, (_, var) in ACCESS.items()}
    for group in (("token", "token_file"), ("cert_file", "key_file"), ("ca_file",)):
        if not any(given[a] for a in group):
            given.update({a: from_env[a] for a in group})
    try:
        return ClientAuth.from_files(**given)
    except ValueError as e:
        raise ValueError(f"pigeon options tlsCa/token/tokenFile/clientCert/clientKey: {e}") from None


def access_options(ca_file: str | None = None, token: str | None = None, token_file: str | None = None,
                   cert_file: str | None = None, key_file: str | None = None) -> dict[str, str]:
    """The data source options of these settings (files as absolute paths), for a job that starts queries."""
    given = {"ca_file": ca_file, "token": token, "token_file": token_file, "cert_file": cert_file,
             "key_file": key_file}
    return {ACCESS[k][0]: (v if k == "token" else os.path.abspath(os.path.expanduser(v)))
            for k, v in given.items() if v}


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
        min_rows_per_trigger=_int(o.get("minrowspertrigger", "0"), "minRowsPerTrigger"),
        max_trigger_delay_s=_seconds(o.get("maxtriggerdelay", MAX_TRIGGER_DELAY_DEFAULT), "maxTriggerDelay"),
        max_rows_per_partition=_int(o.get("maxrowsperpartition", str(max_rows_per_partition_default)),
                                    "maxRowsPerPartition", 1),
        fail_on_data_loss=_bool(o.get("failondataloss", "true"), "failOnDataLoss"),
        read_messages_per_call=_int(o.get("readmessagespercall", str(read_messages_per_call_default)),
                                    "readMessagesPerCall", 1),
        read_bytes_per_call=_int(o.get("readbytespercall", str(read_bytes_per_call_default)), "readBytesPerCall", 1),
        sink_id=o.get("sinkid"),
        batch_id=o.get("batchid"),
        auth=client_auth(options),
    )
