"""Offline check of a data directory: recovery in read-only mode, then a summary."""

from __future__ import annotations

import os

from pigeon.broker.registry import Registry
from pigeon.node import recovery


def check(data_dir: str, out) -> bool:
    if not os.path.isdir(data_dir):
        print(f"{data_dir}: not a directory", file=out)
        return False
    reg = Registry()
    rep = recovery.recover(data_dir, reg, repair=False)
    print(f"checkpoint: {rep.checkpoint or 'none'}", file=out)
    print(f"records replayed after it: {rep.replayed_records}", file=out)
    print(f"topics: {len(reg.topics)}  subscriptions: {len(reg.subs)}  snapshots: {len(reg.snapshots)}", file=out)
    backlog = sum(s.backlog() for s in reg.subs_by_uid.values())
    print(f"unacked messages: {backlog}", file=out)
    for line in rep.lines():
        print(f"BROKEN: {line}", file=out)
    print("ok" if rep.clean else "problems found (the server would drop the broken parts at start)", file=out)
    return rep.clean
