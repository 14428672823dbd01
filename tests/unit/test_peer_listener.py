"""The peer port's rules without a network: which settings a node with a peer port accepts, where its peers
dial it, and whom the guard believes on each listener (real certificates, a real token file; the servicer context
is a plain object holding what gRPC would hand the guard)."""

from __future__ import annotations

import os

import pytest

from pigeon.api import access
from pigeon.core.errors import PermissionDenied, Unauthenticated
from pigeon.node.membership import NodeInfo
from pigeon.ops import certs
from pigeon.ops.auth import Authenticator, token_hash
from pigeon.ops.config import load

ADMIN = "user:admin@example.com"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    certs.make_ca(d)
    certs.issue(d, "server", hosts=["localhost", "127.0.0.1"])
    certs.issue(d, "node-n2", hosts=["127.0.0.1"], node_id="n2")
    certs.issue(d, "client-eve", email="eve@example.com")
    with open(os.path.join(d, "tokens"), "w") as f:
        f.write(f"{token_hash('eve-token')} user:eve@example.com\n")
    return d


def cluster(pki, **over):
    base = dict(etcd="http://127.0.0.1:2379", node_id="n1", port=7000, tls_cert=f"{pki}/server.pem",
                tls_key=f"{pki}/server-key.pem", auth_token_file=f"{pki}/tokens")
    return load(env={}, **{**base, **over})


def test_a_secured_cluster_needs_node_certificates_on_one_port_or_the_other(pki):
    with pytest.raises(ValueError, match="--tls-client-ca"):
        cluster(pki)  # one shared port: peers prove they are nodes there, so clients need certificates too
    with pytest.raises(ValueError, match="node certificate"):
        cluster(pki, peer_port=7001)  # a peer port without the cluster's CA
    cfg = cluster(pki, peer_port=7001, peer_cert=f"{pki}/node-n2.pem", peer_key=f"{pki}/node-n2-key.pem",
                  peer_ca=f"{pki}/ca.pem")
    assert (cfg.node_cert, cfg.cluster_ca, cfg.tls_client_ca) == (f"{pki}/node-n2.pem", f"{pki}/ca.pem", "")
    assert cluster(pki, peer_port=7001, tls_client_ca=f"{pki}/ca.pem").cluster_ca == f"{pki}/ca.pem"
    with pytest.raises(ValueError, match="give --peer-port"):
        cluster(pki, tls_client_ca=f"{pki}/ca.pem", peer_ca=f"{pki}/ca.pem")
    with pytest.raises(ValueError, match="go together"):
        cluster(pki, peer_port=7001, peer_cert=f"{pki}/node-n2.pem", peer_ca=f"{pki}/ca.pem")
    with pytest.raises(ValueError, match="of its own"):
        cluster(pki, peer_port=7000, peer_ca=f"{pki}/ca.pem")
    with pytest.raises(ValueError, match="--etcd"):
        load(env={}, peer_port=7001)


def test_peers_dial_the_peer_port_on_the_advertised_host(pki):
    cfg = cluster(pki, peer_port=7001, peer_ca=f"{pki}/ca.pem", advertise="n1.example:443")
    assert (cfg.address, cfg.peer_address) == ("n1.example:443", "n1.example:7001")
    assert cluster(pki, tls_client_ca=f"{pki}/ca.pem").peer_address == ""
    info = NodeInfo("n1", cfg.address, peer=cfg.peer_address)
    again = NodeInfo.decode("n1", info.encode())
    assert (again.address, again.dial) == ("n1.example:443", "n1.example:7001")
    assert NodeInfo.decode("n0", NodeInfo("n0", "h:1").encode()).dial == "h:1"  # a node without a peer port


def test_the_peer_port_may_listen_on_an_interface_of_its_own(pki):
    """--peer-host: the nodes' network apart from the clients'. Peers dial it (unless it is a wildcard, when they
    dial the advertised host); it needs a peer port; and the loopback rule looks at it as at the client port."""
    node = dict(etcd="http://127.0.0.1:2379", node_id="n1", port=7000, peer_port=7001)
    cfg = load(env={}, **node, peer_host="127.0.0.2")
    assert (cfg.address, cfg.peer_address, cfg.peer_listen_host) == ("127.0.0.1:7000", "127.0.0.2:7001", "127.0.0.2")
    assert cfg.listeners == ("127.0.0.1", "127.0.0.2")
    for wildcard in ("0.0.0.0", "::"):
        cfg = cluster(pki, peer_port=7001, peer_ca=f"{pki}/ca.pem", advertise="n1.example:443", peer_host=wildcard)
        assert (cfg.peer_address, cfg.peer_listen_host) == ("n1.example:7001", wildcard)
    plain = load(env={}, **node)
    assert (plain.peer_address, plain.peer_listen_host, plain.listeners) == ("127.0.0.1:7001", "127.0.0.1",
                                                                               ("127.0.0.1",))
    with pytest.raises(ValueError, match="give --peer-port"):
        load(env={}, etcd="http://127.0.0.1:2379", node_id="n1", peer_host="127.0.0.2")
    # a machine's workers: the supervisor gives each its peer port, on the peer host given
    assert load(env={}, etcd="http://127.0.0.1:2379", node_id="n1", workers=2, peer_host="127.0.0.2").peer_host
    # clients on loopback, peers on the machine's network: open, that is not loopback any more
    with pytest.raises(ValueError, match="refusing to serve 10.0.0.5"):
        load(env={}, **node, peer_host="10.0.0.5")
    assert load(env={}, **node, peer_host="10.0.0.5", insecure=True).listeners == ("127.0.0.1", "10.0.0.5")


