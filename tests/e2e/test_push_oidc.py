"""End to end: push OIDC tokens an endpoint can verify. `pigeon serve` signs them with the key of
`--push-signing-key` (a PEM file, or a service-account JSON key file) or else with one it made and keeps in its
data directory, and publishes the public key at /.well-known/jwks.json on its HTTP port; the test's receiver
verifies every token it gets as an endpoint would — PyJWT's PyJWKClient against that URL, RS256, its audience."""

from __future__ import annotations

import json
import os
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from e2e_helpers import E2E_MARKS, client_factory, raw_publish  # noqa: F401  (fixture)
from test_push import Receiver

from pigeon.node import push_tokens
from pigeon.testing.server import ServerProcess, free_port

pytestmark = E2E_MARKS

P = "oidc-proj"
SA = "pusher@oidc-proj.iam.gserviceaccount.com"
GOOGLE = "https://accounts.google.com"


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def get_json(url: str, context: ssl.SSLContext | None = None) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


def jwks_kids(srv) -> list[str]:
    status, _, doc = get_json(srv.http + "/.well-known/jwks.json")
    assert status == 200, doc
    return [k["kid"] for k in doc["keys"]]


class Verifier:
    """What an endpoint does with each push: the bearer token verified against the node's JWKS (RS256, Google's
    issuer, the audience this path expects); a token that does not verify is answered 401 (a nack)."""

    def __init__(self, receiver: Receiver, jwks_url: str, audiences: dict[str, str]):
        self.keys = jwt.PyJWKClient(jwks_url)
        self.audiences = audiences  # path → the audience its tokens must carry
        receiver.answer = self.answer

    def answer(self, rec: dict) -> int:
        scheme, _, token = rec["headers"].get("authorization", "").partition(" ")
        try:
            assert scheme == "Bearer", f"no bearer token: {rec['headers']}"
            key = self.keys.get_signing_key_from_jwt(token)
            rec["claims"] = jwt.decode(token, key.key, algorithms=["RS256"], audience=self.audiences[rec["path"]],
                                       issuer=GOOGLE, options={"require": ["exp", "iat", "iss", "aud"]})
            rec["token"], rec["kid"] = token, key.key_id
            return 200
        except Exception as e:  # noqa: BLE001 — whatever fails, the endpoint refuses the push
            rec["error"] = repr(e)
            return 401


def _push_subscription(sub, topic: str, name: str, endpoint: str, audience: str = "") -> str:
    subscription = sub.subscription_path(P, name)
    oidc = {"service_account_email": SA, **({"audience": audience} if audience else {})}
    sub.create_subscription(request={"name": subscription, "topic": topic, "push_config": {
        "push_endpoint": endpoint, "oidc_token": oidc}})
    return subscription


def test_every_push_token_verifies_against_the_nodes_jwks(server_factory, client_factory, receiver):
    srv = server_factory(http=True)
    pub, sub = client_factory(srv)
    jwks_url = srv.http + "/.well-known/jwks.json"
    base = receiver.url.rsplit("/", 1)[0]
    verifier = Verifier(receiver, jwks_url, {"/with-audience": "https://my.app", "/no-audience": f"{base}/no-audience"})
    topic = pub.topic_path(P, "verified-topic")
    pub.create_topic(name=topic)
    _push_subscription(sub, topic, "with-audience-sub", f"{base}/with-audience", audience="https://my.app")
    _push_subscription(sub, topic, "no-audience-sub", f"{base}/no-audience")  # aud: the endpoint's URL
    raw_publish(pub, topic, [{"data": f"m{i}".encode()} for i in range(5)])
    got = receiver.wait_for(10)
    assert [r.get("error") for r in got] == [None] * 10  # every token verified: none was refused
    assert sorted(r["path"] for r in got) == ["/no-audience"] * 5 + ["/with-audience"] * 5
    for rec in got:
        claims = rec["claims"]
        assert claims["iss"] == GOOGLE and claims["aud"] == verifier.audiences[rec["path"]]
        assert claims["email"] == SA and claims["email_verified"] is True
        assert claims["exp"] - claims["iat"] == 3600

    (kid,) = jwks_kids(srv)
    assert {r["kid"] for r in got} == {kid}
    token = got[0]["token"]
    # Google's own library verifies them too, pointed at the node's keys instead of Google's
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token

    assert id_token.verify_token(token, Request(), audience=got[0]["claims"]["aud"], certs_url=jwks_url)["email"] == SA
    key = verifier.keys.get_signing_key_from_jwt(token).key
    with pytest.raises(jwt.InvalidAudienceError):  # a token is good for its own audience only
        jwt.decode(token, key, algorithms=["RS256"], audience="https://another.app", issuer=GOOGLE)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    with pytest.raises(jwt.InvalidSignatureError):  # and verifies with the node's key only
        jwt.decode(token, other, algorithms=["RS256"], audience=got[0]["claims"]["aud"], issuer=GOOGLE)

    status, headers, doc = get_json(jwks_url)
    assert headers["content-type"].startswith("application/json")
    (jwk,) = doc["keys"]
    assert (jwk["kty"], jwk["use"], jwk["alg"], jwk["e"]) == ("RSA", "sig", "RS256", "AQAB")
    status, _, discovery = get_json(srv.http + "/.well-known/openid-configuration")
    assert status == 200
    assert discovery["issuer"] == GOOGLE and discovery["jwks_uri"] == jwks_url
    assert discovery["id_token_signing_alg_values_supported"] == ["RS256"]


def test_the_key_made_in_the_data_directory_survives_a_crash(server_factory):
    srv = server_factory(http=True)
    path = os.path.join(srv.data_dir, push_tokens.SIGNING_KEY_FILE)
    assert not os.path.exists(path)  # (made when first needed: here, by the first request for the keys)
    (kid,) = jwks_kids(srv)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    srv.kill()
    again = server_factory(data_dir=srv.data_dir, http=True)
    assert jwks_kids(again) == [kid]
    again.stop()
    assert jwks_kids(server_factory(data_dir=srv.data_dir, http=True)) == [kid]


def _key_files(directory) -> dict[str, tuple[str, str]]:
    """{kind: (file, the kid its tokens carry)}: a PEM file and a service-account JSON key file of one RSA key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption())
    pem_path = os.path.join(directory, "push-key.pem")
    with open(pem_path, "wb") as f:
        f.write(pem)
    sa_path = os.path.join(directory, "service-account.json")
    with open(sa_path, "w") as f:
        json.dump({"type": "service_account", "project_id": P, "private_key_id": "5f2a" * 10,
                   "private_key": pem.decode(), "client_email": SA, "client_id": "1234567890"}, f)
    return {"pem": (pem_path, push_tokens.key_id(key)), "json": (sa_path, "5f2a" * 10)}, key


@pytest.mark.parametrize("kind", ["pem", "json"])
def test_push_signing_key_signs_the_tokens(server_factory, client_factory, receiver, tmp_path, kind):
    files, key = _key_files(str(tmp_path))
    path, kid = files[kind]
    srv = server_factory(http=True, extra=["--push-signing-key", path])
    pub, sub = client_factory(srv)
    assert jwks_kids(srv) == [kid]
    _, _, doc = get_json(srv.http + "/.well-known/jwks.json")
    assert jwt.PyJWK(doc["keys"][0]).key.public_numbers() == key.public_key().public_numbers()

    Verifier(receiver, srv.http + "/.well-known/jwks.json", {"/push": "https://my.app"})
    topic = pub.topic_path(P, f"{kind}-topic")
    pub.create_topic(name=topic)
    _push_subscription(sub, topic, f"{kind}-sub", receiver.url, audience="https://my.app")
    raw_publish(pub, topic, [{"data": b"signed with the configured key"}])
    (rec,) = receiver.wait_for(1)
    assert rec.get("error") is None and rec["kid"] == kid
    assert jwt.get_unverified_header(rec["token"])["kid"] == kid
    # the configured key signed it: it verifies with that key's public half, fetched from nowhere
    assert jwt.decode(rec["token"], key.public_key(), algorithms=["RS256"], audience="https://my.app")["email"] == SA
    assert not os.path.exists(os.path.join(srv.data_dir, push_tokens.SIGNING_KEY_FILE))  # no key made


def test_a_push_signing_key_that_cannot_sign_stops_the_start(tmp_path):
    bad = tmp_path / "not-a-key.pem"
    bad.write_text("hello")
    for path, why in ((str(tmp_path / "missing.pem"), "No such file"), (str(bad), "not a PEM private key")):
        out = subprocess.run([sys.executable, "-m", "pigeon", "serve", "--port", str(free_port()), "--http-port", "0",
                              "--data-dir", str(tmp_path / "data"), "--push-signing-key", path],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0
        assert f"pigeon: cannot sign push tokens with --push-signing-key {path}" in out.stderr and why in out.stderr


def test_the_keys_are_open_to_anyone_on_a_secured_node(tmp_path):
    from security_kit import Kit

    kit = Kit(str(tmp_path / "pki"))
    srv = ServerProcess(str(tmp_path / "data"), http=True, extra=kit.serve_args()).start()
    try:
        https = f"https://localhost:{srv.http_port}"
        tls = ssl.create_default_context(cafile=kit.ca_path)
        status, _, doc = get_json(https + "/.well-known/jwks.json", tls)  # no credentials
        assert status == 200 and len(doc["keys"]) == 1
        status, _, discovery = get_json(https + "/.well-known/openid-configuration", tls)
        assert status == 200 and discovery["jwks_uri"] == https + "/.well-known/jwks.json"
        assert jwt.PyJWKClient(discovery["jwks_uri"], ssl_context=tls).get_jwk_set().keys[0].key_id == \
            doc["keys"][0]["kid"]
        status, _, err = get_json(https + f"/v1/projects/{P}/topics", tls)  # what the API serves needs them
        assert status == 401, err
    finally:
        srv.kill()
