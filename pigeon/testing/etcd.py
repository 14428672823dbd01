"""Start a real etcd (Debian's `etcd-server`, which `make test` installs when missing) on free loopback ports, for
tests: one member, or a cluster of several."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from pigeon.bench.procs import await_listening, free_port


def etcd_binary() -> str:
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    if path is None:
        raise RuntimeError("etcd is not installed: `make test` installs Debian's etcd-server "
                           "(apt-get install etcd-server)")
    return path


class EtcdProcess:
    """One etcd member. `start()` waits until it answers on its client port."""

    def __init__(self, data_dir: str, name: str = "e0", client_port: int | None = None,
                 peer_port: int | None = None, initial_cluster: str | None = None, token: str | None = None):
        self.data_dir, self.name = data_dir, name
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.initial_cluster = initial_cluster or f"{name}=http://127.0.0.1:{self.peer_port}"
        self.token = token or f"pigeon-test-{self.peer_port}"  # the members of one cluster share it
        self.log_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)), f"etcd-{name}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 30.0) -> "EtcdProcess":
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        cmd = [etcd_binary(), "--name", self.name, "--data-dir", self.data_dir,
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
               "--initial-cluster-token", self.token]
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