def test_the_append_channel_is_a_cluster_nodes_and_announced_with_it(pki):
    plain = load(env={}, etcd="http://127.0.0.1:2379", node_id="n1", port=7000)
    assert plain.append_channel and plain.append_port == 0  # any free port, by default
    assert not load(env={}, etcd="http://127.0.0.1:2379", node_id="n1", append_port=-1).append_channel
    assert not load(env={}).append_channel, "the embedded single node has no ledgers to take"
    assert cluster(pki, tls_client_ca=f"{pki}/ca.pem").append_channel, "a secured node's speaks mutual TLS"
    for bad in (7000, -2, 70000):
        with pytest.raises(ValueError, match="--append-port"):
            load(env={}, etcd="http://127.0.0.1:2379", node_id="n1", port=7000, append_port=bad)
    info = NodeInfo("n1", "h:7000", append="h:7002")
    assert NodeInfo.decode("n1", info.encode()).append == "h:7002"
    assert NodeInfo.decode("n0", NodeInfo("n0", "h:1").encode()).append == ""


class Context:
    """What gRPC hands the guard about a call: its metadata, the TLS peer's verified certificate, its address."""

    def __init__(self, metadata=(), cert: str | None = None, peer: str = "ipv4:127.0.0.1:5555"):
        self.metadata, self.cert, self._peer = tuple(metadata), cert, peer

    def invocation_metadata(self):
        return self.metadata

    def auth_context(self):
        return {"x509_pem_cert": [open(self.cert, "rb").read()]} if self.cert else {}

    def peer(self):
        return self._peer


def guard(cfg) -> access.Guard:
    return access.Guard(None, Authenticator(cfg), cfg, None, None)


def test_only_a_node_on_a_listener_that_takes_peers_may_vouch_for_a_caller(pki):
    # a peer port beside a client port that asks clients for certificates too: the strictest case
    g = guard(cluster(pki, peer_port=7001, tls_client_ca=f"{pki}/ca.pem"))
    node, eve = f"{pki}/node-n2.pem", f"{pki}/client-eve.pem"
    vouch = [(access.PRINCIPAL, ADMIN), ("x-pigeon-forwarded", "n2")]
    token = [("authorization", "Bearer eve-token")]
    # the peer port: a node vouches, or is itself; nothing else is answered
    assert g.principal(Context(vouch, node), access.PEERS) == (ADMIN, True)
    assert g.principal(Context((), node), access.PEERS) == ("node:n2", False)
    for md, cert in ((vouch, eve), (token, eve), (vouch + token, None)):
        with pytest.raises(PermissionDenied):
            g.principal(Context(md, cert), access.PEERS)
    # the client port: a node's certificate is only a certificate, and vouching is ignored
    assert g.principal(Context(vouch, node), access.CLIENTS) == ("node:n2", False)
    assert g.principal(Context(vouch + token, node), access.CLIENTS) == ("user:eve@example.com", False)
    assert g.principal(Context(vouch, eve), access.CLIENTS) == ("user:eve@example.com", False)
    with pytest.raises(Unauthenticated):
        g.principal(Context(vouch), access.CLIENTS)
    # … but the node's own REST front (the unix socket) passes on the caller it authenticated
    assert g.principal(Context(vouch, peer="unix:/tmp/x/grpc.sock"), access.CLIENTS) == (ADMIN, False)
    # one shared port (no peer port): a node's certificate vouches there, as before
    shared = guard(cluster(pki, tls_client_ca=f"{pki}/ca.pem"))
    assert shared.principal(Context(vouch, node), access.SHARED) == (ADMIN, True)
    assert shared.principal(Context(vouch, eve), access.SHARED) == ("user:eve@example.com", False)
