"""Processes of the benchmark's servers under test, and what the machine does while they run (CPU, memory, disk).
Owns the rule: a server under test (Pigeon or a peer) runs under `timeout -s KILL <wall>` in its own process
group, so it dies at the wall-clock bound even if the benchmark itself is killed, and `stop()`/`kill()` reach every
process it forked. The load that measures them is pigeon.bench.workers'.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

from pigeon.ops.local_ports import free_port  # noqa: F401  (re-exported: the benchmark's servers use it)

_live: set["Daemon"] = set()


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def await_listening(proc: subprocess.Popen, port: int, timeout: float, what: str, log_path: str,
                    tail: Callable[[], str] = lambda: "") -> None:
    """Wait until the child `proc` accepts connections on `port`; raise RuntimeError (naming its log, and with
    what `tail` gives of it) if it exits first or does not within `timeout` (it is then killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log_path}:\n{tail()}")
        if port_open(port):
            return
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)
    raise RuntimeError(f"{what} did not start within {timeout}s; see {log_path}")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _session_members(sid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[3]) == sid:  # field 6: session id
            out.append(int(name))
    return out


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (those alive now), the process first."""
    kids = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, ()))
        out.append(p)
    return out


def python_pid(pid: int) -> int:
    """The Python process in a process's tree (a server may run under a wrapper: its CPU quota's, `timeout`'s) — the
    one a Python profiler attaches to; `pid` when there is none."""
    for p in tree_pids(pid):
        try:
            if "python" in os.path.basename(os.readlink(f"/proc/{p}/exe")):
                return p
        except OSError:
            continue
    return pid


def rss_tree_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    total = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


_TICK = os.sysconf("SC_CLK_TCK")


def _disk_io_ms() -> int:
    """Milliseconds the busiest whole disk spent doing I/O (its io_ticks), since boot."""
    best = 0
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                v = line.split()
                if len(v) > 12 and not v[2].startswith(("loop", "ram")) and not v[2][-1].isdigit():
                    best = max(best, int(v[12]))
    except OSError:
        pass
    return best


def _machine_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v[:8]) - idle, sum(v[:8])


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each process of a tree (its own and its reaped children's)."""
    out: dict[int, float] = {}
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        v = stat[stat.rindex(")") + 2:].split()
        out[p] = sum(int(x) for x in v[11:15]) / _TICK  # utime stime cutime cstime
    return out


