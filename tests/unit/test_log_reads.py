"""A cluster owner's names for its batches (node.log_reads): the log address of a batch it took over is its own
name; a batch of its own term, named by its node journal position, is translated through the positions it noted
as it appended them — and one it did not note cannot be named (no snapshot is written then, rather than a wrong
one)."""

from __future__ import annotations

from array import array

import pytest

from pigeon.cluster.ledgers import LedgerInfo
from pigeon.core.bundles import is_log_address, log_address, split_log_address
from pigeon.node.bundle_logs import OwnedLog
from pigeon.node.log_reads import LogReads, Unnamed
from pigeon.storage import records as R

LOG = 5


def _owned() -> OwnedLog:
    ol = OwnedLog(LOG, 2, LedgerInfo(1, 2, {"n1": "a"}, 100), next_offset=100)
    reads = LogReads(bundles=None)
    for at, rtype in ((4096, R.RecordType.PUBLISH), (4200, R.RecordType.ACK), (5000, R.RecordType.PUBLISH)):
        reads.noted(ol, rtype, (LOG, 0, at, at + 50))
        ol.next_offset += 1
    return ol


def test_a_log_address_is_bit_62_the_log_and_the_offset():
    a = log_address(LOG, 123)
    assert is_log_address(a) and not is_log_address(1 << 40) and split_log_address(a) == (LOG, 123)
    assert a < 1 << 63  # fits the index's signed 64-bit positions


def test_an_owner_names_its_own_batches_by_the_offsets_it_noted_and_others_by_their_address():
    ol, reads = _owned(), LogReads(bundles=None)
    assert list(ol.own_at) == [4096, 5000] and list(ol.own_offset) == [100, 102]  # publishes only
    assert reads.log_offset(ol, 5000) == 102 and reads.log_offset(ol, log_address(LOG, 7)) == 7
    assert reads.log_offset(ol, 4200) == 0, "a position it did not note: nothing may be cut for it"
    mixed = array("q", [log_address(LOG, 7), 4096, 5000])
    assert list(reads.log_addresses(ol, mixed)) == [log_address(LOG, 7), log_address(LOG, 100), log_address(LOG, 102)]
    with pytest.raises(Unnamed):
        reads.log_addresses(ol, array("q", [4200]))
    reads.forget_before(ol, 101)
    assert list(ol.own_offset) == [102] and reads.log_offset(ol, 4096) == 0
