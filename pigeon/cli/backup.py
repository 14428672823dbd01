"""`pigeon backup` and `pigeon restore`: a node's or a cluster's resources as JSON files, and with --data the
messages its subscriptions have not acknowledged, read and loaded through the public APIs only (any node of a
cluster answers for all). Owns the layout of a backup directory:

  definitions.json   {"format": 1, "projects": {project: {"topics", "subscriptions", "schemas", "snapshots",
                      "iam"}}} — each resource as the API's Get/List answers it (proto3 JSON), schemas with all
                      their revisions (oldest first), IAM policies by resource name (empty ones left out)
  data/<project>/<subscription>.jsonl   with --data: one line per unacknowledged message — message_id, data
                      (base64), attributes, ordering_key, publish_time, delivery_attempt, state

Rules (docs/operations.md, "Backup and restore"):
  * reading changes nothing: messages are looked at with the Queue service's Peek (no delivery attempt counted,
    no lease taken), over the offsets the Ranges service says each topic retains;
  * restore needs an empty target (no topic, subscription or schema of a project in the backup) and creates in
    dependency order: schemas (revision by revision), topics (their schema revisions renumbered), subscriptions
    (dead-letter topics exist by then), messages, snapshots, IAM policies;
  * messages are published again to their own topic, in their original order (per ordering key too), each once
    even when several subscriptions held it; every subscription then drops (Queue's Delete) the restored messages
    it had acknowledged. They get new message ids and publish times; delivery attempts start again, and leases
    and ack deadlines in flight are not carried;
  * a snapshot is taken again of its restored subscription: it holds that subscription's backlog as restored,
    with a new expiry."""

from __future__ import annotations

import base64
import json
import os
from typing import Callable

import grpc

FORMAT = 1
_DEFINITIONS = "definitions.json"
_OUTPUT_ONLY = {"topics": ("state",), "subscriptions": ("state", "topicMessageRetentionDuration",
                                                        "analyticsHubSubscriptionInfo")}


class BackupError(Exception):
    """A backup that cannot be written or read, or a target that is not empty: said in one line."""


class _Access:
    """The official clients and Pigeon's own services, over one address."""

    def __init__(self, address: str, auth=None):
        from google.cloud import pubsub_v1

        from pigeon.client import PigeonClient
        from pigeon.client.access import channel, pubsub_clients

        self.pub, self.sub = pubsub_clients(address, auth)
        self.schemas = pubsub_v1.SchemaServiceClient(
            **({} if auth is None else {"transport": _schema_transport(channel(address, auth))}))
        self.queue = PigeonClient(address, publisher=self.pub,
                                  credentials=auth.credentials() if auth is not None else None)
        self._channel = channel(address, auth)

    def call(self, method: str, request, response_cls):
        rpc = self._channel.unary_unary(method, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=response_cls.FromString)
        return rpc(request, timeout=60)

    def close(self) -> None:
        self.queue.close()
        self._channel.close()
        self.sub.close()
        self.pub.stop()


def _schema_transport(ch):
    from google.pubsub_v1.services.schema_service.transports import SchemaServiceGrpcTransport

    return SchemaServiceGrpcTransport(channel=ch)


def _json(message) -> dict:
    """proto3 JSON of a proto-plus or a protobuf message."""
    from google.protobuf import json_format

    pb = type(message).pb(message) if hasattr(type(message), "pb") else message
    return json_format.MessageToDict(pb)


