
import logging
import os

import pytest
from hypothesis import settings

from pigeon.testing.server import ServerProcess

# `make test` gives the same answer on every run: the property tests draw the same examples each time. A run with
# HYPOTHESIS_PROFILE=explore draws new ones; what it finds becomes a fix (or a bound stated where it holds).
settings.register_profile("derandomized", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))

SPARK_DIR = "tests/spark/"
SPARK_WORKER = "gw0"  # the worker of a parallel run that runs the Spark tests
PORTS_PER_WORKER = 16_384  # free_port's span: the ports this many below the kernel's ephemeral range


def pytest_configure(config):
    """In a worker of a parallel run (pytest-xdist), servers start on ports of that worker's own: free_port picks
    at random among the 16,384 ports below the ephemeral range, and a port one worker picked but its server had
    not bound yet (or a killed server was about to bind again) could be picked by the other. Worker n takes the
    span n spans lower (gw0 the usual one, gw1 the one below it, down to port 1024 at most), when the range leaves
    the last worker some thousands of ports; the processes the tests start inherit the span (a `--workers`
    supervisor picks its workers' ports itself)."""
    # The servers the tests start keep their bundles where the hash puts them: many tests pick a topic by the node
    # that owns it, and a move by load in the middle of one (a node busier than the others for 30 s) would fail it
    # for no fault of the code it checks. The tests of placement by load set their own period.
    os.environ.setdefault("PIGEON_LOAD_BALANCE_S", "0")
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    from pigeon.ops import local_ports

    low = local_ports.ephemeral_low()
    if low - PORTS_PER_WORKER * (int(count) - 1) < 1024 + 4096:
        return
    top = low - PORTS_PER_WORKER * (int(worker.removeprefix("gw")) % int(count))  # (gw2 replaces a worker that died)
    os.environ[local_ports.PORTS_BELOW] = str(top)  # (free_port reads it at each call; the servers started inherit it)


@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist: a run without it has no such hook)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs the suite in two processes (pytest-xdist, `-n 2 --dist loadfile`): each file's tests run in
    one worker, so a module's server is started once; and the Spark tests count as one file, the first that
    SPARK_WORKER runs — one JVM and one SparkSession in the run (two local[2] sessions at once would share two
    cores), and the longest unit of work starts first. The other files go in collection order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # collection order, not the files with most tests first

    class SparkAsOneFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SPARK_DIR if nodeid.startswith(SPARK_DIR) else super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            """The Spark tests go first to SPARK_WORKER, the one worker that started a JVM for them (another takes
            them only when nothing else is left, as when that worker died)."""
            if SPARK_DIR in self.workqueue:
                if node.gateway.id == SPARK_WORKER:
                    self.workqueue.move_to_end(SPARK_DIR, last=False)
                elif len(self.workqueue) > 1:
                    spark = self.workqueue.pop(SPARK_DIR)
                    try:
                        super()._assign_work_unit(node)
                    finally:
                        self.workqueue[SPARK_DIR] = spark
                        self.workqueue.move_to_end(SPARK_DIR, last=False)
                    return
            super()._assign_work_unit(node)

    return SparkAsOneFile(config, log)


LOG_TAIL_LINES = 60  # of each log a failed test's processes wrote, in its report
LOG_TAIL_FILES = 8


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the last lines of the logs its own processes wrote under its `tmp_path`
    (servers, workers, etcd): a failure on a CI machine is read from its report alone — the machine is gone."""
    outcome = yield
    report = outcome.get_result()
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if not report.failed or tmp is None or not os.path.isdir(tmp):
        return
    logs = sorted((os.path.join(d, f) for d, _, files in os.walk(tmp) for f in files if f.endswith(".log")),
                  key=os.path.getmtime, reverse=True)[:LOG_TAIL_FILES]
    for path in logs:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 200 * LOG_TAIL_LINES))
            tail = f.read().decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        report.sections.append((f"log {os.path.relpath(path, tmp)} (last {len(tail)} lines)", "\n".join(tail)))


@pytest.fixture
def quiet_logs():
    """No logging (the simulated nodes log every takeover and roll; a failure carries what it needs)."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture
def server_factory(tmp_path):
    """Start real `pigeon serve` processes; all are killed at the end of the test."""
    started: list[ServerProcess] = []

    def make(data_dir=None, **kw) -> ServerProcess:
        d = data_dir or str(tmp_path / f"data{len(started)}")
        srv = ServerProcess(d, **kw)
        started.append(srv)
        return srv.start()

    yield make
    for s in started:
        s.kill()


@pytest.fixture
def server(server_factory):
    return server_factory()


@pytest.fixture
def clients(server, monkeypatch):
    """(publisher, subscriber) official clients pointed at `server` through PUBSUB_EMULATOR_HOST."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
    from google.cloud import pubsub_v1

    pub = pubsub_v1.PublisherClient()
    sub = pubsub_v1.SubscriberClient()
    yield pub, sub
    sub.close()
    pub.stop()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """One real etcd member for the tests that need a coordination store (each keeps to keys of its own)."""
    from pigeon.testing.etcd import EtcdProcess

    e = EtcdProcess(str(tmp_path_factory.mktemp("etcd") / "data")).start()
    yield e
    e.kill()


@pytest.fixture(scope="session")
def etcd_tls(tmp_path_factory):
    """One real etcd member secured as in production: TLS only, client certificates of its CA required (its PKI,
    from pigeon.ops.certs: ca.pem, etcd.pem, node-n1.pem, client-ops.pem)."""
    from pigeon.testing.etcd import EtcdProcess, make_pki

    root = tmp_path_factory.mktemp("etcd-tls")
    e = EtcdProcess(str(root / "data"), pki=make_pki(str(root / "pki"))).start()
    yield e
    e.kill()


@pytest.fixture
def three_nodes(etcd, tmp_path):
    """Three real cluster nodes n1, n2, n3 over the shared etcd (its Pigeon keys wiped first), each owning a share
    of the bundles; all killed at the end."""
    from pigeon.testing.cluster import start_nodes

    started = start_nodes(str(tmp_path), etcd.endpoint)
    yield started
    for n in started.values():
        n.kill()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """Start the Spark tests' JVM before any test runs, when Spark tests are to run. PySpark launches it with a
    fork() of this process (a Popen with a preexec_fn); later in a full run that process holds the threads of
    every gRPC client the e2e tests made, and gRPC then skips its fork handlers ("Other threads are currently
    calling into gRPC") — one full run's launch died before the JVM said its port (JAVA_GATEWAY_EXITED, every
    Spark test in error). Launched now, with no gRPC thread yet, the session's SparkSession reuses it; what the
    JVM prints goes to spark-jvm.log in pytest's base temporary directory. A launch that fails here is left to the
    Spark fixture, which tries again and reports it. In a parallel run each worker's own session decides: with
    `--dist loadfile` only SPARK_WORKER runs Spark tests (and it has told the controller what it collected, so
    the others start their tests meanwhile)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and worker != SPARK_WORKER and session.config.getvalue("dist") == "loadfile":
        return
    if not any("spark" in item.path.parts for item in getattr(session, "items", ())):
        return
    try:
        from pyspark import SparkContext
        from pyspark.java_gateway import launch_gateway

        from spark_helpers import spark_env  # (tests/spark is on the path: its conftest was collected)
    except ImportError:
        return
    spark_env()
    log_path = session.config._tmp_path_factory.getbasetemp() / "spark-jvm.log"
    try:
        with open(log_path, "wb") as log:  # (the JVM keeps its own descriptor of it)
            gateway = launch_gateway(popen_kwargs={"stdout": log, "stderr": log})
        SparkContext._ensure_initialized(gateway=gateway)  # (pyspark 4.3.0, pinned: the gateway, no context yet)
    except Exception:  # noqa: BLE001 — reported by the fixture's own launch
        pass