class CpuWatch:
    """How busy the machine was while something ran, and how much of that was not this benchmark (other
    programs on a shared machine make every figure noisier: the report shows it). Processes of the benchmark
    that ended in between (a killed server) are not counted, so `other_pct` errs high, never wildly."""

    def __init__(self, servers: tuple[int, ...] = ()):
        self.pid = os.getpid()
        self.servers = servers  # the pids of the measured server's processes: their trees' CPU is reported apart
        self.busy0, self.total0 = _machine_jiffies()
        self.ours0 = tree_cpu(self.pid)
        self.server0 = self._server_cpu()
        self.disk0 = _disk_io_ms()
        self.t0 = time.monotonic()

    def read(self) -> dict:
        busy, total = _machine_jiffies()
        ours1 = tree_cpu(self.pid)
        wall = max(time.monotonic() - self.t0, 1e-9)
        cores = os.cpu_count() or 1
        busy_s = (busy - self.busy0) / _TICK
        ours_s = sum(max(0.0, t - self.ours0.get(p, 0.0)) for p, t in ours1.items())
        pct = lambda x: round(min(100.0, max(0.0, 100 * x / wall / cores)), 1)  # noqa: E731
        disk = round(min(100.0, (_disk_io_ms() - self.disk0) / 10 / wall), 1)
        out = {"busy_pct": pct(busy_s), "bench_pct": pct(ours_s), "other_pct": pct(busy_s - ours_s),
               "disk_busy_pct": disk}
        if self.servers:  # in cores (1.0 = one core busy all along), to say whether a server used more than one
            server_s = sum(max(0.0, t - self.server0.get(p, 0.0)) for p, t in self._server_cpu().items())
            out["server_cores"] = round(server_s / wall, 2)
        return out

    def _server_cpu(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid in self.servers:
            out.update(tree_cpu(pid))
        return out


class DiskProbe:
    """A thread that writes 4 KiB and fdatasyncs it every `interval_s` on the filesystem the servers use, for
    as long as a workload runs: the disk's own stalls, seen the same way for every target. A latency tail that
    matches the probe's slowest fdatasync is the disk's, not the server's."""

    def __init__(self, directory: str | None = None, interval_s: float = 0.02):
        fd, self.path = tempfile.mkstemp(prefix="pigeon-disk-probe-", dir=directory)
        os.close(fd)
        self.interval_s = interval_s
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        block = os.urandom(4096)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            while not self._stop.wait(self.interval_s):
                t = time.perf_counter()
                os.write(fd, block)
                os.fdatasync(fd)
                self.times.append(time.perf_counter() - t)
        finally:
            os.close(fd)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        os.unlink(self.path)
        t = sorted(self.times)
        if not t:
            return {}
        return {"disk_probe_fsyncs": len(t), "disk_probe_p50_ms": round(t[len(t) // 2] * 1e3, 3),
                "disk_probe_max_ms": round(t[-1] * 1e3, 3),
                "disk_probe_stalled_ms": round(sum(x for x in t if x > 0.01) * 1e3, 1)}


def disk_bandwidth(directory: str, writers: int, seconds: float = 3.0, block: int = 1 << 20) -> float:
    """MB/s that `writers` threads write together to files of their own in `directory`, each appending `block`
    bytes and fdatasyncing them, again and again for `seconds` (the files are removed). The durable bandwidth the
    disk gives to that many journals at once: a replicated target on one machine writes each message to several."""
    done = [0] * writers
    data = os.urandom(block)

    def write(i: int) -> None:
        fd, path = tempfile.mkstemp(prefix=f"pigeon-disk-bw-{i}-", dir=directory)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                os.write(fd, data)
                os.fdatasync(fd)
                done[i] += block
        finally:
            os.close(fd)
            os.unlink(path)

    threads = [threading.Thread(target=write, args=(i,), name=f"disk-bw-{i}", daemon=True) for i in range(writers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return round(sum(done) / (time.monotonic() - t0) / 1e6, 1)


def wait_quiet(max_wait_s: float, other_pct_max: float = 10.0, window_s: float = 2.0) -> dict:
    """Wait (at most `max_wait_s`) until programs other than this benchmark use under `other_pct_max` % of the
    machine over a `window_s` window; returns the last reading and how long it waited."""
    t0 = time.monotonic()
    while True:
        w = CpuWatch()
        time.sleep(window_s)
        r = w.read()
        if r["other_pct"] < other_pct_max or time.monotonic() - t0 >= max_wait_s:
            return dict(r, waited_s=round(time.monotonic() - t0, 1))


class Daemon:
    """One server process (and whatever it forks), bounded by `timeout -s KILL`."""

    def __init__(self, name: str, cmd: list[str], port: int, log_path: str, wall_s: float,
                 env: dict[str, str] | None = None, cwd: str | None = None):
        self.name, self.cmd, self.port, self.log_path = name, cmd, port, log_path
        self.wall_s, self.env, self.cwd = wall_s, env, cwd
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float, ready: Callable[[], bool] | None = None) -> "Daemon":
        """Start and wait until `ready()` (default: the port accepts connections)."""
        env = dict(os.environ, **(self.env or {}))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["timeout", "-s", "KILL", str(int(self.wall_s)), *self.cmd], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=self.cwd,
                                         start_new_session=True)
        _live.add(self)
        ready = ready or (lambda: port_open(self.port))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.kill()
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if ready():
                return self
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"{self.name} was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss(self) -> int:
        return rss_tree_bytes(self.pid) if self.running() else 0

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """Send `sig` to every process of the server, without waiting for anything."""
        self._signal_group(sig)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # timeout made itself the group leader (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in _session_members(self.proc.pid):  # anything that moved to a group of its own
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM to the whole group, then SIGKILL what is left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # timeout forwards TERM to its child; the group signal reaches grandchildren too
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL to the whole group: the crash path, and the last word of every stop. Returns once every
        process of the server is gone and its port is closed, so a restart cannot mistake the dying server's
        socket for the new one's."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10
        while (_session_members(self.proc.pid) or port_open(self.port)) and time.monotonic() < deadline:
            self._signal_group(signal.SIGKILL)
            time.sleep(0.01)
        _live.discard(self)


@atexit.register
def _kill_leftovers() -> None:
    for d in list(_live):
        d.kill()



def cluster_status(etcd: str) -> dict:
    """What `pigeon cluster status --format json` prints for the cluster on `etcd`."""
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "status", "--etcd", etcd, "--format", "json"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"pigeon cluster status: {out.stderr.strip()}")
    return json.loads(out.stdout)
