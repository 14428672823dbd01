"""Rows → PublishRequests for the Spark sink. Owns the rules:
- every row gets the idempotency key `{prefix}{index}` (index: the row's position in the task's input),
  unless the row already carries a pigeon-idempotency-key attribute: the same input publishes the same
  keys, so a replay is stored once (within the topic's idempotency window);
- rows with the same ordering key are published in input order; a request holds one ordering key and
  stays within Pub/Sub's request limits."""

from __future__ import annotations

from collections.abc import Iterable

from google.pubsub_v1 import types

from pigeon.core import limits, names

_PublishRequest = types.PublishRequest.pb()
_PubsubMessage = types.PubsubMessage.pb()
request_bytes_target = limits.publish_request_bytes_max - 1024 * 1024  # headroom for framing and keys
KEY = names.ATTR_IDEMPOTENCY_KEY


def _column(batch, name: str):
    i = batch.schema.get_field_index(name)
    return batch.column(i).to_pylist() if i >= 0 else None


def messages_from_batch(batch, prefix: str, first_index: int) -> list[tuple[str, object]]:
    """(ordering key, PubsubMessage) per row of an Arrow record batch with a `data` column (binary or
    string) and optional `attributes` (map<string,string>) and `ordering_key` (string) columns."""
    data = _column(batch, "data")
    if data is None:
        raise ValueError("the pigeon sink needs a column named data (binary or string)")
    attrs = _column(batch, "attributes")
    keys = _column(batch, "ordering_key")
    out = []
    for i, d in enumerate(data):
        if isinstance(d, str):
            d = d.encode()
        a = {k: v for k, v in (attrs[i] or ()) if v is not None} if attrs is not None else {}
        a.setdefault(KEY, f"{prefix}{first_index + i}")
        k = (keys[i] or "") if keys is not None else ""
        out.append((k, _PubsubMessage(data=d or b"", attributes=a, ordering_key=k)))
    return out


def requests_for(topic: str, msgs: list[tuple[str, object]]) -> list:
    """Group messages by ordering key (keeping each key's order) into requests within the limits."""
    by_key: dict[str, list] = {}
    for k, m in msgs:
        by_key.setdefault(k, []).append(m)
    out = []
    for group in by_key.values():
        cur, size = [], 0
        for m in group:
            n = m.ByteSize() + 16
            if cur and (len(cur) >= limits.publish_messages_max or size + n > request_bytes_target):
                out.append(_PublishRequest(topic=topic, messages=cur))
                cur, size = [], 0
            cur.append(m)
            size += n
        if cur:
            out.append(_PublishRequest(topic=topic, messages=cur))
    return out


def publish_batches(client, topic: str, batches: Iterable, prefix: str) -> int:
    """Publish every row of the record batches in order; return how many rows were published."""
    index = 0
    try:
        for batch in batches:
            msgs = messages_from_batch(batch, prefix, index)
            index += len(msgs)
            for req in requests_for(topic, msgs):
                client.publish(req)
    finally:
        client.close()
    return index
