
import pytest

from pigeon.testing.server import ServerProcess


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


def pytest_collection_finish(session):
    """Start the Spark tests' JVM before any test runs, when Spark tests are to run. PySpark launches it with a
    fork() of this process (a Popen with a preexec_fn); later in a full run that process holds the threads of
    every gRPC client the e2e tests made, and gRPC then skips its fork handlers ("Other threads are currently
    calling into gRPC") — one full run's launch died before the JVM said its port (JAVA_GATEWAY_EXITED, every
    Spark test in error). Launched now, with no gRPC thread yet, the session's SparkSession reuses it; what the
    JVM prints goes to spark-jvm.log in pytest's base temporary directory. A launch that fails here is left to the
    Spark fixture, which tries again and reports it."""
    if not any("spark" in item.path.parts for item in session.items):
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
