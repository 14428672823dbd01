"""The key push OIDC tokens are signed with (pigeon.node.push_tokens): read from a PEM file or a service-account JSON
key file, or made once and kept (mode 0600) — one for every worker of a `--workers N` supervisor — and published as
a JWKS document that PyJWT verifies the tokens against."""

from __future__ import annotations

import json
import os
import stat
import threading

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from pigeon.node import push_tokens
from pigeon.ops.config import Config

SA = "pusher@p.iam.gserviceaccount.com"


def _pem(key, password: bytes | None = None) -> bytes:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


@pytest.fixture(scope="module")
def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def test_a_pem_key_is_read_and_named_by_its_public_key(tmp_path, rsa_key):
    path = tmp_path / "key.pem"
    path.write_bytes(_pem(rsa_key))
    key, kid = push_tokens.read_signing_key(str(path))
    assert key.private_numbers() == rsa_key.private_numbers()
    assert kid == push_tokens.key_id(rsa_key) and len(kid) == 40
    assert push_tokens.TokenSigner(key, kid).jwk()["kid"] == kid


def test_a_service_account_json_key_is_named_by_its_private_key_id(tmp_path, rsa_key):
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "0123abcd" * 5,
                                "private_key": _pem(rsa_key).decode(), "client_email": SA}))
    key, kid = push_tokens.read_signing_key(str(path))
    assert kid == "0123abcd" * 5
    assert key.private_numbers() == rsa_key.private_numbers()


@pytest.mark.parametrize("content, why", [
    (lambda k: b"not a key", r"not a PEM private key \(nor a JSON key file\)"),
    (lambda k: json.dumps({"private_key": "x", "private_key_id": "k"}).encode(), '"private_key" is not a PEM'),
    (lambda k: _pem(k, b"secret"), "encrypted"),
    (lambda k: _pem(ec.generate_private_key(ec.SECP256R1())), "not an RSA"),
    (lambda k: _pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)), "2048 at least"),
    (lambda k: json.dumps({"private_key": _pem(k).decode()}).encode(), "private_key_id"),
    (lambda k: b"{not json", "not a JSON key file"),
])
def test_what_cannot_sign_is_refused(tmp_path, rsa_key, content, why):
    path = tmp_path / "bad"
    path.write_bytes(content(rsa_key))
    with pytest.raises(ValueError, match=why):
        push_tokens.read_signing_key(str(path))


def test_a_made_key_is_kept_private_and_used_again(tmp_path):
    key, kid = push_tokens.kept_signing_key(str(tmp_path / "data"))
    path = tmp_path / "data" / push_tokens.SIGNING_KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path / "data") == [push_tokens.SIGNING_KEY_FILE]  # (no temporary file left)
    again, kid_again = push_tokens.kept_signing_key(str(tmp_path / "data"))
    assert kid_again == kid and again.private_numbers() == key.private_numbers()


def test_makers_racing_all_keep_the_first_key(tmp_path):
    got: list[str] = []
    start = threading.Barrier(4)

    def make():
        start.wait()
        got.append(push_tokens.kept_signing_key(str(tmp_path))[1])

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and len(set(got)) == 1
    assert os.listdir(tmp_path) == [push_tokens.SIGNING_KEY_FILE]


def test_the_workers_of_a_supervisor_share_its_directory(tmp_path):
    root = tmp_path / "root"
    (root / "worker-0").mkdir(parents=True)
    worker = Config(data_dir=str(root / "worker-0"), reuse_port=True)
    assert push_tokens.key_directory(worker) == str(root / "worker-0")  # (no workers.json: a node of its own)
    (root / "workers.json").write_text("{}")
    assert push_tokens.key_directory(worker) == str(root)
    assert push_tokens.key_directory(Config(data_dir=str(root / "worker-0"))) == str(root / "worker-0")


def test_the_setting_comes_before_the_data_directory(tmp_path, rsa_key):
    path = tmp_path / "key.pem"
    path.write_bytes(_pem(rsa_key))
    _, kid = push_tokens.signing_key(Config(data_dir=str(tmp_path / "data"), push_signing_key=str(path)))
    assert kid == push_tokens.key_id(rsa_key)
    assert not (tmp_path / "data").exists()  # nothing made
    _, made = push_tokens.signing_key(Config(data_dir=str(tmp_path / "data")))
    assert made != kid and (tmp_path / "data" / push_tokens.SIGNING_KEY_FILE).exists()


def test_tokens_verify_against_the_published_jwks(tmp_path, monkeypatch):
    monkeypatch.setattr(push_tokens, "_published", [])  # (engines of other tests in this process, not stopped)
    signer = push_tokens.TokenSigner(load=lambda: push_tokens.kept_signing_key(str(tmp_path)))
    push_tokens.publish(signer)
    try:
        doc = push_tokens.jwks()
        assert len(doc["keys"]) == 1
        (jwk,) = doc["keys"]
        assert set(jwk) == {"kty", "kid", "use", "alg", "n", "e"}
        assert (jwk["kty"], jwk["use"], jwk["alg"], jwk["e"]) == ("RSA", "sig", "RS256", "AQAB")
        tok = signer.token(SA, "https://my.app/push", 1_700_000_000)
        assert jwt.get_unverified_header(tok) == {"alg": "RS256", "typ": "JWT", "kid": jwk["kid"]}
        claims = jwt.decode(tok, jwt.PyJWK(jwk).key, algorithms=["RS256"], audience="https://my.app/push",
                            issuer="https://accounts.google.com", options={"verify_exp": False, "verify_iat": False})
        assert claims["email"] == SA and claims["email_verified"] is True
        with pytest.raises(jwt.InvalidAudienceError):
            jwt.decode(tok, jwt.PyJWK(jwk).key, algorithms=["RS256"], audience="https://other.app",
                       options={"verify_exp": False, "verify_iat": False})
    finally:
        push_tokens.withdraw(signer)
    assert push_tokens.jwks() == {"keys": []}
