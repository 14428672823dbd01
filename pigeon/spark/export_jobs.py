"""The export job a node runs for the export subscriptions it serves: `python -m pigeon.spark.export_jobs`, a child
process of the node's export supervisor (pigeon.node.exports), one SparkSession and one streaming query
(pigeon.spark.export.start_export) per subscription. Owns the rules:
- which subscriptions to run is the supervisor's: it writes their names (with each one's uid) to the jobs file,
  re-read every `poll_s`; a query whose subscription left the file is stopped, one that came is started, one
  whose configuration changed is started again;
- a checkpoint belongs to one subscription: a subscription deleted and created again under the same name (another
  uid) starts from a new checkpoint at its own floor, never from the old one's offsets (whose manifests would
  skip, or export again, what the new subscription has not seen);
- a query that fails is started again after a backoff (1 s, doubling, at most `retry_s_max`) and reported
  failed, with its error, until it makes progress again;
- what runs and what failed is written, atomically, to the status file after every poll: the node reads each
  subscription's `state` from it;
- the job ends when its node does (PR_SET_PDEATHSIG where the node could set it, and a look at the parent's pid
  every poll), when its Spark driver's JVM is gone (killed, out of memory: nothing could run again in this
  process; the node starts another), or on SIGTERM, stopping its queries first; a query stopped or killed mid-batch is replayed from its
  checkpoint, and the export's manifests make the replay write nothing twice."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field

from pigeon.spark import export
from pigeon.spark.client import PigeonClient

log = logging.getLogger("pigeon.export")

poll_s = 2.0
spec_refresh_s = 10.0  # how often a running query's subscription is read again (a changed configuration)
retry_s_min = 1.0
retry_s_max = 60.0
error_chars_max = 2000
socket_timeout_s = 120
MARKER = "pigeon-subscription.json"


@dataclass
class Job:
    name: str
    uid: int
    spec: export.ExportSpec | None = None
    query: object = None
    read_at: float = 0.0
    failures: int = 0
    error: str = ""
    retry_at: float = 0.0
    progressed: bool = False  # since it was last started

    def status(self) -> dict:
        progress = _progress(self.query)
        state = "failed" if self.error and not self.progressed else ("running" if self.query is not None
                                                                       else "starting")
        return {"state": state, "error": self.error, "failures": self.failures, "progress": progress}


def _progress(query) -> dict:
    p = getattr(query, "lastProgress", None) if query is not None else None
    if not p:
        return {}
    return {"batch": p.get("batchId"), "rows": p.get("numInputRows"), "at": p.get("timestamp")}


def retry_after_s(failures: int) -> float:
    return min(retry_s_max, retry_s_min * 2 ** max(0, failures - 1))


def read_jobs(path: str) -> dict[str, int]:
    try:
        with open(path, "rb") as f:
            return {k: int(v) for k, v in json.loads(f.read())["subscriptions"].items()}
    except FileNotFoundError:
        return {}


def write_json(path: str, value: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def own_checkpoint(root: str, spec: export.ExportSpec, uid: int) -> None:
    """Make the checkpoint directory this subscription's (see the module's rules); one without a marker (the
    manual `pigeon export`'s, or from before markers) is taken as it is."""
    ck = export.checkpoint_path(root, spec)
    marker = os.path.join(ck, MARKER)
    try:
        with open(marker, "rb") as f:
            seen = json.loads(f.read()).get("uid")
    except FileNotFoundError:
        seen = None
    if seen is not None and seen != uid:
        log.warning("%s was created again (uid %s, the checkpoint's %s): its export starts from a new checkpoint",
                    spec.subscription, uid, seen)
        shutil.rmtree(ck)
    if seen != uid:
        os.makedirs(ck, exist_ok=True)
        write_json(marker, {"uid": uid, "subscription": spec.subscription})


class Runner:
    def __init__(self, endpoint: str, root: str, jobs_file: str, status_file: str, spark, clock=time.monotonic):
        self.endpoint, self.root, self.jobs_file, self.status_file = endpoint, root, jobs_file, status_file
        self.spark, self.clock = spark, clock
        self.remote = type(spark).__module__.startswith("pyspark.sql.connect")  # (Spark Connect's server lives apart)
        self.client = PigeonClient(endpoint)
        self.jobs: dict[str, Job] = {}

    def poll(self) -> None:
        if not self.remote:  # a call into the JVM: it raises when the JVM is gone (killed, out of memory), and then
            _ = self.spark.sparkContext.applicationId  # nothing can run again here: the job ends, the node starts one
        wanted = read_jobs(self.jobs_file)
        for name in [n for n in self.jobs if n not in wanted]:
            self._stop(self.jobs.pop(name))
        now = self.clock()
        for name, uid in wanted.items():
            job = self.jobs.get(name)
            if job is None or job.uid != uid:
                if job is not None:
                    self._stop(job)
                job = self.jobs[name] = Job(name, uid)
            self._tend(job, now)
        write_json(self.status_file, {"pid": os.getpid(), "updated": time.time(),
                                      "subscriptions": {n: j.status() for n, j in self.jobs.items()}})

    def _tend(self, job: Job, now: float) -> None:
        q = job.query
        if q is not None and not q.isActive:
            e = q.exception()
            job.query, job.failures, job.progressed = None, job.failures + 1, False
            job.error = (str(e) if e is not None else "the query stopped")[:error_chars_max]
            job.retry_at = now + retry_after_s(job.failures)
            log.error("export of %s failed (again in %.0f s): %s", job.name, job.retry_at - now, job.error)
        if q is not None and q.isActive and _progress(q):
            job.progressed = True
            if job.failures:
                job.failures, job.error = 0, ""
        if now - job.read_at >= spec_refresh_s or job.query is None and now >= job.retry_at:
            try:
                spec = export.spec_of(self.client.get_subscription(job.name))
            except Exception as e:  # (gone, or the node is not answering: the next poll asks again)
                log.info("reading %s: %s", job.name, e)
                return
            job.read_at = now
            if spec != job.spec and job.query is not None:
                log.info("%s changed: its export %s", job.name, "starts again" if spec else "stops")
                self._stop(job)
            job.spec = spec
        if job.query is None and job.spec is not None and now >= job.retry_at:
            try:
                own_checkpoint(self.root, job.spec, job.uid)
                job.query = export.start_export(self.spark, self.endpoint, job.spec, self.root)
                log.info("export of %s started (%s)", job.name, job.spec.kind)
            except Exception as e:
                job.failures, job.error = job.failures + 1, str(e)[:error_chars_max]
                job.retry_at = now + retry_after_s(job.failures)
                log.error("export of %s could not start (again in %.0f s): %s", job.name, job.retry_at - now, e)

    @staticmethod
    def _stop(job: Job) -> None:
        if job.query is not None:
            try:
                job.query.stop()
            except Exception as e:  # (stopping a query that failed meanwhile)
                log.info("stopping the export of %s: %s", job.name, e)
            job.query = None

    def stop(self) -> None:
        for job in self.jobs.values():
            self._stop(job)


def session(master: str):
    """A SparkSession for the node's exports: a local master binds to loopback, and no UI (several nodes may share a
    machine); `sc://` is Spark Connect."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", str(socket_timeout_s))  # (the Python side of the same)
    if master.startswith("sc://"):
        return SparkSession.builder.remote(master).getOrCreate()
    b = (SparkSession.builder.master(master).appName("pigeon-export")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         # a node's machine is busy by nature: Spark's 15 s for a Python worker to connect back failed queries
         .config("spark.python.authenticate.socketTimeout", f"{socket_timeout_s}s"))
    if master.startswith("local"):
        b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel kills this process when the node that started it dies (even by kill -9)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the poll's look at the parent's pid remains


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pigeon.spark.export_jobs")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--jobs", required=True, help="the jobs file the supervisor writes")
    p.add_argument("--status", required=True, help="the status file this job writes")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--parent", type=int, default=0, help="the node's pid: the job ends when it is gone")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if a.parent:
        _die_with_parent()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    runner = Runner(a.endpoint, os.path.abspath(a.root), a.jobs, a.status, session(a.master))
    try:
        while not stopping:
            if a.parent and os.getppid() != a.parent:
                log.warning("the node (pid %d) is gone: the export job ends", a.parent)
                return 1
            runner.poll()
            deadline = time.monotonic() + poll_s
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.1)
    except Exception:
        log.exception("the export job ends (its node starts another)")
        return 1
    finally:
        runner.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
