"""What the security tests share: a CA with server, client and node certificates made in the test's directory, a
token file, an RSA key that signs JWTs (and its JWKS file), and clients that present them — real TLS, real
tokens, nothing mocked."""

from __future__ import annotations

import json
import os
import time

import grpc
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from pigeon.ops import certs
from pigeon.ops.auth import token_hash

ISSUER = "https://issuer.test"
AUDIENCE = "https://pubsub.pigeon.test"
ADMIN = "serviceAccount:admin@ops.iam.gserviceaccount.com"


class Kit:
    def __init__(self, directory: str):
        self.dir = directory
        certs.make_ca(directory)
        self.ca_path = os.path.join(directory, "ca.pem")
        self.server_cert, self.server_key = certs.issue(directory, "server", hosts=["localhost", "127.0.0.1"])
        self.ca = open(self.ca_path, "rb").read()
        self.token_file = os.path.join(directory, "tokens.txt")
        open(self.token_file, "w").close()
        self.tokens: dict[str, str] = {}
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "test-key-1"
        self.jwks_path = os.path.join(directory, "jwks.json")
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        jwk.update(kid=self.kid, alg="RS256", use="sig")
        with open(self.jwks_path, "w") as f:
            json.dump({"keys": [jwk]}, f)
        self.admin_token = self.token(ADMIN)

    def token(self, principal: str) -> str:
        """A bearer token for `principal`, added (hashed) to the token file."""
        if principal not in self.tokens:
            tok = "tok-" + os.urandom(16).hex()
            with open(self.token_file, "a") as f:
                f.write(f"{token_hash(tok)} {principal}\n")
            self.tokens[principal] = tok
        return self.tokens[principal]

    def jwt(self, email: str, *, aud: str = AUDIENCE, iss: str = ISSUER, exp_in: float = 3600, key=None,
            kid: str | None = None) -> str:
        now = int(time.time())
        claims = {"iss": iss, "aud": aud, "sub": email, "email": email, "email_verified": True, "iat": now,
                  "exp": now + int(exp_in)}
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})

    def client_cert(self, name: str, email: str = "", node_id: str = "") -> tuple[bytes, bytes]:
        cert, key = certs.issue(self.dir, name, email=email, node_id=node_id,
                                hosts=["localhost", "127.0.0.1"] if node_id else [])
        return open(cert, "rb").read(), open(key, "rb").read()

    def serve_args(self, *, mtls: bool = False, more: tuple = ()) -> list[str]:
        args = ["--tls-cert", self.server_cert, "--tls-key", self.server_key, "--auth-token-file", self.token_file,
                "--oidc-issuer", ISSUER, "--oidc-audience", AUDIENCE, "--oidc-jwks", self.jwks_path,
                "--admins", ADMIN, *more]
        if mtls:
            args += ["--tls-client-ca", self.ca_path]
        return args

    def channel(self, address: str, cert: tuple[bytes, bytes] | None = None) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(self.ca, *(reversed(cert) if cert else ()))
        return grpc.secure_channel(address.replace("127.0.0.1", "localhost"), creds)


def call(channel: grpc.Channel, method: str, request: bytes, token: str | None = None, timeout: float = 10):
    """One raw unary call; returns (status code, details, response bytes or None)."""
    md = [("authorization", f"Bearer {token}")] if token else None
    try:
        out = channel.unary_unary(method)(request, metadata=md, timeout=timeout)
        return grpc.StatusCode.OK, "", out
    except grpc.RpcError as e:
        return e.code(), e.details(), None


def status_details(e: grpc.RpcError) -> list:
    """The google.rpc details of a failed call (grpc-status-details-bin)."""
    from google.rpc import error_details_pb2, status_pb2

    for k, v in e.trailing_metadata() or ():
        if k == "grpc-status-details-bin":
            out = []
            for d in status_pb2.Status.FromString(v).details:
                for cls in (error_details_pb2.QuotaFailure, error_details_pb2.RetryInfo, error_details_pb2.ErrorInfo):
                    if d.Is(cls.DESCRIPTOR):
                        m = cls()
                        d.Unpack(m)
                        out.append(m)
            return out
    return []
