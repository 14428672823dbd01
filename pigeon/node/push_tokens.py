"""Push OIDC tokens (pigeon.node.push's `Authorization: Bearer` header) and the key they are signed with. Owns the
rules:
- the claims are Pub/Sub's: iss https://accounts.google.com, aud the subscription's audience or else its push
  endpoint, email (and sub, azp) the service account, email_verified true, one hour of life; RS256, and the
  header's `kid` names the key;
- the key is `push_signing_key` (a PEM RSA private key, or a Google service-account JSON key file: its
  "private_key", and its "private_key_id" as the kid), else one made once and kept in the data directory
  (SIGNING_KEY_FILE, mode 0600, written durably; a `--workers N` worker's in the supervisor's, which its workers
  share), so tokens verify across restarts;
- the public keys of the signers in use are published as a JWKS document (`jwks()`), which the HTTP port serves
  at /.well-known/jwks.json to anyone: an endpoint verifies a token against it (docs/security.md).
`push_signing_key` is read as the node starts (a key that cannot be used stops it); the data directory's key is read,
or made, the first time it is needed, off the event loop: a node that neither pushes with tokens nor is asked for
its keys does not load cryptography."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import tempfile
import threading
from typing import TYPE_CHECKING

from pigeon.core import limits

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import rsa

log = logging.getLogger("pigeon.push")

# limits live in pigeon.core.limits; bound here so tests can narrow them for one module
oidc_token_lifetime_s = limits.oidc_token_lifetime_s
oidc_token_reuse_s_min = limits.oidc_token_reuse_s_min

OIDC_ISSUER = "https://accounts.google.com"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


SIGNING_KEY_FILE = "push-signing-key.pem"  # the key made for a node without push_signing_key, in its data dir


def key_id(key) -> str:
    """The `kid` of a key read from a PEM file: the first 40 hex digits of the SHA-256 of its public key (DER) —
    as long as Google's key ids, and the same wherever the key is used."""
    from cryptography.hazmat.primitives import serialization

    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:40]


