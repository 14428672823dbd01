"""Authentication. Owns the rules: which credentials prove who a caller is, and what principal each names.

  * a bearer token listed in the token file — stored there only as its SHA-256 (`sha256:<hex> <principal>` per
    line), so the file leaks no credential; tokens are long random strings, so a fast hash is enough;
  * an OIDC/JWT access token (RS256 only) whose signature verifies against the configured issuer's JWKS (a file
    or a URL), with `iss` and `aud` equal to the configured ones and `exp` in the future; its `email` claim is
    the principal (`serviceAccount:` for *.gserviceaccount.com, else `user:`);
  * under mutual TLS, the client certificate's identity (pigeon.ops.certs.identity_of) when no token is sent.

A bearer token, when sent, decides: a bad one is refused even when a good certificate came with it. Verified
tokens are cached (SHA-256 of the token → principal, expiry), so a call with a token seen before costs a hash
and a dict lookup; the cache forgets everything when the token file changes, so a removed token stops working
within `limits.security_watch_s`.
Everything here runs on the caller's thread and does not suspend; fetching a JWKS URL (`refresh_keys`) blocks
and is run off the event loop by the node."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import urllib.request

import jwt

from pigeon.core import limits
from pigeon.core.errors import Unauthenticated
from pigeon.ops import certs
from pigeon.ops.config import Config

log = logging.getLogger("pigeon.auth")

MISSING = ("Request is missing required authentication credential. Expected OAuth 2 access token, login cookie "
           "or other valid authentication credential.")
INVALID = "Request had invalid authentication credentials."


def token_hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def read_token_file(path: str) -> dict[str, str]:
    """`sha256:<hex> <principal>` per line (blank lines and `#` comments skipped) → {hash: principal}."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[0].startswith("sha256:") or len(parts[0]) != 71 or ":" not in parts[1]:
                raise ValueError(f"{path}:{n}: expected 'sha256:<64 hex digits> <principal>' (a principal such as "
                                 "serviceAccount:ci@demo.iam.gserviceaccount.com)")
            out[parts[0].lower()] = parts[1]
    return out


class Authenticator:
    """Turns a call's credentials into a principal, or raises Unauthenticated."""

    def __init__(self, config: Config, now=time.time):
        self.config, self.now = config, now
        self.cache: dict[bytes, tuple[str, float]] = {}
        self.tokens: dict[str, str] = {}
        self._token_stat = None
        if config.auth_token_file:
            self.reload_tokens()
        self.mtls = bool(config.tls_client_ca)
        self.keys: dict[str, object] = {}  # kid → public key of the issuer
        self._keys_at = 0.0
        self.unknown_kid = False  # a token named a key not (yet) known: the next refresh comes early
        if config.oidc_jwks:
            self.refresh_keys()

    # --- the sources -----------------------------------------------------------------------------------------
    def reload_tokens(self) -> bool:
        """Read the token file again if it changed; True when it did (the cache is forgotten)."""
        st = os.stat(self.config.auth_token_file)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._token_stat:
            return False
        self.tokens = read_token_file(self.config.auth_token_file)
        self._token_stat = stamp
        self.cache = {}
        return True

    def refresh_keys(self) -> None:
        """Read the issuer's JWKS (file or URL). Blocking: the node runs it off the event loop."""
        src = self.config.oidc_jwks
        if src.startswith(("https://", "http://")):
            with urllib.request.urlopen(src, timeout=10) as r:  # noqa: S310 — the operator's configured URL
                doc = json.loads(r.read())
        else:
            with open(src, encoding="utf-8") as f:
                doc = json.load(f)
        keys = {}
        for k in jwt.PyJWKSet.from_dict(doc).keys:
            if k.key_id:
                keys[k.key_id] = k.key
        self.keys, self._keys_at, self.unknown_kid = keys, self.now(), False

    def keys_due(self) -> bool:
        return bool(self.config.oidc_jwks) and (self.unknown_kid or self.now() - self._keys_at
                                                 >= limits.jwks_refresh_s)

    # --- a call ----------------------------------------------------------------------------------------------
    def principal(self, authorization: str | None, cert_pem: bytes | None) -> str:
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated(INVALID)
            return self._token(token.strip())
        if cert_pem is not None and self.mtls:
            who = certs.identity_of(cert_pem)
            if who:
                return who
        raise Unauthenticated(MISSING)

    def _token(self, token: str) -> str:
        key = hashlib.sha256(token.encode()).digest()
        hit = self.cache.get(key)
        now = self.now()
        if hit is not None and hit[1] > now:
            return hit[0]
        who = self.tokens.get("sha256:" + key.hex())
        if who is None and self.config.auth_token_file:
            try:  # a token just added: the file is looked at again (a stat: cheap even for a flood of bad ones)
                if self.reload_tokens():
                    who = self.tokens.get("sha256:" + key.hex())
            except (OSError, ValueError) as e:
                log.warning("token file: %s", e)
        expires = float("inf")
        if who is None:
            if not self.keys and not self.config.oidc_jwks or token.count(".") != 2:
                raise Unauthenticated(INVALID)
            who, expires = self._jwt(token)
        if len(self.cache) >= limits.token_cache_max:
            self.cache = {k: v for k, v in self.cache.items() if v[1] > now}
            if len(self.cache) >= limits.token_cache_max:
                self.cache.clear()
        self.cache[key] = (who, expires)
        return who

    def _jwt(self, token: str) -> tuple[str, float]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated(INVALID) from None
        if header.get("alg") != "RS256":
            raise Unauthenticated(INVALID + " Only RS256 tokens are accepted.")
        key = self.keys.get(header.get("kid", ""))
        if key is None:
            self.unknown_kid = True
            raise Unauthenticated(INVALID + " The token is signed by a key the issuer does not list.")
        try:
            claims = jwt.decode(token, key, algorithms=["RS256"], audience=self.config.oidc_audience,
                                issuer=self.config.oidc_issuer, leeway=limits.jwt_leeway_s,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise Unauthenticated(INVALID + " The token has expired.") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated(INVALID + " The token is for another audience.") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated(INVALID + " The token is from another issuer.") from None
        except jwt.PyJWTError:
            raise Unauthenticated(INVALID) from None
        email = claims.get("email")
        if not isinstance(email, str) or not email or claims.get("email_verified") is False:
            raise Unauthenticated(INVALID + " The token carries no verified email.")
        return certs.principal_of_email(email), float(claims["exp"]) + limits.jwt_leeway_s
