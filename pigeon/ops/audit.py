"""The audit log. Owns the rule: every admin change (whatever its outcome) and every refused call
(UNAUTHENTICATED, PERMISSION_DENIED) is one JSON line — time, principal, method, resource, outcome — written as
it happens, to a file of its own or to the `pigeon.audit` logger. Read calls that pass are not audited: they
are most of the traffic and change nothing."""

from __future__ import annotations

import datetime
import json
import logging

log = logging.getLogger("pigeon.audit")


class Audit:
    def __init__(self, path: str = ""):
        self._file = open(path, "a", buffering=1, encoding="utf-8") if path else None  # line-buffered

    def record(self, principal: str, method: str, resource: str, outcome: str, **more) -> None:
        line = json.dumps({
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"),
            "principal": principal, "method": method, "resource": resource, "outcome": outcome, **more},
            ensure_ascii=False)
        if self._file is not None:
            self._file.write(line + "\n")
        else:
            log.info("%s", line)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