def _rsa_key(pem: bytes, unreadable: str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # (cryptography's word for a key that needs a password)
        raise ValueError("the key is encrypted: give it unencrypted, readable by the server only") from None
    except ValueError:
        raise ValueError(unreadable) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("not an RSA private key (RS256 tokens need one)")
    if key.key_size < 2048:
        raise ValueError(f"an RSA key of {key.key_size} bits: 2048 at least")
    return key


def read_signing_key(path: str) -> tuple[rsa.RSAPrivateKey, str]:
    """(key, kid) from a file: a PEM RSA private key (kid: `key_id`), or a Google service-account JSON key file,
    whose "private_key" signs and whose "private_key_id" is the kid. ValueError for anything else."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.lstrip().startswith(b"{"):
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"not a JSON key file: {e}") from None
        pem, kid = (doc.get("private_key"), doc.get("private_key_id")) if isinstance(doc, dict) else (None, None)
        if not (isinstance(pem, str) and isinstance(kid, str) and kid):
            raise ValueError('a JSON key file needs "private_key" (PEM) and "private_key_id"')
        return _rsa_key(pem.encode(), 'its "private_key" is not a PEM private key'), kid
    key = _rsa_key(raw, "not a PEM private key (nor a JSON key file)")
    return key, key_id(key)


def key_directory(config) -> str:
    """Where the key made for a node is kept: its data directory; a `--workers N` worker's is the supervisor's
    (the parent of its `worker-<i>`, holding workers.json), so the workers, which answer on one HTTP port, sign
    with one key."""
    from pigeon.ops.workers import LAYOUT

    d = os.path.abspath(config.data_dir)
    parent = os.path.dirname(d)
    if config.reuse_port and os.path.exists(os.path.join(parent, LAYOUT)):
        return parent
    return d


def kept_signing_key(directory: str) -> tuple[rsa.RSAPrivateKey, str]:
    """The key kept in `directory` (SIGNING_KEY_FILE), made when there is none: written to a file of its own
    (mode 0600), fsynced, then linked into place — a link never replaces a file, so of processes making it at
    once (a supervisor's workers) every one ends up with the first one linked — and the directory fsynced."""
    path = os.path.join(directory, SIGNING_KEY_FILE)
    try:
        return read_signing_key(path)
    except FileNotFoundError:
        pass
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=SIGNING_KEY_FILE + ".", suffix=".tmp", dir=directory)  # (mode 0600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            log.info("made the key push OIDC tokens are signed with: %s", path)
        except FileExistsError:
            pass  # another process made it first: its key is the one
    finally:
        os.unlink(tmp)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return read_signing_key(path)


def signing_key(config) -> tuple[rsa.RSAPrivateKey, str]:
    """(key, kid) push tokens are signed with: `push_signing_key`'s, else the one kept in the data directory."""
    if config.push_signing_key:
        return read_signing_key(config.push_signing_key)
    return kept_signing_key(key_directory(config))


class TokenSigner:
    """Signs RS256 ID tokens shaped like Google's, with `kid` naming the key. The key is `key`, else what `load()`
    returns (key, kid) the first time it is needed (off the event loop: `ready()`), else one made in memory."""

    def __init__(self, key: rsa.RSAPrivateKey | None = None, kid: str | None = None, load=None):
        self._key = key
        self._kid = kid
        self._load = load
        self._lock = threading.Lock()  # (loaded by the event loop's thread or a worker thread: once)
        self._cache: dict[tuple[str, str], tuple[float, str]] = {}  # (email, audience) → (exp, token)

    def load(self) -> None:
        """Read (or make) the key now, when it is not yet: blocking, so called from a thread on the loop's behalf."""
        with self._lock:
            if self._key is not None:
                return
            if self._load is not None:
                key, kid = self._load()
            else:
                from cryptography.hazmat.primitives.asymmetric import rsa  # (loaded by servers that sign tokens)

                key, kid = rsa.generate_private_key(public_exponent=65537, key_size=2048), None
            self._kid = kid or key_id(key)
            self._key = key

    async def ready(self) -> None:
        if self._key is None:
            await asyncio.to_thread(self.load)

    @property
    def key(self) -> rsa.RSAPrivateKey:
        if self._key is None:
            self.load()
        return self._key

    @property
    def key_id(self) -> str:
        if self._kid is None:
            self._kid = key_id(self.key)
        return self._kid

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def jwk(self) -> dict:
        """The public key as a JSON Web Key (RFC 7517, 7518 §6.3)."""
        pub = self.key.public_key().public_numbers()
        return {"kty": "RSA", "kid": self.key_id, "use": "sig", "alg": "RS256",
                "n": _b64url(pub.n.to_bytes((pub.n.bit_length() + 7) // 8, "big")),
                "e": _b64url(pub.e.to_bytes((pub.e.bit_length() + 7) // 8, "big"))}

    def token(self, email: str, audience: str, now: float) -> str:
        cached = self._cache.get((email, audience))
        if cached is not None and cached[0] - now >= oidc_token_reuse_s_min:
            return cached[1]
        iat = int(now)
        exp = iat + oidc_token_lifetime_s
        header = {"alg": "RS256", "typ": "JWT", "kid": self.key_id}
        claims = {
            "iss": OIDC_ISSUER,
            "aud": audience,
            "azp": email,
            "sub": email,
            "email": email,
            "email_verified": True,
            "iat": iat,
            "exp": exp,
        }
        signing_input = (
            _b64url(json.dumps(header, separators=(",", ":")).encode())
            + "."
            + _b64url(json.dumps(claims, separators=(",", ":")).encode())
        )
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        sig = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        tok = signing_input + "." + _b64url(sig)
        if len(self._cache) >= 1024:
            self._cache.clear()
        self._cache[(email, audience)] = (exp, tok)
        return tok


# the signers of this process's running push managers: their keys are what /.well-known/jwks.json publishes
_published: list[TokenSigner] = []


def publish(signer: TokenSigner) -> None:
    if signer not in _published:
        _published.append(signer)


def withdraw(signer: TokenSigner) -> None:
    if signer in _published:
        _published.remove(signer)


def jwks() -> dict:
    """The JWKS document (RFC 7517) of the keys this process signs push tokens with. Reads (or makes) a key not yet
    loaded: blocking, so the HTTP port calls it from a thread."""
    keys: dict[str, dict] = {}
    for signer in list(_published):
        jwk = signer.jwk()
        keys.setdefault(jwk["kid"], jwk)
    return {"keys": list(keys.values())}
