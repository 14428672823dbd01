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
    its own and checks the member's against the cluster's CA and the host it dials, as gRPC does;
  * the client port's certificate, key and client CA are read again when their files change (ServedCertificate):
    new connections get the new ones; node certificates are read at start."""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import tempfile

import grpc

from pigeon.core import limits
from pigeon.ops.config import Config

log = logging.getLogger("pigeon.tls")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class ServedCertificate:
    """What the client port and the HTTP port present (`tls_cert`, `tls_key`) and trust (`tls_client_ca`), read
    again when one of the files changes — a certificate renewed by cert-manager, an ACME client or an operator's
    copy — without a restart: `reload_if_changed` (the security watch calls it every second) reads and checks
    them; gRPC asks for the new set before the next connection's handshake, the HTTP port's context loads it.
    Connections already open keep the certificate they were made with. Files that do not make a valid set (a key
    that is not the certificate's, half a copy) are logged and change nothing: the set served until then stays.
    (On the HTTP port a client CA, once trusted, stays trusted until a restart: an SSL context adds CAs only.)"""

    def __init__(self, config: Config):
        self.paths = (config.tls_cert, config.tls_key, config.tls_client_ca)
        self._stamp = _stamp(self.paths)
        self.cert, self.key, self.ca = _checked(*self.paths)
        self.generation = 0  # sets read since start
        self._given = 0  # the generation gRPC has
        self._http: ssl.SSLContext | None = None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._configuration(), self._for_next_handshake,
                                                   require_client_authentication=self.ca is not None)

    def _configuration(self):
        return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], root_certificates=self.ca)

    def _for_next_handshake(self):
        """gRPC's question before each new connection's handshake: a new configuration, or None for no change."""
        if self._given == self.generation:
            return None
        self._given = self.generation
        return self._configuration()

    def http_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        _load(ctx, self.cert, self.key, self.ca)
        if self.ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
        self._http = ctx
        return ctx

    def reload_if_changed(self) -> bool:
        """Whether a changed set of files was read and is now served."""
        stamp = _stamp(self.paths)
        if stamp == self._stamp:
            return False
        self._stamp = stamp  # (a bad set is reported once, not every second; the next change is looked at)
        try:
            cert, key, ca = _checked(*self.paths)
            if self._http is not None:
                _load(self._http, cert, key, ca)
        except (OSError, ValueError, ssl.SSLError) as e:
            log.warning("the TLS files of the client port changed but do not make a valid set (%s): serving the "
                        "certificate read before", e)
            return False
        self.cert, self.key, self.ca = cert, key, ca
        self.generation += 1
        return True


def _stamp(paths) -> tuple:
    """What tells a file changed: its size, modification time and inode (a copy renamed into place)."""
    out = []
    for p in paths:
        try:
            st = os.stat(p) if p else None
        except OSError:
            st = None
        out.append(None if st is None else (st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def _checked(cert_path: str, key_path: str, ca_path: str) -> tuple[bytes, bytes, bytes | None]:
    """The files' bytes, once they are a certificate chain, the private key of its first certificate, and (when
    given) one or more CA certificates; else ValueError."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert, key, ca = _read(cert_path), _read(key_path), _read(ca_path) if ca_path else None
    try:
        leaf = x509.load_pem_x509_certificates(cert)[0]
        private = serialization.load_pem_private_key(key, None)
        if ca is not None:
            x509.load_pem_x509_certificates(ca)
    except (ValueError, TypeError) as e:
        raise ValueError(f"cannot read them: {e}") from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if leaf.public_key().public_bytes(*spki) != private.public_key().public_bytes(*spki):
        raise ValueError(f"the key in {key_path} is not the one of the certificate in {cert_path}")
    return cert, key, ca


def _load(ctx: ssl.SSLContext, cert: bytes, key: bytes, ca: bytes | None) -> None:
    """Load checked bytes into an SSL context (which reads a chain and key only from files: written for the
    moment into a directory only this user may enter)."""
    d = tempfile.mkdtemp(prefix="pigeon-tls-")
    try:
        for name, data in (("cert.pem", cert), ("key.pem", key)):
            with open(os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(data)
        ctx.load_cert_chain(os.path.join(d, "cert.pem"), os.path.join(d, "key.pem"))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if ca is not None:
        ctx.load_verify_locations(cadata=ca.decode())


def peer_server_credentials(config: Config) -> grpc.ServerCredentials:
    """The peer port's: the node certificate, and a certificate the cluster's CA signed required of every caller."""
    return grpc.ssl_server_credentials([(_read(config.node_key), _read(config.node_cert))],
                                       root_certificates=_read(config.cluster_ca), require_client_auth=True)


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


def reconnect_options() -> list[tuple[str, int]]:
    """Channel options that dial a peer (a node, an etcd member) again soon after it comes back. By default gRPC
    waits longer after each failed attempt, up to two minutes, and meanwhile fails every call at once with the
    error of the last attempt: a node restarted after 15 s down stayed unreachable to its peers — its bundles
    unserved through them, publishes refused — for up to as long again."""
    low, high = int(limits.reconnect_s_min * 1000), int(limits.reconnect_s_max * 1000)
    return [("grpc.initial_reconnect_backoff_ms", low), ("grpc.min_reconnect_backoff_ms", low),
            ("grpc.max_reconnect_backoff_ms", high)]


def peer_channel(config: Config | None, address: str, options: list) -> grpc.aio.Channel:
    """A channel to another node: mutual TLS with this node's certificate when the cluster is secured; dialled
    again soon after the node comes back (`reconnect_options`)."""
    options = [*options, *reconnect_options()]
    if config is None or not config.secured:
        return grpc.aio.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(config.cluster_ca),
                                         private_key=_read(config.node_key), certificate_chain=_read(config.node_cert))
    return grpc.aio.secure_channel(address, creds, options=options)
