"""CPU cgroups that hold each node of the scale benchmark to the same share of a core. Owns the rule: a cgroup
this benchmark made is removed when the benchmark ends — normally, on Ctrl-C, on SIGTERM, after an error — and
only those; a process still in one is moved back to the parent cgroup first.

* cgroup v1: the cpu controller's hierarchy (`/sys/fs/cgroup/cpu`): `cpu.cfs_period_us`, then `cpu.cfs_quota_us`
  (the share of each period the cgroup's processes may run, summed over the cores).
* cgroup v2: the unified hierarchy (`/sys/fs/cgroup`, when its `cgroup.controllers` lists cpu): `cpu.max` =
  "quota period".

Both report throttling in `cpu.stat` (periods, throttled periods, throttled time); v2 also the CPU used."""

from __future__ import annotations

import atexit
import os
import time
from dataclasses import dataclass

BASE = "/sys/fs/cgroup"
V1, V2 = "v1", "v2"
MIN_QUOTA_US = 1000  # the kernel refuses a smaller CFS quota
PERIOD_US_RANGE = (1000, 1_000_000)  # the kernel's bounds on a CFS period


@dataclass(frozen=True)
class Hierarchy:
    kind: str  # V1 | V2
    root: str  # the directory the benchmark's cgroups are made in


def find(base: str = BASE) -> tuple[Hierarchy | None, str]:
    """The writable CPU hierarchy under `base` (v1's cpu controller first, then v2), or None and why not."""
    why = []
    v1 = os.path.join(base, "cpu")
    if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
        if os.access(v1, os.W_OK):
            return Hierarchy(V1, v1), ""
        why.append(f"{v1} (cgroup v1 cpu controller) is not writable")
    else:
        why.append(f"no cgroup v1 cpu controller at {v1}")
    listed = _read(os.path.join(base, "cgroup.controllers"))
    if listed is None:
        why.append(f"no cgroup v2 hierarchy at {base}")
    elif "cpu" not in listed.split():
        why.append(f"{base}/cgroup.controllers does not list cpu")
    elif not os.access(base, os.W_OK):
        why.append(f"{base} (cgroup v2) is not writable")
    else:
        return Hierarchy(V2, base), ""
    return None, "; ".join(why) + " — the scale plan caps each node's CPU with a cgroup: run it as root on Linux"


def quota_us(cores: float, period_us: int) -> int:
    """The CFS quota (µs of CPU per period) that holds a cgroup to `cores` cores."""
    if not cores > 0:
        raise ValueError(f"a CPU share must be positive, not {cores}")
    if not PERIOD_US_RANGE[0] <= period_us <= PERIOD_US_RANGE[1]:
        raise ValueError(f"a CFS period is {PERIOD_US_RANGE[0]}..{PERIOD_US_RANGE[1]} µs, not {period_us}")
    return max(MIN_QUOTA_US, round(cores * period_us))


def limit_files(kind: str, cores: float, period_us: int) -> list[tuple[str, str]]:
    """(file, content) to write, in order, to hold a cgroup of hierarchy `kind` to `cores` cores."""
    q = quota_us(cores, period_us)
    if kind == V1:  # the period first: a quota above the old period's bounds would be refused
        return [("cpu.cfs_period_us", str(period_us)), ("cpu.cfs_quota_us", str(q))]
    return [("cpu.max", f"{q} {period_us}")]


def parse_stat(text: str) -> dict:
    """cpu.stat (v1 or v2) as {cpu_s (v2 only), periods, throttled_periods, throttled_s}."""
    v = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            v[parts[0]] = int(parts[1])
    out = {"periods": v.get("nr_periods", 0), "throttled_periods": v.get("nr_throttled", 0)}
    if "throttled_usec" in v:  # v2
        out["throttled_s"] = v["throttled_usec"] / 1e6
    else:  # v1: nanoseconds
        out["throttled_s"] = v.get("throttled_time", 0) / 1e9
    if "usage_usec" in v:
        out["cpu_s"] = v["usage_usec"] / 1e6
    return out


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    # one value per write (cgroupfs takes one pid per write); "a": no truncation, and a plain directory standing
    # in for the cgroup root (tests) gets the file made
    with open(path, "a") as f:
        f.write(text)


class CpuCaps:
    """The cgroups of one benchmark run, named `<prefix>-<name>` in the hierarchy's root."""

    def __init__(self, hierarchy: Hierarchy, prefix: str | None = None):
        self.hierarchy = hierarchy
        self.prefix = prefix or f"pigeon-bench-{os.getpid()}"
        self.made: dict[str, str] = {}
        atexit.register(self.remove_all)  # SIGTERM (sys.exit) and an exception unwinding past the caller too

    def path(self, name: str) -> str:
        return os.path.join(self.hierarchy.root, f"{self.prefix}-{name}")

    def make(self, name: str, cores: float, period_us: int) -> str:
        """Make the cgroup `name` holding its processes to `cores` cores; returns its directory."""
        files = limit_files(self.hierarchy.kind, cores, period_us)  # refuses a bad share before anything is made
        if self.hierarchy.kind == V2:
            self._enable_cpu()
        path = self.path(name)
        os.mkdir(path)  # FileExistsError: not ours, left alone
        self.made[name] = path
        for file, text in files:
            _write(os.path.join(path, file), text)
        return path

    def _enable_cpu(self) -> None:
        control = os.path.join(self.hierarchy.root, "cgroup.subtree_control")
        if "cpu" not in (_read(control) or "").split():
            _write(control, "+cpu")

    def add(self, name: str, pids: list[int]) -> None:
        """Move `pids` (each a whole process, every thread) into the cgroup `name`; one already gone is skipped."""
        procs = os.path.join(self.made[name], "cgroup.procs")
        for pid in pids:
            try:
                _write(procs, str(pid))
            except ProcessLookupError:
                pass

    def stat(self, name: str) -> dict:
        """The cgroup's cpu.stat (parse_stat); v1 adds cpu_s from cpuacct.usage where cpuacct shares the mount."""
        path = self.made[name]
        out = parse_stat(_read(os.path.join(path, "cpu.stat")) or "")
        usage = _read(os.path.join(path, "cpuacct.usage"))
        if "cpu_s" not in out and usage and usage.strip().isdigit():
            out["cpu_s"] = int(usage) / 1e9
        return out

    def remove(self, name: str, tries: int = 50) -> bool:
        """Move what is still in the cgroup to the parent, then remove it; False if it would not go."""
        path = self.made.get(name)
        if path is None:
            return True
        parent = os.path.join(os.path.dirname(path), "cgroup.procs")
        for _ in range(tries):
            for pid in (_read(os.path.join(path, "cgroup.procs")) or "").split():
                try:
                    _write(parent, pid)
                except OSError:  # gone meanwhile, or exiting
                    pass
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:  # still busy (a process exiting): again shortly
                time.sleep(0.1)
                continue
            del self.made[name]
            return True
        return False

    def remove_all(self) -> list[str]:
        """Remove every cgroup made; returns the directories that would not go."""
        return [self.path(name) for name in list(self.made) if not self.remove(name)]