# --- backup ---------------------------------------------------------------------------------------------------
def backup(address: str, directory: str, projects: list[str], data: bool, auth=None,
           say: Callable[[str], None] = print) -> dict:
    """Write the backup of `projects` (all of the node's when empty) to `directory`; returns the counts."""
    if os.path.exists(os.path.join(directory, _DEFINITIONS)):
        raise BackupError(f"{directory} already holds a backup ({_DEFINITIONS}): give an empty directory")
    os.makedirs(directory, exist_ok=True)
    api = _Access(address, auth)
    try:
        projects = projects or _projects(api)
        defs = {p: _definitions(api, p) for p in projects}
        counts = {k: sum(len(d[k]) for d in defs.values()) for k in ("topics", "subscriptions", "schemas",
                                                                      "snapshots", "iam")}
        if data:
            counts["messages"] = sum(_write_messages(api, directory, p, s) for p, d in defs.items()
                                     for s in d["subscriptions"])
    finally:
        api.close()
    with open(os.path.join(directory, _DEFINITIONS), "w") as f:  # last: a backup cut short has none
        json.dump({"format": FORMAT, "data": data, "projects": defs}, f, indent=1, sort_keys=True)
    say("pigeon backup: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + f" in {directory}")
    return counts


def _projects(api: _Access) -> list[str]:
    from pigeon.api.proto import pigeon_monitoring_pb2 as m

    r = api.call("/pigeon.v1.Monitoring/ListProjects", m.ListProjectsRequest(), m.ListProjectsResponse)
    return [p.split("/", 1)[1] for p in r.projects]


def _definitions(api: _Access, project: str) -> dict:
    from google.pubsub_v1 import types

    path = f"projects/{project}"
    topics = [_json(t) for t in api.pub.list_topics(project=path)]
    subscriptions = [_json(api.sub.get_subscription(subscription=s.name))
                     for s in api.sub.list_subscriptions(project=path)]
    schemas = [[_json(r) for r in reversed(list(api.schemas.list_schema_revisions(
        request={"name": s.name, "view": types.SchemaView.FULL})))]
        for s in api.schemas.list_schemas(request={"parent": path})]
    snapshots = [_json(s) for s in api.sub.list_snapshots(project=path)]
    iam = {}
    for kind, items, client in (("topic", topics, api.pub), ("subscription", subscriptions, api.sub),
                                ("snapshot", snapshots, api.sub), ("schema", [s[0] for s in schemas], api.schemas)):
        for item in items:
            policy = _json(client.get_iam_policy(request={"resource": item["name"]}))
            policy.pop("etag", None)
            if policy.get("bindings"):
                iam[item["name"]] = policy
    return {"topics": topics, "subscriptions": subscriptions, "schemas": schemas, "snapshots": snapshots,
            "iam": iam}


def _write_messages(api: _Access, directory: str, project: str, subscription: dict) -> int:
    """The subscription's unacknowledged messages, oldest first, as JSON lines; returns how many."""
    from google.api_core import exceptions as gexc

    from pigeon.api.proto import pigeon_ranges_pb2 as r

    name, topic = subscription["name"], subscription.get("topic", "")
    lines = []
    if topic and topic != "_deleted-topic_":
        offsets = api.call("/pigeon.v1.Ranges/LatestOffsets", r.LatestOffsetsRequest(topic=topic),
                           r.LatestOffsetsResponse)
        for shard in offsets.shards:
            for offset in range(shard.earliest, shard.latest):
                mid = str(((offsets.topic_uid << offsets.offset_bits | offset) << offsets.shard_bits) | shard.shard)
                try:
                    seen = api.queue.peek(name, mid)
                except (grpc.RpcError, gexc.NotFound) as e:
                    if _code(e) == grpc.StatusCode.NOT_FOUND:  # not this subscription's (filtered, older)
                        continue
                    raise
                if seen.state != "acked":
                    lines.append(_message_line(seen))
    lines.sort(key=lambda m: (m["publish_time"], int(m["message_id"])))
    out = os.path.join(directory, "data", project, name.rsplit("/", 1)[1] + ".jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.writelines(json.dumps(m, sort_keys=True) + "\n" for m in lines)
    return len(lines)


def _code(e) -> grpc.StatusCode | None:
    code = getattr(e, "grpc_status_code", None)
    return code if code is not None else (e.code() if hasattr(e, "code") and callable(e.code) else None)


def _message_line(seen) -> dict:
    m = seen.message
    return {"message_id": m.message_id, "data": base64.b64encode(m.data).decode(), "attributes": dict(m.attributes),
            "ordering_key": m.ordering_key, "publish_time": m.publish_time.isoformat(),
            "delivery_attempt": seen.delivery_attempt, "state": seen.state}


# --- restore --------------------------------------------------------------------------------------------------
def restore(address: str, directory: str, auth=None, say: Callable[[str], None] = print) -> dict:
    """Load the backup in `directory` into the (empty) node or cluster at `address`; returns the counts."""
    backup_ = _read(directory)
    api = _Access(address, auth)
    try:
        for project in backup_["projects"]:
            _check_empty(api, project)
        counts = {"topics": 0, "subscriptions": 0, "schemas": 0, "snapshots": 0, "iam": 0, "messages": 0}
        for project, d in backup_["projects"].items():
            _restore_project(api, directory, project, d, backup_.get("data", False), counts)
    finally:
        api.close()
    say("pigeon restore: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + f" from {directory}")
    return counts


def _read(directory: str) -> dict:
    path = os.path.join(directory, _DEFINITIONS)
    try:
        with open(path) as f:
            backup_ = json.load(f)
    except FileNotFoundError:
        raise BackupError(f"{directory} holds no backup ({_DEFINITIONS} is missing; a backup cut short writes "
                          "none)") from None
    except (OSError, ValueError) as e:
        raise BackupError(f"cannot read {path}: {e}") from None
    if not isinstance(backup_, dict) or backup_.get("format") != FORMAT or not isinstance(backup_.get("projects"),
                                                                                           dict):
        raise BackupError(f"{path} is not a backup of format {FORMAT} (format {backup_.get('format')!r})"
                          if isinstance(backup_, dict) else f"{path} is not a backup")
    return backup_


def _check_empty(api: _Access, project: str) -> None:
    path = f"projects/{project}"
    held = [x.name for x in api.pub.list_topics(request={"project": path, "page_size": 1})] + \
        [x.name for x in api.sub.list_subscriptions(request={"project": path, "page_size": 1})] + \
        [x.name for x in api.schemas.list_schemas(request={"parent": path, "page_size": 1})]
    if held:
        raise BackupError(f"the target is not empty: {path} already holds {held[0]}; restore loads into a node or "
                          "cluster without the backup's projects")


def _restore_project(api: _Access, directory: str, project: str, d: dict, data: bool, counts: dict) -> None:
    from google.pubsub_v1 import types

    revisions: dict[str, str] = {}  # old revision id → new (the server numbers them)
    for revs in d["schemas"]:
        first, name = revs[0], revs[0]["name"]
        made = api.schemas.create_schema(request={"parent": f"projects/{project}", "schema_id": name.rsplit("/", 1)[1],
                                                  "schema": {"type_": first["type"], "definition": first["definition"]}})
        revisions[first["revisionId"]] = made.revision_id
        for rev in revs[1:]:
            made = api.schemas.commit_schema(request={"name": name, "schema": {
                "name": name, "type_": rev["type"], "definition": rev["definition"]}})
            revisions[rev["revisionId"]] = made.revision_id
        counts["schemas"] += 1
    for t in d["topics"]:
        t = {k: v for k, v in t.items() if k not in _OUTPUT_ONLY["topics"]}
        settings = t.get("schemaSettings")
        for k in ("firstRevisionId", "lastRevisionId"):
            if settings and settings.get(k):
                settings[k] = revisions.get(settings[k], settings[k])
        api.pub.create_topic(request=types.Topic.from_json(json.dumps(t)))
        counts["topics"] += 1
    for s in _restorable(d["subscriptions"]):
        s = {k: v for k, v in s.items() if k not in _OUTPUT_ONLY["subscriptions"]}
        api.sub.create_subscription(request=types.Subscription.from_json(json.dumps(s)))
        counts["subscriptions"] += 1
    if data:
        counts["messages"] += _restore_messages(api, directory, project, _restorable(d["subscriptions"]))
    for snap in d["snapshots"]:
        api.sub.create_snapshot(request={"name": snap["name"], "subscription": _snapshot_source(snap, d),
                                         "labels": snap.get("labels", {})})
        counts["snapshots"] += 1
    kinds = {**{t["name"]: api.pub for t in d["topics"]}, **{s["name"]: api.sub for s in d["subscriptions"]},
             **{s["name"]: api.sub for s in d["snapshots"]}, **{r[0]["name"]: api.schemas for r in d["schemas"]}}
    for resource, policy in d["iam"].items():
        kinds[resource].set_iam_policy(request={"resource": resource, "policy": policy})
        counts["iam"] += 1


def _restorable(subscriptions: list[dict]) -> list[dict]:
    """A subscription whose topic was deleted cannot be created through the API: it is left out (said in the
    docs); its backlog is in the backup's files still."""
    return [s for s in subscriptions if s.get("topic") != "_deleted-topic_"]


def _publishable(attributes: dict) -> dict:
    """The attributes a publisher may set: those the server adds at delivery (`googclient_schema…` on a topic
    with a schema) are its own, added again to the restored message."""
    return {k: v for k, v in attributes.items() if not k.startswith("googclient_")}


def _snapshot_source(snap: dict, d: dict) -> str:
    """The subscription a snapshot is taken of again: the first of its topic (the API does not say which one it
    was taken of)."""
    for s in d["subscriptions"]:
        if s.get("topic") == snap.get("topic"):
            return s["name"]
    raise BackupError(f"snapshot {snap['name']}: no subscription of its topic {snap.get('topic')} to take it of")


def _restore_messages(api: _Access, directory: str, project: str, subscriptions: list[dict]) -> int:
    """Publish each topic's unacked messages once, in order; then each subscription drops those it had acked."""
    from google.pubsub_v1 import types
    from google.pubsub_v1.services.publisher import PublisherClient as Gapic

    held: dict[str, dict[str, set[str]]] = {}  # topic → subscription → old ids it held
    messages: dict[str, dict[str, dict]] = {}  # topic → old id → line
    for s in subscriptions:
        path = os.path.join(directory, "data", project, s["name"].rsplit("/", 1)[1] + ".jsonl")
        try:
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
        except OSError as e:
            raise BackupError(f"cannot read {path}: {e.strerror or e}") from None
        held.setdefault(s["topic"], {})[s["name"]] = {m["message_id"] for m in lines}
        messages.setdefault(s["topic"], {}).update({m["message_id"]: m for m in lines})
    published = 0
    for topic, by_id in messages.items():
        ordered = sorted(by_id.values(), key=lambda m: (m["publish_time"], int(m["message_id"])))
        new_ids: dict[str, str] = {}
        for i in range(0, len(ordered), 500):
            batch = ordered[i:i + 500]
            r = Gapic.publish(api.pub, request={"topic": topic, "messages": [types.PubsubMessage(
                data=base64.b64decode(m["data"]), attributes=_publishable(m["attributes"]),
                ordering_key=m["ordering_key"])
                for m in batch]}, timeout=60)
            new_ids.update(zip((m["message_id"] for m in batch), r.message_ids))
        published += len(ordered)
        for name, ids in held[topic].items():
            drop = [new_ids[old] for old in by_id if old not in ids]
            for i in range(0, len(drop), 1000):
                api.queue.delete(name, drop[i:i + 1000])
    return published
