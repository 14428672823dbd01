"""Format versions. Owns the rule: a node reads every format it has ever written and refuses a newer one, naming
both, before it reads or writes anything else — an older Pigeon that met records of a newer one would take them
for damage and cut the log there.

  * DATA: a data directory's layout and encodings (journal segments, records, checkpoints), written as the file
    `FORMAT` ("pigeon-data N") when a node first writes the directory; one without it was made before formats
    were numbered, and is format 1;
  * CLUSTER: what the nodes of a cluster exchange (peer calls, the append channel, the values in etcd). Each node
    announces the newest it speaks in its `nodes/<id>` record; a cluster speaks the lowest of its members'
    (`cluster_format`), so a node upgraded first uses nothing its older peers cannot read, and the cluster moves
    on once the last member runs the new code (docs/operations.md, "Upgrades").

A change that an older node could not read raises the number here, and keeps reading the older formats.

CLUSTER 2: a bundle's Snapshot record in its log carries the message indexes, each batch named by its log address
(core.bundles), and a log is cut at its latest snapshot while the ledgers of messages still needed are kept; under
format 1 a snapshot's indexes are empty and a log is cut only at a snapshot no message still needed precedes (an
older node taking a bundle over reads the messages from the entries after it).

DATA 2 and CLUSTER 3: topics laid out spread (core.bundles.shard_log) — a TopicPut with its spread bit, a Seek of one
shard, a subscription image with a seek generation per shard. A directory stays format 1 until a spread topic's
record is first written to it (`raise_data_dir`): every older release still reads one that never held one; a
cluster creates spread topics only once every node speaks format 3 (until then, together).

DATA 3 and CLUSTER 4: a (topic, shard) pair handed from one bundle log to another (docs/cluster.md, "Scale-out"
4.3) — the records ShardOut and ShardIn in bundle logs, ShardHome in the metadata log and in checkpoints and
bundle snapshots, the peer call pigeon.v1.Storage/ShardIn, the `homes` key. A directory is raised to 3 before one
of the records is first written to it; a cluster hands nothing over (neither an operator's `move-shard` nor a
hot bundle's split) until every node speaks format 4."""

from __future__ import annotations

from pigeon.storage.disk import Disk, join

DATA = 3  # the newest data format this Pigeon reads and writes
DATA_PLAIN = 1  # what a directory is marked when first written: format 2 only once it holds a spread topic …
DATA_SPREAD = 2
DATA_HANDOVER = 3  # … and 3 once it holds a hand-over's record
CLUSTER = 4
CLUSTER_SPREAD = 3  # the cluster format from which spread topics are made
CLUSTER_HANDOVER = 4  # … and shards are handed between bundle logs
FILE = "FORMAT"
_PREFIX = "pigeon-data "


class NewerFormat(Exception):
    """Data or a peer of a newer format than this Pigeon reads."""


def data_format(disk: Disk, data_dir: str) -> int:
    """The format of the data directory (1 when it has no FORMAT file); ValueError when the file is not ours."""
    path = join(data_dir, FILE)
    if not disk.exists(path):
        return 1
    text = disk.read_file(path).decode(errors="replace").strip()
    if not text.startswith(_PREFIX) or not text[len(_PREFIX):].isdigit():
        raise ValueError(f"{path} does not name a Pigeon data format (it reads {text[:40]!r})")
    return int(text[len(_PREFIX):])


def check_data_dir(disk: Disk, data_dir: str) -> int:
    """The directory's format, refused when newer than DATA."""
    found = data_format(disk, data_dir)
    if found > DATA:
        raise NewerFormat(f"the data directory {data_dir} is in data format {found}, written by a newer Pigeon; "
                          f"this Pigeon reads formats up to {DATA}: run the newer version on it")
    return found


def mark_data_dir(disk: Disk, data_dir: str) -> None:
    """Record the format of what this Pigeon writes there (DATA_PLAIN), when the directory does not say one yet."""
    path = join(data_dir, FILE)
    if not disk.exists(path):
        disk.write_durably(path, f"{_PREFIX}{DATA_PLAIN}\n".encode())


def raise_data_dir(disk: Disk, data_dir: str, to: int) -> None:
    """Mark the directory format `to` (before a record only that format has is written to it), if it is lower."""
    if data_format(disk, data_dir) < to:
        disk.write_durably(join(data_dir, FILE), f"{_PREFIX}{to}\n".encode())


def cluster_format(announced: list[int]) -> int:
    """The format a cluster speaks: the lowest its members announce (CLUSTER when it has none yet)."""
    return min(announced, default=CLUSTER)
