"""pigeon.client.access, the one place a client program's channel is built, and the Spark connector's options that
feed it: which settings make which access, what is refused, and that the access travels (pickled, as Spark ships
it to executors) without showing its secrets. A real TLS server answering these channels is in
tests/e2e/test_probe.py and tests/spark/test_secured.py."""

from __future__ import annotations

import os
import pickle

import grpc
import pytest

from pigeon.client.access import ClientAuth, channel
from pigeon.spark import options as opt
from pigeon.spark.client import PigeonClient


@pytest.fixture
def files(tmp_path):
    for name, text in (("ca.pem", "CA"), ("token", "tok-1\n"), ("empty", "\n"), ("cert.pem", "CERT"),
                       ("key.pem", "KEY")):
        (tmp_path / name).write_text(text)
    return tmp_path


def test_settings_make_an_access_or_none(files):
    assert ClientAuth.from_files() is None  # plaintext, as to the loopback default
    a = ClientAuth.from_files(ca_file=str(files / "ca.pem"), token_file=str(files / "token"))
    assert (a.ca_pem, a.token, a.cert_pem) == (b"CA", "tok-1", None)
    assert ClientAuth.from_files(token=" tok-2 ").token == "tok-2"  # TLS on the system's roots
    m = ClientAuth.from_files(ca_file=str(files / "ca.pem"), cert_file=str(files / "cert.pem"),
                              key_file=str(files / "key.pem"))
    assert (m.cert_pem, m.key_pem, m.token) == (b"CERT", b"KEY", None)
    assert isinstance(a.credentials(), grpc.ChannelCredentials)
    assert isinstance(channel("localhost:1", a), grpc.Channel)


@pytest.mark.parametrize("given, why", [
    ({"token": "t", "token_file": "token"}, "not both"),
    ({"cert_file": "cert.pem"}, "go together"),
    ({"ca_file": "missing.pem"}, "cannot read the CA file"),
    ({"token_file": "empty"}, "is empty"),
])
def test_settings_that_cannot_work_are_refused(files, given, why):
    with pytest.raises(ValueError, match=why):
        ClientAuth.from_files(**{k: str(files / v) if k.endswith("_file") else v for k, v in given.items()})
    with pytest.raises(ValueError, match="white space"):
        ClientAuth(token="two words")


def test_the_access_pickles_and_shows_no_secret(files):
    a = ClientAuth.from_files(ca_file=str(files / "ca.pem"), token="tok-secret", cert_file=str(files / "cert.pem"),
                              key_file=str(files / "key.pem"))
    assert "tok-secret" not in repr(a) and "KEY" not in repr(a)
    assert pickle.loads(pickle.dumps(a)) == a
    c = pickle.loads(pickle.dumps(PigeonClient("localhost:8085", a)))  # what an executor gets
    assert (c.endpoint, c.auth, c._channel) == ("localhost:8085", a, None)


def test_spark_options_take_the_access_and_fall_back_to_the_environment(files):
    env = {"PIGEON_CA_FILE": str(files / "ca.pem"), "PIGEON_TOKEN": "from-env"}
    assert opt.client_auth({}, env={}) is None
    a = opt.client_auth({"tlsCa": str(files / "ca.pem"), "token": "tok-1"}, env={})
    assert (a.ca_pem, a.token) == (b"CA", "tok-1")
    assert opt.client_auth({}, env=env).token == "from-env"
    assert opt.client_auth({"tokenFile": str(files / "token")}, env=env).token == "tok-1"  # replaces the env's
    with pytest.raises(ValueError, match="tlsCa/token"):
        opt.client_auth({"clientCert": str(files / "cert.pem")}, env={})
    o = opt.parse({"topic": "projects/p/topics/orders", "tlsca": str(files / "ca.pem"), "TOKEN": "tok-1"})
    assert o.auth == ClientAuth(ca_pem=b"CA", token="tok-1")
    assert pickle.loads(pickle.dumps(o)).auth == o.auth
    # what `pigeon export` hands its queries: absolute paths, and the token as given
    assert opt.access_options(ca_file="ca.pem", token="t") == {"tlsCa": os.path.abspath("ca.pem"), "token": "t"}
