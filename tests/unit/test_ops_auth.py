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
