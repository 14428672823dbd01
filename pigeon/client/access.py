"""How a client program reaches a node, plain or secured: the one place that turns a CA, a bearer token and a
client certificate into a gRPC channel — for the command line (its verbs, `pigeon probe`, `pigeon export`), the
Spark connector and pigeon.client. Owns the rules:

  * nothing given: plaintext, as to the loopback default;
  * anything given: TLS, verifying the server against the CA given (else the system's roots), presenting the
    client certificate when one is given (mutual TLS), and the token as `authorization: Bearer …` on every call
    (gRPC sends call credentials over TLS only);
  * a token or a token file, not both; a client certificate and its key, together;
  * files are read once, when the ClientAuth is made: it holds bytes, so it pickles (Spark ships it to its
    executors, which may not have the files) and its repr shows no secret."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import grpc


@dataclass(frozen=True)
class ClientAuth:
    ca_pem: bytes | None = None  # the CA the server's certificate must chain to (None: the system's roots)
    token: str | None = field(default=None, repr=False)  # a bearer token (a token file's or a JWT access token)
    cert_pem: bytes | None = field(default=None, repr=False)  # a client certificate (mutual TLS) …
    key_pem: bytes | None = field(default=None, repr=False)  # … and its key

    def __post_init__(self):
        if (self.cert_pem is None) != (self.key_pem is None):
            raise ValueError("a client certificate and its key go together: give both")
        if self.token is not None and (not self.token or any(c.isspace() for c in self.token)):
            raise ValueError("the bearer token is empty or holds white space")

    @classmethod
    def from_files(cls, ca_file: str | None = None, token: str | None = None, token_file: str | None = None,
                   cert_file: str | None = None, key_file: str | None = None) -> "ClientAuth | None":
        """The access these settings give; None when there are none (plaintext). ValueError says what is wrong
        with them (a file that cannot be read, a token given twice, a certificate without its key)."""
        if token and token_file:
            raise ValueError("give a token or a token file, not both")
        if bool(cert_file) != bool(key_file):
            raise ValueError("a client certificate and its key go together: give both")
        if not (ca_file or token or token_file or cert_file):
            return None
        if token_file:
            token = _read(token_file, "token file").decode("utf-8", "replace").strip()
            if not token:
                raise ValueError(f"the token file {token_file} is empty")
        return cls(ca_pem=_read(ca_file, "CA file") if ca_file else None, token=token.strip() if token else None,
                   cert_pem=_read(cert_file, "client certificate") if cert_file else None,
                   key_pem=_read(key_file, "client key") if key_file else None)

    def credentials(self) -> grpc.ChannelCredentials:
        tls = grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)
        if self.token is None:
            return tls
        return grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(self.token))


def _read(path: str, what: str) -> bytes:
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read the {what} {path}: {e.strerror or e}") from None


def channel(address: str, auth: ClientAuth | None = None, options: list | None = None) -> grpc.Channel:
    """A channel to `address`: plaintext without `auth`, else as `auth` says."""
    if auth is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, auth.credentials(), options=options)


def pubsub_clients(address: str, auth: ClientAuth | None = None, **publisher_options):
    """The official (publisher, subscriber) clients of a node: through PUBSUB_EMULATOR_HOST when plain (the
    emulator path: no Google credentials looked for), else over a channel of `auth`."""
    from google.cloud import pubsub_v1

    options = {"publisher_options": pubsub_v1.types.PublisherOptions(**publisher_options)} if publisher_options \
        else {}
    if auth is None:
        os.environ["PUBSUB_EMULATOR_HOST"] = address
        return pubsub_v1.PublisherClient(**options), pubsub_v1.SubscriberClient()
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    return (pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel(address, auth)), **options),
            pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel(address, auth))))
