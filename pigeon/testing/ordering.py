"""What an ordered subscription's subscriber sees of one key, for the tests that check Pub/Sub's ordering rule
with a client's callbacks: the numbers of the key's messages in callback order, cut into runs of consecutive
numbers. The rule, in those terms: the first run starts at the key's first message, every later run starts at a
message the subscriber refused, at or below where the run before it ended (a resend repeats every later message of
the key, acked or not), and the last run ends at the key's last message."""

from __future__ import annotations


def key_runs(got: list[int]) -> list[list[int]]:
    """`got` (numbers in the order the callbacks saw them) as runs of consecutive numbers."""
    runs: list[list[int]] = []
    for n in got:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs
