"""How Pigeon reaches etcd: a node (--etcd, --etcd-ca, --etcd-cert, --etcd-key), `pigeon cluster …` (the same
options) and the test helpers. Owns the rules:

  * endpoints are comma-separated `host:port`, `http://host:port` or `https://host:port`, one scheme for all of
    them (a mix is refused: which of them is secured would depend on which one answers);
  * TLS is on when the endpoints say https://, or say no scheme and a TLS file is given (as etcdctl takes bare
    endpoints); TLS files with http:// endpoints are refused rather than ignored — the connection would go in
    the clear while its operator believes it secured;
  * etcd's certificate is verified against --etcd-ca, else against the system's roots, and must name the host
    dialled; --etcd-cert (this client's certificate, what etcd's --client-cert-auth asks for) goes with
    --etcd-key;
  * the files are read once, when the access is made (a node presents one certificate for its life: replacing
    it means a restart, as for the node's own server certificate). A file that cannot be read or is not PEM is
    a configuration error, said before anything is dialled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

_FLAGS = ("--etcd-ca", "--etcd-cert", "--etcd-key")


@dataclass(frozen=True)
class EtcdAccess:
    endpoints: tuple[str, ...]  # host:port of each member, tried in turn
    tls: bool = False
    ca: bytes | None = field(default=None, repr=False)  # PEM of the CA that signed etcd's certificate (None: the
    #                                                     system's roots)
    cert: bytes | None = field(default=None, repr=False)  # PEM chain this client presents (None: none)
    key: bytes | None = field(default=None, repr=False)  # its PEM private key


def parse(endpoints: str | Iterable[str], ca: str = "", cert: str = "", key: str = "") -> tuple[tuple[str, ...], bool]:
    """(host:port of each endpoint, whether TLS is on), or ValueError saying which setting is wrong. Reads
    nothing: the configuration's check."""
    if isinstance(endpoints, str):
        endpoints = endpoints.split(",")
    given = [e.strip().rstrip("/") for e in endpoints if e.strip()]
    if not given:
        raise ValueError("etcd needs at least one endpoint (host:port)")
    if bool(cert) != bool(key):
        raise ValueError("--etcd-cert and --etcd-key go together (this node's client certificate for etcd and its "
                         "key)")
    schemes = {e.partition("://")[0] if "://" in e else "" for e in given}
    unknown = schemes - {"", "http", "https"}
    if unknown:
        raise ValueError(f"etcd endpoints are host:port, http://host:port or https://host:port (got "
                         f"{sorted(unknown)[0]}://)")
    if len(schemes) > 1:
        raise ValueError(f"etcd endpoints mix schemes ({', '.join(given)}): give every one the same, https:// for "
                         "TLS")
    scheme = schemes.pop()
    files = [f for f, v in zip(_FLAGS, (ca, cert, key)) if v]
    if scheme == "http" and files:
        raise ValueError(f"{' and '.join(files)} {'is' if len(files) == 1 else 'are'} for TLS to etcd, but its "
                         f"endpoints say http:// ({', '.join(given)}): give https:// endpoints (etcd's "
                         "--listen-client-urls https://…)")
    hosts = tuple(e.partition("://")[2] if "://" in e else e for e in given)
    for h in hosts:
        if not h.rpartition(":")[0] or not h.rpartition(":")[2].isdigit():
            raise ValueError(f"etcd endpoint {h!r}: host:port")
    return hosts, scheme == "https" or bool(files)


def read(endpoints: str | Iterable[str], ca: str = "", cert: str = "", key: str = "") -> EtcdAccess:
    """The access `parse` allows, with the files read."""
    hosts, tls = parse(endpoints, ca, cert, key)
    return EtcdAccess(hosts, tls, _pem("--etcd-ca", ca), _pem("--etcd-cert", cert), _pem("--etcd-key", key))


def _pem(flag: str, path: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{flag} {path}: not a PEM file")
    return data
