"""The client port's TLS files read again while serving (pigeon.ops.tls.ServedCertificate), with real
certificates: a changed set is served from the next handshake on; a set that does not hold together (a key that
is not the certificate's, a file cut short) changes nothing; a later good one is taken."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from pigeon.ops import certs, tls
from pigeon.ops.config import load


@pytest.fixture
def pki(tmp_path):
    d = str(tmp_path)
    certs.make_ca(d)
    certs.issue(d, "server", hosts=["127.0.0.1"])
    certs.issue(d, "other", hosts=["127.0.0.1"])
    return d


def served(pki) -> tls.ServedCertificate:
    cfg = load(env={}, tls_cert=f"{pki}/server.pem", tls_key=f"{pki}/server-key.pem", tls_client_ca=f"{pki}/ca.pem")
    return tls.ServedCertificate(cfg)


def renew(pki) -> bytes:
    """A new certificate and key for the same name, written as a renewal tool writes them."""
    certs.issue(pki, "server", hosts=["127.0.0.1"])
    return open(f"{pki}/server.pem", "rb").read()


def test_a_renewed_certificate_is_served_from_the_next_handshake(pki):
    s = served(pki)
    ctx = s.http_context()
    assert s._for_next_handshake() is None, "nothing changed: gRPC keeps what it has"
    assert not s.reload_if_changed()
    new = renew(pki)
    assert s.reload_if_changed() and s.cert == new and s.generation == 1
    assert s._for_next_handshake() is not None  # once: the configuration gRPC then uses
    assert s._for_next_handshake() is None
    assert s._http is ctx  # the HTTP port's context, loaded in place
    assert not s.reload_if_changed()


def test_files_that_do_not_hold_together_change_nothing(pki, caplog):
    s = served(pki)
    before = s.cert
    shutil.copy(f"{pki}/other-key.pem", f"{pki}/server-key.pem")  # the key of another certificate
    with caplog.at_level(logging.WARNING, logger="pigeon.tls"):
        assert not s.reload_if_changed()
    assert "not the one of the certificate" in caplog.text
    assert (s.cert, s.generation, s._for_next_handshake()) == (before, 0, None)
    assert not s.reload_if_changed(), "reported once, not every second"
    with open(f"{pki}/server.pem", "rb") as f:
        half = f.read()[:200]
    with open(f"{pki}/server.pem", "wb") as f:  # a copy cut short
        f.write(half)
    assert not s.reload_if_changed() and s.cert == before
    new = renew(pki)  # then the whole renewal lands
    assert s.reload_if_changed() and s.cert == new


def test_a_set_that_cannot_be_served_stops_the_start(pki):
    shutil.copy(f"{pki}/other-key.pem", f"{pki}/server-key.pem")
    with pytest.raises(ValueError, match="not the one of the certificate"):
        served(pki)
    os.remove(f"{pki}/server-key.pem")
    with pytest.raises(OSError):
        served(pki)
