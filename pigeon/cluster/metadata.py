"""The metadata interface: what a node needs from its coordination store, shaped after etcd 3's KV, lease and
watch API so that etcd serves it directly and the embedded store (one node, no etcd) behaves the same. Owns the
rules every store keeps — one contract suite (pigeon.testing.meta_contract) checks them against both:

  * one revision counter for the whole store: every successful change (a put, a delete that removed something,
    a transaction that changed something) raises it by one, and each key remembers the revision that created it
    and the one that last changed it;
  * a transaction's comparisons all hold or none of its success operations apply (then its failure ones do),
    atomically with respect to every other change: this is the compare-and-swap all coordination is built on;
  * a key put under a lease goes when the lease ends (revoked, or not kept alive for its time to live);
  * a watch from revision r reports every change to its prefix after r, in revision order, none twice.

Pure: the types and the key layout only; the stores are in pigeon.node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol, Union

from pigeon.core.errors import Unavailable


class StoreUnavailable(Unavailable):
    """The coordination store cannot be reached (admin changes answer UNAVAILABLE with this)."""


class LeaseGone(Exception):
    """The lease expired or was revoked."""


@dataclass(frozen=True, slots=True)
class KV:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Cmp:
    """A comparison of a transaction. `target`: "value", "mod" (the revision that last changed the key, 0 when
    absent) or "create" (the revision that created it, 0 when absent); `op`: "==", "!=", "<", ">"."""
    key: str
    target: str
    op: str
    value: Union[bytes, int]


def absent(key: str) -> Cmp:
    return Cmp(key, "create", "==", 0)


def unchanged_since(kv: KV) -> Cmp:
    return Cmp(kv.key, "mod", "==", kv.mod_revision)


def holds(key: str, value: bytes) -> Cmp:
    return Cmp(key, "value", "==", value)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


Op = Union[Put, Delete]


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # "put" | "delete"
    kv: KV  # for a delete: the key with an empty value, at the revision of the delete


def compare(c: Cmp, kv: KV | None) -> bool:
    """Whether comparison `c` holds for `kv` (None: the key is absent) — etcd's semantics."""
    if c.target == "value":
        if kv is None:
            return False
        have, want = kv.value, c.value
    elif c.target == "mod":
        have, want = (kv.mod_revision if kv else 0), c.value
    elif c.target == "create":
        have, want = (kv.create_revision if kv else 0), c.value
    else:
        raise ValueError(f"unknown comparison target {c.target!r}")
    if c.op == "==":
        return have == want
    if c.op == "!=":
        return have != want
    if c.op == "<":
        return have < want
    if c.op == ">":
        return have > want
    raise ValueError(f"unknown comparison {c.op!r}")


class Metadata(Protocol):
    async def get(self, key: str) -> KV | None: ...

    async def list(self, prefix: str) -> list[KV]:
        """Every key under `prefix`, in key order."""

    async def txn(self, compares: list[Cmp], success: list[Op], failure: list[Op] = ()) -> tuple[bool, int]:
        """(whether every comparison held, the store's revision after it)."""

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """The revision of the change."""

    async def delete(self, key: str) -> bool:
        """Whether there was such a key."""

    async def grant(self, ttl_s: int) -> int:
        """A new lease that lives `ttl_s` seconds unless kept alive; its id."""

    async def keepalive(self, lease: int) -> None:
        """Restart the lease's time to live; raises LeaseGone when it already ended."""

    async def revoke(self, lease: int) -> None: ...

    def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Event]:
        """Every change under `prefix` after `start_revision`, as it happens, until the iterator is closed."""

    async def revision(self) -> int: ...

    async def compact(self, revision: int) -> None:
        """Forget the history before `revision` (keys keep their values): a watch from an earlier revision is
        refused from then on. A revision compacted already is no error."""

    async def close(self) -> None: ...


# --- key layout -------------------------------------------------------------------------------------------
ROOT = "/pigeon"


def node_key(node_id: str) -> str:
    """A live node: put under its session lease, so it goes when the node stops keeping the lease alive."""
    return f"{ROOT}/nodes/{node_id}"


def owner_key(bundle: int) -> str:
    """The node that owns a bundle: put under the owner's session lease, taken by compare-and-swap."""
    return f"{ROOT}/owners/{bundle:05d}"


