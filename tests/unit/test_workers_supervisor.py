"""The workers' supervisor keeps its children running: one that exits is started again, after a pause that
doubles while it keeps exiting soon after its start and starts over once it ran a while (clock given)."""

from __future__ import annotations

import subprocess

from pigeon.core import limits
from pigeon.ops.workers import _Child


def test_a_child_that_keeps_exiting_is_started_again_ever_later_and_at_once_after_a_steady_run():
    starts = []

    def start():
        p = subprocess.Popen(["true"])
        starts.append(p)
        p.wait()  # exited before the supervisor looks again
        return p

    c = _Child("worker 0", start)
    c.tend(0.0)
    assert len(starts) == 1
    c.tend(1.0)  # it exited: not at once …
    assert len(starts) == 1 and c.backoff == 0.25
    c.tend(1.2)
    assert len(starts) == 1
    c.tend(1.25)  # … but after the pause
    assert len(starts) == 2
    pauses = []
    t = 1.25
    for _ in range(8):
        t += 0.01
        c.tend(t)  # exited again soon after its start
        pauses.append(c.backoff)
        t = c.due
        c.tend(t)
    assert pauses == sorted(pauses) and pauses[0] == 0.5 and pauses[-1] == limits.worker_restart_s_max
    c.tend(t + _Child.STEADY_S + 1)  # it ran a while before it exited: started again at once
    assert c.backoff == 0.0 and c.proc is starts[-1] and c.started == t + _Child.STEADY_S + 1
