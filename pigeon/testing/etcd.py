"""Start a real etcd (Debian's `etcd-server`, which `make test` installs when missing) on free loopback ports, for
tests: one member, or a cluster of several; plaintext, or secured as production runs it (https client URLs,
client certificates required, certificates from pigeon.ops.certs)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request

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

    def start(self, timeout: float = 30.0, healthy: bool = True) -> "EtcdProcess":
        """With `healthy`, return once etcd answers requests (it binds its ports before it has a leader and serves:
        a call in between fails); else once it listens (a member of a cluster that is not yet up)."""
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
        if healthy:
            self.await_healthy(timeout)
        return self

    def await_healthy(self, timeout: float = 30.0) -> None:
        """Wait until the member's /health says it serves (it has a leader)."""
        context = None
        if self.pki:
            context = ssl.create_default_context(cafile=self.pki_file("ca"))
            context.load_cert_chain(self.pki_file("client-ops"), self.pki_file("client-ops-key"))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2, context=context) as r:
                    last = r.read().decode()
                if json.loads(last).get("health") == "true":
                    return
            except (OSError, ValueError) as e:
                last = str(e)
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become healthy within {timeout:g} s ({last}); see {self.log_path}")

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


class EtcdCluster:
    """Several etcd members forming one cluster on loopback (plaintext). `endpoint` names every member,
    comma-separated, as `pigeon serve --etcd` takes them; members can be killed and started again one by one."""

    def __init__(self, root: str, members: int = 3):
        os.makedirs(root, exist_ok=True)
        ports = [(free_port(), free_port()) for _ in range(members)]
        initial = ",".join(f"e{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
        token = f"pigeon-test-{ports[0][1]}"
        self.members = [EtcdProcess(os.path.join(root, f"e{i}"), f"e{i}", client, peer, initial, token)
                        for i, (client, peer) in enumerate(ports)]

    @property
    def endpoint(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        """Start every member that is not running (each binds its ports at once; they elect a leader together)."""
        started = [m for m in self.members if m.proc is None or m.proc.poll() is not None]
        for m in started:
            m.start(timeout, healthy=False)
        for m in started:
            m.await_healthy(timeout)
        return self

    def kill(self) -> None:
        for m in self.members:
            m.kill()
