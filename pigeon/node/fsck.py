"""Offline check of a data directory: recovery in read-only mode, then a summary. With `repair`, what recovery
would stop at (a record that decodes but cannot be applied) is truncated after saying what is dropped."""

from __future__ import annotations

import os

from pigeon.node import recovery
from pigeon.storage.formats import NewerFormat


def check(data_dir: str, out, repair: bool = False) -> bool:
    if not os.path.isdir(data_dir):
        print(f"{data_dir}: not a directory", file=out)
        return False
    try:
        reg, found = recovery.recover(data_dir, repair=False)
    except NewerFormat as e:
        print(f"NEWER FORMAT: {e}", file=out)
        return False
    except recovery.Unappliable as e:
        print(f"BROKEN: {e.describe()}", file=out)
        print("the server will not start on this directory: nothing after this record may be dropped silently",
              file=out)
        if not repair:
            print(f"{e.repair_plan()} after saying so; nothing is changed without --repair", file=out)
            return False
        for path, n in e.dropped:
            print(f"REPAIR: dropping {n} bytes of {path}", file=out)
        reg, found = recovery.recover(data_dir, repair=True, drop_unappliable=True)
        print("repaired: the log now ends before that record", file=out)
    rep = found.report
    print(f"checkpoint: {rep.checkpoint or 'none'}", file=out)
    print(f"records replayed after it: {rep.replayed_records}", file=out)
    print(f"topics: {len(reg.topics)}  subscriptions: {len(reg.subs)}  snapshots: {len(reg.snapshots)}", file=out)
    backlog = sum(s.backlog() for s in reg.subs_by_uid.values())
    print(f"unacked messages: {backlog}", file=out)
    for line in rep.lines():
        print(f"{'REPAIRED' if repair else 'BROKEN'}: {line}", file=out)
    if repair:
        print("ok (repaired)" if not rep.clean else "ok", file=out)
        return True
    print("ok" if rep.clean else "problems found (the server would drop the broken parts at start)", file=out)
    return rep.clean
