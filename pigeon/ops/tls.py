"""TLS material of a node. Owns the rules: the gRPC port, the HTTP port and node-to-node calls present the same
certificate (`tls_cert`/`tls_key`); with `tls_client_ca` every client must present a certificate that CA signed
(mutual TLS) — gRPC's server credentials can require a client certificate or not ask for one, nothing between —
and a node calls its peers presenting its own certificate and trusting only that CA, so nodes of one cluster
authenticate each other with node certificates (pigeon.ops.certs)."""

from __future__ import annotations

import ssl

import grpc

from pigeon.ops.config import Config


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_credentials(config: Config) -> grpc.ServerCredentials:
    ca = _read(config.tls_client_ca) if config.tls_client_ca else None
    return grpc.ssl_server_credentials([(_read(config.tls_key), _read(config.tls_cert))], root_certificates=ca,
                                       require_client_auth=ca is not None)


def http_context(config: Config) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca:
        ctx.load_verify_locations(config.tls_client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def peer_channel(config: Config, address: str, options: list) -> grpc.aio.Channel:
    """A channel to another node: mutual TLS with this node's certificate when the cluster is secured."""
    if not config.tls_cert:
        return grpc.aio.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(config.tls_client_ca),
                                         private_key=_read(config.tls_key), certificate_chain=_read(config.tls_cert))
    return grpc.aio.secure_channel(address, creds, options=options)
