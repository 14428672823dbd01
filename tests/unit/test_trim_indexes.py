"""BrokerState.trim_indexes: the lowest journal position a message index still needs, which decides which of the
node's journal segments may be deleted."""

from __future__ import annotations

from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.state import BrokerState
from pigeon.core.bundles import log_address
from pigeon.storage import records as R

T = "projects/p/topics/t"


def test_a_taken_over_index_needs_the_journal_from_its_owners_first_own_batch():
    """A new owner's index names the batches it took over by log address and the ones it stored since by journal
    position: the journal is needed from the first of those, however many taken-over batches come before it (the
    oldest batch alone was looked at: a log address, which no journal position reaches, so the segments holding
    the owner's own unread batches were deleted and a delivery read a hole)."""
    st = BrokerState()
    st.apply(R.TopicPut(1, 1, Topic(name=T).SerializeToString()))
    st.apply(R.SubPut(2, 1, Subscription(name="projects/p/subscriptions/s", topic=T).SerializeToString(), [0]))
    st.apply(R.Publish(1, 0, 0, 1000, 5, 0, b""), log_address(1, 7))  # taken over with its log
    st.apply(R.Publish(1, 0, 5, 1001, 5, 0, b""), log_address(1, 9))
    st.apply(R.Publish(1, 0, 10, 1002, 5, 0, b""), 2550)  # stored by this node since: in its journal
    st.apply(R.Publish(1, 0, 15, 1003, 5, 0, b""), 4096)
    assert st.trim_indexes(now=2.0) == 2550
    st.apply(R.Ack(2, [o << 6 for o in range(12)]))  # the floor passes the taken-over batches and into the third
    assert st.trim_indexes(now=2.0) == 2550
