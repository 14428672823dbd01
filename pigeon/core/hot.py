"""The loops every delivered and every acknowledged message goes through, in pure Python, and their compiled
twins. Owns the rule: a twin (`pigeon.core._compiled`, Cython, built by the package's install: setup.py) returns
exactly what its Python function returns for every input — tests/unit/test_compiled.py holds them side by side —
and the server runs the twin when it was built, the Python function otherwise (`COMPILED` says which).

Consuming with acks spends most of a message's time here: building its ReceivedMessage bytes (ack id, message id
and publish time around the stored bytes) and parsing its ack id back. In Python that is ~1 µs of a message's
~3 µs on the event loop; compiled, a tenth of it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

from pigeon.core import ackid, wire

# (shard, its first offset, its end offset, the stored messages, their encoded publish_time field)
Located = tuple[int, int, int, Sequence[bytes], bytes]


def received_entries(locate: Callable[[object, int], Located], topic, taken: Sequence[tuple[int, int]],
                     sub_uid: int, show_attempt: bool, max_bytes: int, overrides: dict[int, bytes] | None,
                     id_base: int, shard_bits: int, generation: int = 0) -> tuple[list[bytes], list[int]]:
    """Encoded `received_messages` entries (field 1 of PullResponse and StreamingPullResponse alike) for
    leased (message number, version) pairs, as many as fit in `max_bytes` (at least one), and each message's
    size. A message number is offset << shard_bits | shard; `locate(topic, number)` finds the stored batch that
    holds it, and is asked again only when a number falls outside the last one. Each entry is
    ReceivedMessage(ack_id, message[, delivery_attempt]) around the stored bytes, where the message is stored
    bytes · message_id (3: id_base | number) · publish_time (4); `overrides` are messages updated in place. The
    ack ids carry the subscription's seek `generation` (pigeon.core.ackid)."""
    out: list[bytes] = []
    sizes: list[int] = []
    total = 0
    ack_format = ackid.FORMAT
    gen_bits = generation << ackid.GENERATION_SHIFT
    table = wire.VARINT_TABLE
    varint = wire.varint
    mask = (1 << shard_bits) - 1
    shard = lo = hi = -1
    messages: Sequence[bytes] = ()
    time_field = b""
    fixed = 0  # message_id's tag and length byte, and the publish_time field
    for num, version in taken:
        offset = num >> shard_bits
        if num & mask != shard or not lo <= offset < hi:
            shard, lo, hi, messages, time_field = locate(topic, num)
            fixed = 2 + len(time_field)
        body = messages[offset - lo]
        if overrides:
            body = overrides.get(num, body)
        mid = b"%d" % (id_base | num)
        size = len(body) + fixed + len(mid)
        total += size
        if total > max_bytes and out:
            break
        ack = ack_format % (sub_uid, num, version | gen_bits)
        attempt = b"\x18" + (table[version] if version < 16384 else varint(version)) if show_attempt else b""
        vsize = table[size] if size < 16384 else varint(size)
        n = 3 + len(ack) + len(vsize) + size + len(attempt)
        out.append(b"\x0a%b\x0a%c%b\x12%b%b\x1a%c%b%b%b" % (
            table[n] if n < 16384 else varint(n), len(ack), ack, vsize, body, len(mid), mid, time_field, attempt))
        sizes.append(size)
    return out, sizes


ack_numbers = ackid.parse_many


def ack_shard(ack_id: str, shard_bits: int) -> int:
    """The shard of an ack id ("uid.number.version": its number's low `shard_bits` bits), -1 when it cannot be
    read."""
    try:
        return int(ack_id.split(".")[1]) & ((1 << shard_bits) - 1)
    except (IndexError, ValueError, AttributeError):
        return -1


def ack_groups(ack_ids: Sequence[str], table: Sequence[int], groups: int, shard_bits: int) -> list[list[str]]:
    """Ack ids split among `groups` groups by their shards (a merged StreamingPull's acks, by the owner of each
    id's shard: api.merge): an id of shard k goes to group table[k]; of a shard beyond the table, or one that
    cannot be read, to group 0. Each group keeps the ids' order."""
    out: list[list[str]] = [[] for _ in range(groups)]
    n = len(table)
    for a in ack_ids:
        k = ack_shard(a, shard_bits)
        out[table[k] if 0 <= k < n else 0].append(a)
    return out


PYTHON = SimpleNamespace(received_entries=received_entries, ack_numbers=ack_numbers, ack_shard=ack_shard,
                         ack_groups=ack_groups)  # kept when twins take the names

try:
    from pigeon.core import _compiled
except ImportError:  # not built (no compiler where it was installed): the same results, slower
    COMPILED = False
else:
    COMPILED = True
    received_entries = _compiled.received_entries  # noqa: F811
    ack_numbers = _compiled.ack_numbers
    ack_groups = _compiled.ack_groups  # noqa: F811
