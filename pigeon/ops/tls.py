"""TLS material of a node. Owns the rules:

  * the client port (gRPC) and the HTTP port present `tls_cert`/`tls_key`; with `tls_client_ca` every client
    must present a certificate that CA signed (mutual TLS) — gRPC's server credentials can require a client
    certificate or not ask for one, nothing between;
  * nodes of one cluster authenticate each other with node certificates (pigeon.ops.certs): a node presents its
    node certificate (`node_cert`, by default `tls_cert`) and trusts only the cluster's CA (`cluster_ca`), both on
    its calls to peers and, when it has a peer port, on that port, which requires a certificate of every caller.
    Without a peer port, peers use the client port, so its clients need certificates as well;
  * the append channel (pigeon.node.append_channel) is the same node-to-node trust over TLS without gRPC: the member
    presents its node certificate and requires one the cluster's CA signed that names a node; the owner presents
    its own and checks the member's against the cluster's CA and the host it dials, as gRPC does."""

from __future__ import annotations

import ssl

import grpc

from pigeon.ops.config import Config


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_credentials(config: Config) -> grpc.ServerCredentials:
    """The client port's."""
    ca = _read(config.tls_client_ca) if config.tls_client_ca else None
    return grpc.ssl_server_credentials([(_read(config.tls_key), _read(config.tls_cert))], root_certificates=ca,
                                       require_client_auth=ca is not None)


def peer_server_credentials(config: Config) -> grpc.ServerCredentials:
    """The peer port's: the node certificate, and a certificate the cluster's CA signed required of every caller."""
    return grpc.ssl_server_credentials([(_read(config.node_key), _read(config.node_cert))],
                                       root_certificates=_read(config.cluster_ca), require_client_auth=True)


def http_context(config: Config) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca:
        ctx.load_verify_locations(config.tls_client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def append_server_context(config: Config) -> ssl.SSLContext | None:
    """The append channel's, on a secured node (None: plain TCP). Whether the caller is a node is checked once the
    handshake is done (`append_channel`): a client of the same CA has a valid certificate too."""
    if not config.secured:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=config.cluster_ca)
    ctx.load_cert_chain(config.node_cert, config.node_key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def append_client_context(config: Config | None) -> ssl.SSLContext | None:
    """An owner's, to dial members' append channels (None: plain TCP)."""
    if config is None or not config.secured:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.cluster_ca)
    ctx.load_cert_chain(config.node_cert, config.node_key)
    return ctx


def peer_channel(config: Config, address: str, options: list) -> grpc.aio.Channel:
    """A channel to another node: mutual TLS with this node's certificate when the cluster is secured."""
    if not config.secured:
        return grpc.aio.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(config.cluster_ca),
                                         private_key=_read(config.node_key), certificate_chain=_read(config.node_cert))
    return grpc.aio.secure_channel(address, creds, options=options)
