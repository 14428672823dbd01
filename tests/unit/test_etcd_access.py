"""The rules of reaching etcd (pigeon.ops.etcd_access): which endpoints mean TLS, which settings are refused and
how; the settings of `pigeon serve` (Config) keep them; `pigeon certs --etcd` makes a certificate etcd takes."""

from __future__ import annotations

import re

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from pigeon.ops import certs, etcd_access
from pigeon.ops.config import load


@pytest.mark.parametrize("endpoints, files, hosts, tls", [
    ("127.0.0.1:2379", {}, ("127.0.0.1:2379",), False),
    ("http://a:2379, http://b:2379/", {}, ("a:2379", "b:2379"), False),
    ("https://a:2379,https://b:2379", {}, ("a:2379", "b:2379"), True),  # the system's roots
    ("https://a:2379", {"ca": "ca.pem", "cert": "c.pem", "key": "k.pem"}, ("a:2379",), True),
    ("a:2379", {"ca": "ca.pem"}, ("a:2379",), True),  # no scheme: TLS files say TLS, as etcdctl takes it
    (["https://[::1]:2379"], {}, ("[::1]:2379",), True),
])
def test_which_endpoints_mean_tls(endpoints, files, hosts, tls):
    assert etcd_access.parse(endpoints, **files) == (hosts, tls)


@pytest.mark.parametrize("endpoints, files, says", [
    ("http://a:2379", {"ca": "ca.pem"}, "--etcd-ca is for TLS to etcd, but its endpoints say http:// "
                                        "(http://a:2379): give https:// endpoints"),
    ("http://a:2379", {"cert": "c", "key": "k"}, "--etcd-cert and --etcd-key are for TLS to etcd, but"),
    ("https://a:2379", {"cert": "c.pem"}, "--etcd-cert and --etcd-key go together"),
    ("https://a:2379", {"key": "k.pem"}, "--etcd-cert and --etcd-key go together"),
    ("http://a:2379,https://b:2379", {}, "etcd endpoints mix schemes"),
    ("a:2379,https://b:2379", {}, "etcd endpoints mix schemes"),
    ("unix://a:2379", {}, "etcd endpoints are host:port, http://host:port or https://host:port (got unix://)"),
    ("https://a", {}, "etcd endpoint 'a': host:port"),
    (" , ", {}, "etcd needs at least one endpoint"),
])
def test_settings_that_cannot_work_are_refused_saying_why(endpoints, files, says):
    with pytest.raises(ValueError, match="^" + re.escape(says)):
        etcd_access.parse(endpoints, **files)


def test_files_are_read_once_and_must_be_pem(tmp_path):
    ca, bad = tmp_path / "ca.pem", tmp_path / "bad.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    bad.write_bytes(b"not pem")
    access = etcd_access.read("https://a:2379", str(ca))
    assert access.ca == ca.read_bytes() and access.cert is None and access.tls
    assert "BEGIN" not in repr(access)  # key material stays out of logs and tracebacks
    with pytest.raises(ValueError, match=f"^--etcd-ca {bad}: not a PEM file$"):
        etcd_access.read("https://a:2379", str(bad))
    with pytest.raises(ValueError, match=f"^--etcd-cert {tmp_path}/none.pem: No such file or directory$"):
        etcd_access.read("https://a:2379", str(ca), str(tmp_path / "none.pem"), str(ca))


def test_serve_settings_keep_the_rules_and_take_them_from_the_environment():
    env = {"PIGEON_ETCD": "https://e:2379", "PIGEON_NODE_ID": "n1", "PIGEON_ETCD_CA": "ca.pem",
           "PIGEON_ETCD_CERT": "n1.pem", "PIGEON_ETCD_KEY": "n1-key.pem"}
    cfg = load(env=env)
    assert (cfg.etcd_ca, cfg.etcd_cert, cfg.etcd_key) == ("ca.pem", "n1.pem", "n1-key.pem")
    with pytest.raises(ValueError, match=r"--etcd-ca is for TLS to etcd, but its endpoints say http:// \(http://e"):
        load(env={**env, "PIGEON_ETCD": "http://e:2379", "PIGEON_ETCD_CERT": "", "PIGEON_ETCD_KEY": ""})
    with pytest.raises(ValueError, match="--etcd-cert and --etcd-key go together"):
        load(env={}, etcd="https://e:2379", node_id="n1", etcd_cert="n1.pem")
    with pytest.raises(ValueError, match="secure the connection to etcd: give --etcd too"):
        load(env={}, etcd_ca="ca.pem")


def test_pigeon_certs_makes_an_etcd_certificate_etcd_takes(tmp_path):
    d = str(tmp_path)
    certs.make_ca(d)
    usages = {}
    for name, path in [("etcd", certs.etcd_server(d, ["localhost", "127.0.0.1"])[0]),
                       ("server", certs.issue(d, "server", hosts=["localhost"])[0]),
                       ("node", certs.issue(d, "node-n1", hosts=["localhost"], node_id="n1")[0]),
                       ("client", certs.issue(d, "client-ops", email="ops@example.com")[0])]:
        cert = x509.load_pem_x509_certificate(open(path, "rb").read())
        usages[name] = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    # etcd dials itself with its server certificate (its gateway): under --client-cert-auth it must be a client's too
    assert usages["etcd"] == {server, client}
    assert usages["server"] == {server}
    assert client in usages["node"] and client in usages["client"]  # what a node or an operator presents to etcd
