
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
