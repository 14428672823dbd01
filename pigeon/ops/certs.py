"""Development certificates (`pigeon certs`). Owns the rules: what a Pigeon certificate says about who holds it
— a server certificate names the hosts it serves (DNS and IP subject alternative names), a client certificate
names its principal (an e-mail SAN: `user:` or `serviceAccount:`), a node certificate names its cluster node (a
URI SAN `spiffe://pigeon/node/<id>`, which peers trust to carry a caller's verified principal), an etcd server
certificate serves its hosts and is a client certificate too (etcd's own gateway dials etcd's client port with
it, and under --client-cert-auth etcd refuses a certificate without clientAuth) — and how an identity is read back
from a peer's certificate (`identity_of`). Every certificate with a principal or a node id is a client certificate
(clientAuth), so a node's certificate or a --client one is what etcd's --client-cert-auth asks of Pigeon.

Every key and certificate is made by the `cryptography` package; nothing here is hand-written cryptography.
A local CA is for development and tests: production deployments bring their own PKI."""

from __future__ import annotations

import datetime
import ipaddress
import os
from functools import lru_cache

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pigeon.core import limits

NODE_URI = "spiffe://pigeon/node/"  # a node certificate's URI SAN: this prefix, then the node id


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: str, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def make_ca(directory: str, name: str = "Pigeon development CA") -> tuple[str, str]:
    """A self-signed CA in `directory` (ca.pem, ca-key.pem); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    ca, ca_key = os.path.join(directory, "ca.pem"), os.path.join(directory, "ca-key.pem")
    _write(ca, _pem(cert))
    _write(ca_key, _pem_key(key), private=True)
    return ca, ca_key


def _load_ca(directory: str):
    with open(os.path.join(directory, "ca.pem"), "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    with open(os.path.join(directory, "ca-key.pem"), "rb") as f:
        key = serialization.load_pem_private_key(f.read(), None)
    return cert, key


def _sans(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def issue(directory: str, name: str, *, hosts: list[str] = (), email: str = "", node_id: str = "",
          client: bool = False, days: int = limits.certificate_days) -> tuple[str, str]:
    """A key and certificate signed by the CA in `directory`, written as <name>.pem and <name>-key.pem there.
    `hosts`: DNS names and IP addresses it serves (a server or node certificate); `email`: the principal of a
    client certificate; `node_id`: a node certificate (serves `hosts` and is a client of its peers); `client`: a
    server certificate that is a client's too (etcd's, `etcd_server`)."""
    ca, ca_key = _load_ca(directory)
    key = _key()
    sans = _sans(list(hosts))
    if email:
        sans.append(x509.RFC822Name(email))
    if node_id:
        sans.append(x509.UniformResourceIdentifier(NODE_URI + node_id))
    usages = []
    if hosts:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if email or node_id or client or not hosts:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    now = _now()
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
         .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    path, key_path = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}-key.pem")
    _write(path, _pem(cert))
    _write(key_path, _pem_key(key), private=True)
    return path, key_path


def etcd_server(directory: str, hosts: list[str], name: str = "etcd") -> tuple[str, str]:
    """etcd's server certificate (its --cert-file and --key-file) for `hosts`: serverAuth and clientAuth."""
    return issue(directory, name, hosts=hosts, client=True)


def principal_of_email(email: str) -> str:
    """IAM's spelling of an e-mail identity: service accounts are `serviceAccount:`, people `user:`."""
    return f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"


@lru_cache(maxsize=4096)
def identity_of(pem: bytes) -> str:
    """The principal a verified peer certificate names: `node:<id>` for a node certificate (its URI SAN), the
    e-mail SAN's principal for a client certificate, else `user:<common name>`; "" when it names none. (Cached:
    a connection's certificate is looked at on each of its calls.)"""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
            if uri.startswith(NODE_URI) and len(uri) > len(NODE_URI):
                return "node:" + uri[len(NODE_URI):]
        emails = san.get_values_for_type(x509.RFC822Name)
        if emails:
            return principal_of_email(emails[0])
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return f"user:{cns[0].value}" if cns else ""
