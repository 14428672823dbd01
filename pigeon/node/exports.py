"""Export subscriptions run by the node itself (`pigeon serve --export-root DIR`). Owns the rules:
- which export subscriptions this node runs: those whose bundle it owns — every one on a single node, each on
  exactly one node of a cluster, moving with its bundle (`wanted`);
- a destination is probed before it is run: its directory (a bucket's, under the export root, or a Delta table's)
  is made when missing and a file written in it and removed, every `probe_s`; one that cannot be written is
  reported, not handed to the job;
- one child process runs them all (the Spark job, pigeon.spark.export_jobs, one streaming query each): started
  when there is something to run, started again with a backoff when it dies (1 s, doubling to `restart_s_max`;
  back to 1 s once it ran `healthy_s`), stopped when nothing is left to run or the node stops, and it ends with
  the node (it watches its parent) — its checkpoints and manifests make every restart write nothing twice;
- each export subscription's `state` and its configuration's `state`, decided by `STATES` below from what this
  node sees, is what Create, Get, List and Update answer (`annotate`); in a cluster the owner's view is shared
  under the export root (_status/), so every node answers the same.
Without an export root the node runs no export, and an export subscription says RESOURCE_ERROR (its
configuration NOT_FOUND): it keeps its backlog, as Pub/Sub keeps one whose bucket is missing, until a node with
an export root serves it or `pigeon export` is run by hand."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import importlib.util
import subprocess
import sys
import time

from pigeon.broker import exports
from pigeon.core.errors import PigeonError
from pigeon.core.pubsub_types import types

log = logging.getLogger("pigeon.exports")

tick_s = 2.0  # how often ownership, the child and its status are looked at
probe_s = 10.0  # how often each destination is probed (and other nodes' states read)
restart_s_min = 1.0
restart_s_max = 60.0
healthy_s = 60.0  # a child that ran this long starts again after restart_s_min
stop_s = 15.0  # SIGTERM, then this long for the child to stop its queries, then SIGKILL to its group
shared_state_s = 60.0  # the owner writes its state for other nodes on a change and at least this often
job_log_bytes_max = 16 << 20  # the child's log is kept as one previous file beyond this

ACTIVE = int(types.Subscription.State.ACTIVE)
RESOURCE_ERROR = int(types.Subscription.State.RESOURCE_ERROR)
DEST_ACTIVE = int(types.CloudStorageConfig.State.ACTIVE)  # (BigQueryConfig.State has the same numbers)
DENIED = int(types.CloudStorageConfig.State.PERMISSION_DENIED)
MISSING = int(types.CloudStorageConfig.State.NOT_FOUND)
assert [int(types.BigQueryConfig.State[n]) for n in ("ACTIVE", "PERMISSION_DENIED", "NOT_FOUND")] == [
    DEST_ACTIVE, DENIED, MISSING]

# what an export subscription says, by what this node knows of it, first row that holds:
# (condition, Subscription.state, its config's state, why — for the log and the status)
STATES = (
    ("no_root", RESOURCE_ERROR, MISSING, "this node has no --export-root"),
    ("no_spark", RESOURCE_ERROR, MISSING, "pyspark is not installed (pip install 'pigeon[spark]')"),
    ("secured", RESOURCE_ERROR, MISSING, "a secured node does not run exports itself (run `pigeon export`)"),
    ("denied", RESOURCE_ERROR, DENIED, "the destination refuses writes"),
    ("missing", RESOURCE_ERROR, MISSING, "the destination cannot be made"),
    ("failed_denied", RESOURCE_ERROR, DENIED, "the export failed: permission denied"),
    ("failed", RESOURCE_ERROR, MISSING, "the export failed"),
    ("ok", ACTIVE, DEST_ACTIVE, ""),
)
_STATE = {c: (s, d, why) for c, s, d, why in STATES}


def condition(*, root: bool, spark: bool, secured: bool, probe: str, job: dict | None, child_failures: int) -> str:
    """The row of STATES for one subscription: `probe` is "ok", "denied" or "missing"; `job` what the Spark job
    reports of it (None: not running here); `child_failures` how often in a row the job died."""
    if not root:
        return "no_root"
    if not spark:
        return "no_spark"
    if secured:
        return "secured"
    if probe != "ok":
        return probe
    if job is not None and job.get("state") == "failed":
        err = job.get("error", "").lower()
        return "failed_denied" if "permission denied" in err or "read-only" in err else "failed"
    if child_failures >= 3:
        return "failed"
    return "ok"


def destination(root: str, sub) -> str:
    """The directory an export subscription writes in (pigeon.spark.export's layout); "" for a name that is not
    valid (stored before names were checked): its probe says "missing"."""
    if exports.kind(sub) == "storage":
        return os.path.join(root, sub.cloud_storage_config.bucket)
    try:
        return os.path.join(root, "_bigquery", *exports.table_parts(sub.bigquery_config.table))
    except PigeonError:
        return ""


def probe(path: str, node: str) -> str:
    """"ok" when a file can be written in `path` (made when missing), "denied" or "missing"."""
    if not path:
        return "missing"
    test = os.path.join(path, f".pigeon-probe-{node}-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(test, "wb") as f:
            f.write(b"probe")
        os.remove(test)
        return "ok"
    except OSError as e:
        return "denied" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "missing"


def restart_after_s(failures: int) -> float:
    return min(restart_s_max, restart_s_min * 2 ** max(0, failures - 1))


def _read_json(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _write_json(path: str, value: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


class ExportSupervisor:
    """Runs this node's export subscriptions (see the module's rules). `annotate` is safe to call at any time."""

    def __init__(self, config, engine, clock=time.monotonic):
        self.config, self.engine, self.clock = config, engine, clock
        self.endpoint = ""  # where the job reaches this node: known once it listens (start)
        self.root = os.path.abspath(config.export_root) if config.export_root else ""
        self.spark = bool(self.root) and importlib.util.find_spec("pyspark") is not None
        self.node = config.node_id or "node"
        self.dir = os.path.join(config.data_dir, "exports")
        self.jobs_file, self.status_file = os.path.join(self.dir, "jobs.json"), os.path.join(self.dir, "status.json")
        self.conditions: dict[str, str] = {}  # subscription → row of STATES, as this node last decided it
        self.probes: dict[str, str] = {}  # destination → "ok" | "denied" | "missing"
        self.others: dict[str, str] = {}  # another node's subscription → the condition its owner shared
        self.shared: dict[str, tuple[str, float]] = {}  # own subscription → (condition, when shared)
        self.jobs: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self.started_at = self.start_at = self.probed_at = 0.0
        self.failures = 0
        self.stopping_since: float | None = None
        self._task: asyncio.Task | None = None

    # --- what the API answers ---------------------------------------------------------------------------------
    def annotate(self, sub):
        """Fill in an export subscription's `state` fields (in place; returns it)."""
        kind = exports.kind(sub)
        if not kind:
            return sub
        state, dest, _ = _STATE[self._condition_of(sub)]
        sub.state = state
        (sub.cloud_storage_config if kind == "storage" else sub.bigquery_config).state = dest
        return sub

    def describe(self, sub) -> tuple[str, str]:
        """(destination, state) of an export subscription for the console: ("cloud storage: BUCKET" or "bigquery:
        TABLE", "ACTIVE" or "RESOURCE_ERROR: why"); ("", "") for any other."""
        kind = exports.kind(sub)
        if not kind:
            return "", ""
        where = f"cloud storage: {sub.cloud_storage_config.bucket}" if kind == "storage" else \
            f"bigquery: {sub.bigquery_config.table}"
        state, _, why = _STATE[self._condition_of(sub)]
        return where, "ACTIVE" if state == ACTIVE else f"RESOURCE_ERROR: {why}"

    def _condition_of(self, sub) -> str:
        if sub.name in self.conditions:  # one this node runs
            return self.conditions[sub.name]
        c = self._default()
        if c == "ok":  # another node's (or one not looked at yet): what this node sees of its destination, else
            c = self.probes.get(destination(self.root, sub), "ok")  # what its owner shared
        return self.others.get(sub.name, "ok") if c == "ok" else c

    def _default(self) -> str:
        return condition(root=bool(self.root), spark=self.spark, secured=self.config.secured, probe="ok", job=None,
                         child_failures=0)

    def statistics(self) -> dict[str, str]:
        """subscription → why it is not running ("" when it is), for the subscriptions this node decided."""
        return {n: _STATE[c][2] for n, c in self.conditions.items()}

    # --- the loop ---------------------------------------------------------------------------------------------
    def start(self, endpoint: str) -> None:
        self.endpoint = endpoint
        if not self.root:
            log.info("no --export-root: export subscriptions are not run by this node (they say RESOURCE_ERROR)")
            return
        if not self.spark or self.config.secured:
            log.error("export subscriptions will not run: %s", _STATE[self._default()][2])
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pigeon-exports")

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # (a full disk, a file gone: the next tick tries again)
                log.exception("export supervisor")
            await asyncio.sleep(tick_s)

    def wanted(self) -> dict[str, object]:
        """This node's export subscriptions: name → its SubscriptionState."""
        state, bundles = self.engine.state, self.config.bundles
        return {n: s for n, s in state.subs.items() if exports.kind(s.config) and s.topic is not None
                and not s.config.detached and self.engine.owns(state.log_of_sub(n, bundles))}

    async def tick(self) -> None:
        now = self.clock()
        every = {n: s for n, s in self.engine.state.subs.items() if exports.kind(s.config)}
        mine = self.wanted()
        if now - self.probed_at >= probe_s or any(destination(self.root, s.config) not in self.probes
                                                  for s in mine.values()):
            dests = {destination(self.root, s.config) for s in every.values()}
            others = [n for n in every if n not in mine]
            self.probes, self.others = await asyncio.to_thread(self._probe_all, dests, others)
            self.probed_at = now
        runnable = self.spark and not self.config.secured
        jobs = {n: s.uid for n, s in mine.items()
                if runnable and self.probes.get(destination(self.root, s.config)) == "ok"}
        if jobs != self.jobs:
            await asyncio.to_thread(_write_json, self.jobs_file, {"subscriptions": jobs})
            self.jobs = jobs
        self._tend_child(now)
        status = (await asyncio.to_thread(_read_json, self.status_file) or {}) if self.proc is not None else {}
        reported = status.get("subscriptions", {})
        conditions = {n: condition(root=True, spark=self.spark, secured=self.config.secured,
                                   probe=self.probes.get(destination(self.root, s.config), "ok"),
                                   job=reported.get(n), child_failures=self.failures) for n, s in mine.items()}
        for n, c in conditions.items():
            if c != self.conditions.get(n):
                (log.info if c == "ok" else log.error)("export of %s: %s", n, "running" if c == "ok" else
                                                       _STATE[c][2] + _error(reported.get(n)))
        self.conditions = conditions
        await self._share(now)

    def _probe_all(self, dests: set[str], others: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        probes = {d: probe(d, self.node) for d in sorted(dests)}
        shared = {}
        for n in others:
            got = _read_json(self._shared_path(n))
            if got and got.get("condition") in _STATE:
                shared[n] = got["condition"]
        return probes, shared

    def _shared_path(self, name: str) -> str:
        return os.path.join(self.root, "_status", *name.split("/")[1::2]) + ".json"

    async def _share(self, now: float) -> None:
        """Write this node's conditions where the other nodes read them (on a change, and every shared_state_s)."""
        due = {n: c for n, c in self.conditions.items()
               if self.shared.get(n, ("", 0.0))[0] != c or now - self.shared[n][1] >= shared_state_s}
        if not due:
            return
        try:
            await asyncio.to_thread(lambda: [_write_json(self._shared_path(n), {"condition": c, "node": self.node})
                                             for n, c in due.items()])
        except OSError as e:  # (an unwritable root: this node's own answers still say so)
            log.debug("sharing export states: %s", e)
            return
        self.shared.update({n: (c, now) for n, c in due.items()})
        for n in [n for n in self.shared if n not in self.conditions]:
            del self.shared[n]

    # --- the child --------------------------------------------------------------------------------------------
    def _tend_child(self, now: float) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            code = self.proc.returncode
            ran = now - self.started_at
            self.proc = None
            if self.stopping_since is None:
                self.failures = 1 if ran >= healthy_s else self.failures + 1
                self.start_at = now + restart_after_s(self.failures)
                log.error("the export job ended (exit %s after %.0f s): it starts again in %.0f s (%s)", code, ran,
                          self.start_at - now, self._log_path())
            self.stopping_since = None
        if self.proc is not None and self.failures and now - self.started_at >= healthy_s:
            self.failures = 0  # (it runs again)
        if self.proc is not None and not self.jobs and self.stopping_since is None:
            log.info("no export subscription left to run here: the export job stops")
            self._terminate(now)
        if self.proc is not None and self.stopping_since is not None and now - self.stopping_since > stop_s:
            self._kill()
        if self.proc is None and self.jobs and now >= self.start_at:
            self._spawn(now)

    def _log_path(self) -> str:
        return os.path.join(self.dir, "job.log")

    def _spawn(self, now: float) -> None:
        master = self.config.export_master
        cmd = [sys.executable, "-m", "pigeon.spark.export_jobs", "--endpoint", self.endpoint, "--root", self.root,
               "--jobs", self.jobs_file, "--status", self.status_file, "--master", master,
               "--parent", str(os.getpid())]
        env = dict(os.environ)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        if master.startswith("local"):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        try:
            os.remove(self.status_file)  # (the last child's: this one writes its own)
        except FileNotFoundError:
            pass
        path = self._log_path()
        if os.path.exists(path) and os.path.getsize(path) > job_log_bytes_max:
            os.replace(path, path + ".1")
        with open(path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        self.started_at = now
        log.info("export job started (pid %d, master %s, %d subscription(s); its log: %s)", self.proc.pid, master,
                 len(self.jobs), path)

    def _terminate(self, now: float) -> None:
        self.stopping_since = now
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the JVM and Spark's Python workers with it
        except (ProcessLookupError, PermissionError):
            pass

    async def stop(self) -> None:
        """Stop the loop and the child (SIGTERM; SIGKILL to its group after stop_s)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.proc is None or self.proc.poll() is not None:
            return
        self._terminate(self.clock())
        deadline = self.clock() + stop_s
        while self.proc.poll() is None and self.clock() < deadline:
            await asyncio.sleep(0.1)
        self._kill()  # (what the child left: Spark's workers)
        self.proc = None


def _error(job: dict | None) -> str:
    return f": {job['error'][:300]}" if job and job.get("error") else ""
