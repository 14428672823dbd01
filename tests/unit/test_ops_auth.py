"""ops.auth: what each credential proves. Tokens from a real token file, JWTs signed by a key made here."""

import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from pigeon.core.errors import Unauthenticated
from pigeon.ops.auth import Authenticator, token_hash
from pigeon.ops.config import load


@pytest.fixture
def setup(tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk["kid"] = "k1"
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    (tmp_path / "tokens").write_text(f"# ci\n{token_hash('secret-1')} serviceAccount:ci@p.iam.gserviceaccount.com\n")
    cfg = load(env={}, auth_token_file=str(tmp_path / "tokens"), oidc_issuer="https://i", oidc_audience="aud",
               oidc_jwks=str(tmp_path / "jwks.json"))
    return Authenticator(cfg), key, tmp_path


def _jwt(key, **over):
    claims = {"iss": "https://i", "aud": "aud", "email": "ann@x.org", "exp": int(time.time()) + 60, **over}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})


def test_tokens_and_jwts_name_their_principal_and_are_cached(setup):
    a, key, _ = setup
    assert a.principal("Bearer secret-1", None) == "serviceAccount:ci@p.iam.gserviceaccount.com"
    assert a.principal("Bearer " + _jwt(key), None) == "user:ann@x.org"
    assert len(a.cache) == 2


@pytest.mark.parametrize("bad", ["Bearer nope", "Basic secret-1", "Bearer ", "bearer x.y.z"])
def test_bad_tokens(setup, bad):
    a, _, _ = setup
    with pytest.raises(Unauthenticated):
        a.principal(bad, None)


def test_jwt_checks(setup):
    a, key, _ = setup
    for token, why in ((_jwt(key, exp=int(time.time()) - 600), "expired"), (_jwt(key, aud="other"), "audience"),
                       (_jwt(key, iss="https://x"), "issuer"), (_jwt(key, email=None), "email")):
        with pytest.raises(Unauthenticated, match=why):
            a.principal("Bearer " + token, None)
    with pytest.raises(Unauthenticated, match="missing"):
        a.principal(None, None)


def test_a_token_removed_from_the_file_stops_working(setup):
    a, _, d = setup
    assert a.principal("Bearer secret-1", None)
    time.sleep(0.01)
    (d / "tokens").write_text("")
    assert a.reload_tokens()
    with pytest.raises(Unauthenticated):
        a.principal("Bearer secret-1", None)


def test_the_issuers_keys_from_a_url(setup):
    """A JWKS URL (served here over real HTTP) is read at start; a token signed by its key verifies."""
    import http.server
    import threading

    _, key, d = setup
    body = (d / "jwks.json").read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = load(env={}, oidc_issuer="https://i", oidc_audience="aud",
                   oidc_jwks=f"http://127.0.0.1:{srv.server_port}/jwks.json")
        a = Authenticator(cfg)
        assert a.principal("Bearer " + _jwt(key, email="svc@p.iam.gserviceaccount.com"), None) == \
            "serviceAccount:svc@p.iam.gserviceaccount.com"
        assert not a.keys_due()
    finally:
        srv.shutdown()
