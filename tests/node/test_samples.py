"""The sampled figures of node.samples: ack latency observed for sampled batches only, and the space-saving count
of ordering keys (a hot key is never dropped; a new key inherits the smallest count)."""

from pigeon.node.samples import AckLatency, HotKeys


def test_ack_latency_samples_every_nth_batch_and_observes_its_ack():
    a = AckLatency(every=4, held_max=2)
    for batch in range(1, 9):  # batches 4 and 8 are sampled: their first messages are 40 and 80
        a.delivered(7, batch * 10, now=float(batch))
    a.acked(7, [10, 20, 30], now=100.0)  # none sampled
    assert a.histogram.count == 0
    a.acked(7, [40, 41], now=4.5)
    assert (a.histogram.count, a.histogram.sum) == (1, 0.5)
    a.acked(7, [40], now=9.0)  # once only
    assert a.histogram.count == 1
    for batch in range(9, 17):  # batches 12 and 16 sampled; held_max 2: the oldest held (80) is forgotten
        a.delivered(7, batch * 10, now=float(batch))
    a.acked(7, [80, 120, 160], now=21.0)
    assert a.histogram.count == 3 and a.histogram.sum == 0.5 + 9 + 5
    for batch in range(17, 21):  # batch 20 sampled, for subscription 9, which is then deleted
        a.delivered(9, 1, 0.0)
    a.prune({7})
    a.acked(9, [1], 1.0)
    assert a.histogram.count == 3


def test_hot_keys_keep_the_busiest_and_overestimate_new_ones():
    h = HotKeys(keys_max=2)
    for key, n in (("a", 100), ("b", 5), ("a", 50), ("c", 1)):
        h.published("t", key, n)
    # c took b's counter (5) and added its 1: an estimate that can be over, never under
    assert h.hottest(10) == [("t", "a", 150), ("t", "c", 6)]
    h.published("u", "z", 1000)
    assert h.hottest(1) == [("u", "z", 1000)]
    h.prune({"u"})
    assert h.hottest(10) == [("u", "z", 1000)]
