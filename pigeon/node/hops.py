"""Hop timestamps: where one message's time goes inside the server, for latency work. Off unless the server's
environment names a file in PIGEON_HOPS; then each hop of a publish and of its delivery appends
(CLOCK_MONOTONIC ns, hop) here — the clock every process of the machine shares, so a client's own stamps line up
with them — and the list is written to that file when the process exits. `python scripts/latency_hops.py` starts
a server so, drives it at a fixed rate and prints how long each step between two hops takes (docs/latency.md).

The hops, in a message's order: `arrived` (the event loop has a hot call from gRPC, when pigeon.api.takers took
it — grpc.aio's own asks take some calls unmarked), `publish` (the Publish handler starts), `committed` (appended
and applied),
`asked` (the journal's writer woken), `taken` (the writer took the entries), `syncing` / `synced` (fdatasync
called / returned), `posted` (the event loop hears it), `woken` (a waiting stream wakes), `sending` (the stream
hands the response to gRPC), `answered` (the publisher's answer is handed to gRPC). On a cluster's append channel
besides: `replicating` (the owner writes an Append request to a member), `frame` (the member has one whole),
`answering` (the member writes its answer), `acked` (the owner has an answer whole) — with the member's journal
hops between them, in the member's own file; `confirmed` (a record held by Qa members), `resumed` (the Publish
handler has heard it); and a delivery's `leased` (its Deliver record appended),
`lease-recorded` (held by Qa members) and `answers-in` (its messages' publishers answered), before its `sending`."""

from __future__ import annotations

import atexit
import os
import time

ON = bool(os.environ.get("PIGEON_HOPS"))
_events: list[tuple[int, str]] = []


def mark(hop: str) -> None:
    """Call only under `if hops.ON:` — off, a hop costs one attribute read."""
    _events.append((time.monotonic_ns(), hop))


def mark_at(t_ns: int, hop: str) -> None:
    """A hop that happened at `t_ns` (CLOCK_MONOTONIC), stamped where no Python ran (pigeon.node._commit)."""
    _events.append((t_ns, hop))


def _write() -> None:
    # "%p" in the name: this process's id (the nodes of a cluster started with one environment write a file each)
    with open(os.environ["PIGEON_HOPS"].replace("%p", str(os.getpid())), "w") as f:
        f.writelines(f"{t} {hop}\n" for t, hop in _events)


def read(path: str) -> dict[str, list[int]]:
    """A hop file as {hop: its stamps, in order} (for the scripts that lay the hops side by side)."""
    hops: dict[str, list[int]] = {}
    with open(path) as f:
        for line in f:
            t, hop = line.split()
            hops.setdefault(hop, []).append(int(t))
    for xs in hops.values():
        xs.sort()
    return hops


if ON:
    atexit.register(_write)
