"""Start a real etcd (Debian's `etcd-server`, which `make test` installs when missing) on free loopback ports, for
tests: one member, or a cluster of several; plaintext, or secured as production runs it (https client URLs,
client certificates required, certificates from pigeon.ops.certs)."""

from __future__ import annotations

import os
import signal
import subprocess

from pigeon.bench.procs import await_listening, free_port
from pigeon.ops import certs, etcd_access, local_ports


def etcd_binary() -> str:
    path = local_ports.etcd_binary()
    if path is None:
        raise RuntimeError("etcd is not installed: `make test` installs Debian's etcd-server "
                           "(apt-get install etcd-server)")
    return path


def make_pki(directory: str, nodes=("n1",)) -> str:
    """A development CA in `directory` with etcd's server certificate for loopback (etcd.pem), a node certificate
    per node id (node-<id>.pem) and a client certificate (client-ops.pem) — what `pigeon certs DIR --etcd --node …
    --client ops@example.com` makes. Returns the directory."""
    certs.make_ca(directory)
    loopback = ["localhost", "127.0.0.1"]
    certs.etcd_server(directory, loopback)
    for n in nodes:
        certs.issue(directory, f"node-{n}", hosts=loopback, node_id=n)
    certs.issue(directory, "client-ops", email="ops@example.com")
    return directory


class EtcdProcess:
    """One etcd member. `start()` waits until it answers on its client port. With `pki` (a directory `make_pki`
    filled) its client URL is https:// and takes only client certificates that directory's CA signed."""

    def __init__(self, data_dir: str, name: str = "e0", client_port: int | None = None,
                 peer_port: int | None = None, initial_cluster: str | None = None, token: str | None = None,
                 pki: str | None = None):
        self.data_dir, self.name, self.pki = data_dir, name, pki
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.initial_cluster = initial_cluster or f"{name}=http://127.0.0.1:{self.peer_port}"
        self.token = token or f"pigeon-test-{self.peer_port}"  # the members of one cluster share it
        self.log_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)), f"etcd-{name}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.pki else 'http'}://{self.endpoint}"

    def pki_file(self, name: str) -> str:
        assert self.pki, "a plaintext etcd has no certificates"
        return os.path.join(self.pki, f"{name}.pem")

    def tls_flags(self, client: str = "node-n1") -> list[str]:
        """The command line's options (besides --etcd) that reach this etcd presenting the certificate `client` of
        its PKI."""
        if not self.pki:
            return []
        return ["--etcd-ca", self.pki_file("ca"), "--etcd-cert", self.pki_file(client),
                "--etcd-key", self.pki_file(f"{client}-key")]

    def access(self, client: str = "node-n1") -> etcd_access.EtcdAccess:
        """What those options make (pigeon.ops.etcd_access): EtcdMetadata(etcd.access()) reaches it."""
        if not self.pki:
            return etcd_access.read(self.url)
        return etcd_access.read(self.url, self.pki_file("ca"), self.pki_file(client), self.pki_file(f"{client}-key"))

    def start(self, timeout: float = 30.0) -> "EtcdProcess":
        client, peer = self.url, f"http://127.0.0.1:{self.peer_port}"
        cmd = [etcd_binary(), "--name", self.name, "--data-dir", self.data_dir,
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
               "--initial-cluster-token", self.token]
        if self.pki:
            cmd += ["--cert-file", self.pki_file("etcd"), "--key-file", self.pki_file("etcd-key"),
                    "--trusted-ca-file", self.pki_file("ca"), "--client-cert-auth"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        await_listening(self.proc, self.client_port, timeout, "etcd", self.log_path)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
