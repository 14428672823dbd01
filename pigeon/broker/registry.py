"""The metadata of one node: topics, subscriptions, snapshots. Owns the rule: metadata changes are
values (`Change` dicts) applied by one function, `apply`, both live and when the log is replayed, so a
restart rebuilds exactly the state that was acknowledged."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from pigeon.core import names
from pigeon.core.errors import NotFound
from pigeon.broker.resources import Policy, Schema, Snapshot, Subscription, Topic
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.topic import TopicState

Change = dict


def _pb(cls, b64: str):
    m = cls()
    m.ParseFromString(base64.b64decode(b64))
    return m


def pb64(message) -> str:
    return base64.b64encode(message.SerializeToString(deterministic=True)).decode()


@dataclass
class SnapshotState:
    name: str
    topic_uid: int
    config: object  # Snapshot proto
    floors: list[int]
    acked: list[list[int]] = field(default_factory=list)


class Registry:
    def __init__(self):
        self.topics: dict[str, TopicState] = {}
        self.topics_by_uid: dict[int, TopicState] = {}
        self.subs: dict[str, SubscriptionState] = {}
        self.subs_by_uid: dict[int, SubscriptionState] = {}
        self.snapshots: dict[str, SnapshotState] = {}
        self.schemas: dict[str, list] = {}  # name → revisions (Schema protos), oldest first
        self.policies: dict[str, object] = {}  # resource name → google.iam.v1.Policy
        self.next_uid = 1

    # --- look-ups ------------------------------------------------------------------------------
    def topic(self, name: str) -> TopicState:
        t = self.topics.get(name)
        if t is None:
            names.split(name, "topics")
            raise NotFound(f"Resource not found (resource={name.split('/')[-1]}).")
        return t

    def sub(self, name: str) -> SubscriptionState:
        s = self.subs.get(name)
        if s is None:
            names.split(name, "subscriptions")
            raise NotFound(f"Resource not found (resource={name.split('/')[-1]}).")
        return s

    def schema(self, name: str) -> list:
        """The revisions of a schema, oldest first."""
        revs = self.schemas.get(name)
        if revs is None:
            names.split(name, "schemas")
            raise NotFound(f"Resource not found (resource={name.split('/')[-1]}).")
        return revs

    def snapshot(self, name: str) -> SnapshotState:
        s = self.snapshots.get(name)
        if s is None:
            names.split(name, "snapshots")
            raise NotFound(f"Resource not found (resource={name.split('/')[-1]}).")
        return s

    # --- the one way state changes ---------------------------------------------------------------
    def apply(self, c: Change) -> None:
        op = c["op"]
        if op == "topic.put":
            cfg = _pb(Topic, c["pb"])
            t = self.topics_by_uid.get(c["uid"])
            if t is None:
                t = TopicState(c["uid"], cfg.name, cfg, c["shards"])
                self.topics_by_uid[t.uid] = t
                if not c.get("deleted"):
                    self.topics[t.name] = t
            t.config = cfg
            self.next_uid = max(self.next_uid, c["uid"] + 1)
        elif op == "topic.del":
            t = self.topics_by_uid[c["uid"]]
            t.deleted = True
            if self.topics.get(t.name) is t:  # the name may already belong to a newer topic
                del self.topics[t.name]
                self.policies.pop(t.name, None)
            for uid in t.subscriptions:
                s = self.subs_by_uid[uid]
                s.config.topic = names.DELETED_TOPIC
            if not t.subscriptions:
                del self.topics_by_uid[t.uid]
        elif op == "sub.put":
            cfg = _pb(Subscription, c["pb"])
            s = self.subs_by_uid.get(c["uid"])
            if s is None:
                topic = self.topics_by_uid.get(c["topic"])
                s = SubscriptionState(c["uid"], cfg.name, topic, cfg)
                if "start" in c:
                    s.reset(c["start"], [[] for _ in c["start"]])
                    s.start = list(c["start"])
                if topic is not None:
                    topic.subscriptions.add(s.uid)
                self.subs_by_uid[s.uid] = s
                self.subs[s.name] = s
            s.configure(cfg)
            s.detached = cfg.detached
            self.next_uid = max(self.next_uid, c["uid"] + 1)
        elif op == "sub.del":
            s = self.subs_by_uid.pop(c["uid"])
            self.subs.pop(s.name, None)
            self.policies.pop(s.name, None)
            t = s.topic
            if t is not None:
                t.subscriptions.discard(s.uid)
                if t.deleted and not t.subscriptions:
                    self.topics_by_uid.pop(t.uid, None)
        elif op == "sub.reset":
            self.subs_by_uid[c["uid"]].reset(c["floors"], c["acked"])
        elif op == "snap.put":
            cfg = _pb(Snapshot, c["pb"])
            old = self.snapshots.get(cfg.name)
            floors = c.get("floors", old.floors if old else [])
            acked = c.get("acked", old.acked if old else [])
            self.snapshots[cfg.name] = SnapshotState(cfg.name, c["topic"], cfg, floors, acked)
        elif op == "snap.del":
            self.snapshots.pop(c["name"], None)
            self.policies.pop(c["name"], None)
        elif op == "schema.put":  # a new revision (the first one creates the schema)
            cfg = _pb(Schema, c["pb"])
            self.schemas.setdefault(cfg.name, []).append(cfg)
        elif op == "schema.del":
            self.schemas.pop(c["name"], None)
            self.policies.pop(c["name"], None)
            for t in self.topics.values():
                if t.config.schema_settings.schema == c["name"]:
                    t.config.schema_settings.schema = names.DELETED_SCHEMA
        elif op == "schema.delrev":
            revs = self.schemas[c["name"]]
            revs[:] = [r for r in revs if r.revision_id != c["revision_id"]]
        elif op == "idem.put":  # idempotency keys of one publish (logged beside its record)
            t = self.topics_by_uid.get(c["topic"])
            if t is not None:
                for key, mid, ms in c["keys"]:
                    t.idempotency.add(key, mid, ms)
        elif op == "sched.put":  # activation times of one scheduled publish
            t = self.topics_by_uid.get(c["topic"])
            if t is not None:
                for at, num in c["entries"]:
                    t.schedule.add(at, num)
        elif op == "q.park":  # reschedule (at >= 0) or bury (at == -1)
            self.subs_by_uid[c["uid"]].park(c["nums"], c["at"])
        elif op == "q.kick":
            self.subs_by_uid[c["uid"]].kick(c["nums"])
        elif op == "q.update":
            s = self.subs_by_uid[c["uid"]]
            if not s.is_acked(c["num"]):
                s.overrides[c["num"]] = base64.b64decode(c["pb"])
        elif op == "iam.put":
            self.policies[c["resource"]] = _pb(Policy, c["pb"])
        else:
            raise AssertionError(f"unknown change {op}")

    # --- checkpoints ---------------------------------------------------------------------------
    def export_meta(self) -> dict:
        """Everything but shard indexes and subscription ack state, as JSON-able values."""
        return {
            "next_uid": self.next_uid,
            "topics": [
                {"uid": t.uid, "pb": pb64(t.config), "shards": len(t.shards), "deleted": t.deleted,
                 "idem": t.idempotency.export()}
                for t in self.topics_by_uid.values()
            ],
            "subs": [
                {"uid": s.uid, "topic": s.topic.uid if s.topic else None, "pb": pb64(s.config), "start": s.start}
                for s in self.subs_by_uid.values()
            ],
            "snaps": [
                {"pb": pb64(s.config), "topic": s.topic_uid, "floors": s.floors, "acked": s.acked}
                for s in self.snapshots.values()
            ],
            "schemas": [[pb64(r) for r in revs] for revs in self.schemas.values()],
            "policies": {name: pb64(p) for name, p in self.policies.items()},
        }

    def restore_meta(self, meta: dict) -> None:
        for t in meta["topics"]:
            self.apply({"op": "topic.put", "uid": t["uid"], "pb": t["pb"], "shards": t["shards"], "deleted": t["deleted"]})
        for s in meta["subs"]:
            self.apply({"op": "sub.put", "uid": s["uid"], "topic": s["topic"], "pb": s["pb"], "start": s["start"]})
        for t in meta["topics"]:
            if t.get("idem"):
                self.apply({"op": "idem.put", "topic": t["uid"], "keys": t["idem"]})
            if t["deleted"]:
                self.apply({"op": "topic.del", "uid": t["uid"]})
        for sn in meta["snaps"]:
            self.apply({"op": "snap.put", **sn})
        for revs in meta.get("schemas", []):
            for r in revs:
                self.apply({"op": "schema.put", "pb": r})
        for name, p in meta.get("policies", {}).items():
            self.apply({"op": "iam.put", "resource": name, "pb": p})
        self.next_uid = meta["next_uid"]