def epoch_key(bundle: int) -> str:
    """The last ownership epoch of a bundle (no lease: it outlives owners, so a new owner's epoch is higher)."""
    return f"{ROOT}/epochs/{bundle:05d}"


def ledgers_key(log: int) -> str:
    """A log's ledger list (with each ledger's ensemble, epoch and, once closed, its last entry)."""
    return f"{ROOT}/ledgers/{log:05d}"


LENT_PREFIX = f"{ROOT}/lent/"


def lent_prefix(log: int) -> str:
    """The `lent_key`s of the pairs that name batches of log `log` (its owner keeps its ledgers for them)."""
    return f"{LENT_PREFIX}{log:05d}/"


def lent_key(log: int, topic_uid: int, shard: int) -> str:
    """The lowest offset of log `log` the index of pair (topic, shard) still names, once the pair left the log
    (docs/cluster.md, "Scale-out" 4.3 step 4), in decimal: put before the pair's ShardOut by the log's owner, then
    raised or deleted by the owner of the log the pair is in; no lease (it outlives owners)."""
    return f"{lent_prefix(log)}{topic_uid}.{shard}"


def split_lent_key(key: str) -> tuple[int, int, int] | None:
    """(log, topic uid, shard) of a `lent_key` (None for any other key)."""
    if not key.startswith(LENT_PREFIX):
        return None
    log, _, pair = key[len(LENT_PREFIX):].partition("/")
    uid, _, shard = pair.partition(".")
    return (int(log), int(uid), int(shard)) if log.isdigit() and uid.isdigit() and shard.isdigit() else None


def drain_key(node_id: str) -> str:
    """A node an operator drains (`pigeon cluster drain`): placement leaves it out; no lease, so it stays
    through the node's restarts until `pigeon cluster undrain`."""
    return f"{ROOT}/draining/{node_id}"


USAGE_PREFIX = f"{ROOT}/usage/"


def usage_key(node_id: str) -> str:
    """What a node's callers asked of each project's quotas in the last second (pigeon.ops.quotas): put under
    its session lease every second, read by the other nodes to share the quotas out."""
    return f"{USAGE_PREFIX}{node_id}"


LOAD_PREFIX = f"{ROOT}/load/"


def load_key(node_id: str) -> str:
    """What each bundle a node owns took lately (entries/s, bytes/s, cores: node.bundle_load), and the node's own
    CPU: put under its session lease every few seconds, read by the placement planner."""
    return f"{LOAD_PREFIX}{node_id}"


PLACEMENT_KEY = f"{ROOT}/placement"  # the planner's moves laid over the hash (cluster.placement.place); no lease
HOMES_KEY = f"{ROOT}/homes"  # the bundle each (topic, shard) pair named there should be in (node.handover); no lease
CLUSTER_ID_KEY = f"{ROOT}/cluster-id"

# the global store of a deployment of regions (docs/regions.md): the metadata log's keys, and these
REGION_SLOTS_KEY = f"{ROOT}/region-slots"  # how many regions the deployment may hold, fixed by its first node
GATEWAYS_PREFIX = f"{ROOT}/gateways/"


def region_key(name: str) -> str:
    """The slot region `name` holds (taken once, with its `region_slot_key`, by compare-and-swap; no lease)."""
    return f"{ROOT}/regions/{name}"


REGION_SLOT_PREFIX = f"{ROOT}/region-slot/"


def region_slot_key(slot: int) -> str:
    """The region that holds slot `slot`."""
    return f"{REGION_SLOT_PREFIX}{slot:02d}"


REGION_LOST_PREFIX = f"{ROOT}/region-lost/"


def region_lost_key(slot: int) -> str:
    """Present when the region in slot `slot` was declared lost for good (`pigeon cluster regions lose`): its
    copies are served by the regions that hold them (docs/regions.md); no lease."""
    return f"{REGION_LOST_PREFIX}{slot:02d}"


def gateway_key(slot: int, node_id: str) -> str:
    """A node of the region in slot `slot`, where other regions dial it: put under its lease of the global store."""
    return f"{GATEWAYS_PREFIX}{slot:02d}/{node_id}"
BUNDLES_KEY = f"{ROOT}/bundles"  # the number of bundles, fixed when the cluster is created
