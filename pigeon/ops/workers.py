"""`pigeon serve --workers N` (N > 1): N worker processes behind one address, so a node uses more than the one core
a Python process's event loop can (docs/workers.md).

Each worker is a cluster node (docs/cluster.md) of a cluster private to this data directory: the supervisor starts
an etcd of its own on loopback (`<data dir>/etcd`), and worker i serves with the data directory `<data dir>/worker-i`
and node id `w<i>`. Every worker listens on the same client port and HTTP port (SO_REUSEPORT: the kernel spreads
the connections over them) and on a peer port and an append channel of its own, where the others reach it. The
cluster's placement gives each worker a share of the bundles; a call for a bundle another worker owns is forwarded
to it, as between the nodes of a cluster. A worker's ledgers are kept by itself only (replicas = ack quorum = 1):
copies on the one disk of one machine would add writes and no safety.

With `--etcd` the workers are nodes `<node id>.w<i>` of that cluster instead (no etcd of their own; the cluster's
replication settings): each carries the machine's name (its `machine` setting, the supervisor's node id), and an
ensemble takes one node of a machine at most (pigeon.cluster.quorum.choose_ensemble).

With TLS or authentication (`secured`), clients meet the workers' client port exactly as they would a single
node's; between themselves the workers prove they are nodes on their peer ports with node certificates of a CA
private to the data directory (`<data dir>/pki`, made at the first secured start, a certificate added for each new
worker), as the nodes of a secured cluster do (docs/security.md). In a secured cluster on `--etcd` the workers
prove it with the machine's node certificate and trust the cluster's CA (`--tls-cert`/`--tls-key` and
`--tls-client-ca`, or `--peer-cert`/`--peer-key`/`--peer-ca`): a peer checks that its caller is a node of the
cluster, not which one, and the workers are the machine's processes, with its disk and its key files.

The supervisor owns the rules:
  * the data directory's layout is written down (`workers.json`: the count, and etcd's ports or the node id in a
    cluster) and checked at every start: a single node's data directory is refused, and so is a count below the
    one written (a worker's ledgers live on it: dropping one would drop what it holds), private workers' data
    with `--etcd` and the other way round, and a cluster node's workers' data under another node id;
  * a worker that exits is started again (backing off to `limits.worker_restart_s_max`); meanwhile the cluster
    moves its bundles to the others once its session lapses, as for any node;
  * SIGTERM or SIGINT stops the workers (each drains as a node does) and then etcd; the supervisor ends with them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time

from pigeon.core import limits
from pigeon.ops import local_ports
from pigeon.ops.config import Config
from pigeon.ops.local_ports import free_port

log = logging.getLogger("pigeon.workers")

LAYOUT = "workers.json"  # in the data directory: {"workers": N, "etcd_client": port, "etcd_peer": port,
#                          "worker_http_ports": [this start's HTTP port of each worker's own, 0 for none]}


def refuse_as_single(data_dir: str) -> str | None:
    """Why a single process must not serve `data_dir` (it holds workers' data), or None."""
    path = os.path.join(data_dir, LAYOUT)
    if os.path.exists(path):
        with open(path) as f:
            n = json.load(f)["workers"]
        return (f"{data_dir} holds the data of {n} workers (its {LAYOUT}): start it with --workers {n} (or more); "
                f"each worker's journal is in {data_dir}/worker-<i>")
    return None


def _end_with_parent() -> None:
    """In a child, before it runs: SIGTERM it when the supervisor dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so no worker or etcd outlives the process that answers for them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _etcd_binary() -> str:
    path = local_ports.etcd_binary()
    if path is None:
        raise SystemExit("pigeon: --workers needs etcd to coordinate its workers: install Debian's etcd-server "
                         "(apt-get install etcd-server; `make test` does)")
    return path


def _layout(config: Config) -> dict:
    """The data directory's layout, checked against `config` and written (created, or grown to more workers)."""
    root = config.data_dir
    path = os.path.join(root, LAYOUT)
    if os.path.exists(path):
        with open(path) as f:
            layout = json.load(f)
        if config.workers < layout["workers"]:
            raise SystemExit(f"pigeon: {root} holds the data of {layout['workers']} workers; --workers "
                             f"{config.workers} would leave the ledgers of workers {config.workers}.."
                             f"{layout['workers'] - 1} unserved: start it with --workers {layout['workers']} or more")
        node = layout.get("node_id")  # the node whose workers these are, in a cluster on --etcd; else private
        if node is None and config.etcd:
            raise SystemExit(f"pigeon: {root} holds the data of workers with an etcd of their own: start it without "
                             f"--etcd (its workers' ledgers are in that etcd, not the cluster's)")
        if node is not None and node != config.node_id:
            raise SystemExit(f"pigeon: {root} holds the data of node {node}'s workers in a cluster: start it with "
                             f"--etcd and --node-id {node}")
    else:
        if os.path.isdir(root) and os.listdir(root):
            raise SystemExit(f"pigeon: {root} holds a single node's data (no {LAYOUT}): --workers N needs a data "
                             f"directory of its own (or start this one without --workers)")
        layout = {"node_id": config.node_id} if config.etcd else {"etcd_client": free_port(), "etcd_peer": free_port()}
    layout["workers"] = config.workers
    os.makedirs(root, exist_ok=True)
    _write(path, layout)
    return layout


def _write(path: str, layout: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(layout, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _settings(config: Config, **overrides) -> dict[str, str]:
    """A worker's settings as the environment `ops.config.load` reads (PIGEON_<FIELD>): everything the
    supervisor was given, then what is the worker's own."""
    values = dataclasses.asdict(config) | overrides
    return {f"PIGEON_{k.upper()}": ("true" if v else "false") if isinstance(v, bool) else str(v)
            for k, v in values.items()}


class _Child:
    """A process the supervisor keeps running: started again when it exits, after a pause that doubles while it
    keeps exiting soon after its start (up to limits.worker_restart_s_max) and starts over once it ran a while."""

    STEADY_S = 60.0  # a child that ran this long before it exited is started again at once

    def __init__(self, name: str, start):
        self.name, self._start = name, start
        self.proc: subprocess.Popen | None = None
        self.started = self.due = 0.0
        self.backoff = 0.0

    def tend(self, now: float) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:  # it exited
            log.error("%s (pid %d) exited with %s: starting it again", self.name, self.proc.pid, self.proc.returncode)
            self.proc = None
            steady = now - self.started > self.STEADY_S
            self.backoff = 0.0 if steady else min(limits.worker_restart_s_max, max(0.25, 2 * self.backoff))
            self.due = now + self.backoff
        if now >= self.due:
            self.proc, self.started = self._start(), now


class Supervisor:
    def __init__(self, config: Config):
        self.config = config
        self.root = os.path.abspath(config.data_dir)
        self.etcd: _Child | None = None  # the workers' own etcd (none when they join the cluster on --etcd)
        self.children: list[_Child] = []  # the workers
        self.stopping = False

    @property
    def workers(self) -> list[subprocess.Popen | None]:
        return [c.proc for c in self.children]

    def run(self) -> int:
        local_ports.taken(self.config.port, self.config.http_port)  # (ours to share, not bound until the workers start)
        layout = _layout(self.config)
        port = self.config.port or free_port()  # the one port every worker shares
        own = [free_port() if self.config.http_port else 0 for _ in range(self.config.workers)]
        if self.config.etcd:  # nodes of the cluster on --etcd, one machine's: an ensemble takes one of them at most
            etcd, cluster = self.config.etcd, {"machine": self.config.node_id}
            name = lambda i: f"{self.config.node_id}.w{i}"  # noqa: E731
        else:  # the nodes of a cluster of their own, one copy of each ledger (module docstring)
            self.etcd = _Child(f"the workers' etcd (its log: {self.root}/etcd.log)", lambda: self._start_etcd(layout))
            etcd, cluster = f"http://127.0.0.1:{layout['etcd_client']}", {"replicas": 1, "ack_quorum": 1}
            name = lambda i: f"w{i}"  # noqa: E731
        for i in range(self.config.workers):
            env = os.environ | _settings(
                self.config, data_dir=os.path.join(self.root, f"worker-{i}"), port=port, etcd=etcd,
                node_id=name(i), peer_port=free_port(), append_port=free_port(), workers=1, reuse_port=True,
                advertise=f"{self._advertised_host()}:{port}", own_http_port=own[i], **cluster,
                **self._node_certificate(name(i)))
            self.children.append(_Child(f"worker {i}", lambda env=env: subprocess.Popen(
                [sys.executable, "-m", "pigeon", "serve"], env=env, preexec_fn=_end_with_parent)))
        _write(os.path.join(self.root, LAYOUT), layout | {"worker_http_ports": own})  # where each one is scraped
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "stopping", True))
        log.info("%d workers on %s:%d (data %s, etcd %s%s)", self.config.workers, self.config.host, port,
                 self.root, etcd, f", nodes {name(0)}..{name(self.config.workers - 1)}" if self.config.etcd else "")
        try:
            while not self.stopping:
                now = time.monotonic()
                for child in ([self.etcd] if self.etcd else []) + self.children:
                    child.tend(now)
                time.sleep(0.1)
        finally:
            self._stop()
        return 0

    def _node_certificate(self, node_id: str) -> dict[str, str]:
        """A secured worker's peer-port settings: its node certificate and the workers' CA (made when missing); in a
        cluster on --etcd, none of its own: the machine's node certificate and the cluster's CA, as given."""
        if not self.config.secured or self.config.etcd:
            return {}
        from pigeon.ops import certs  # (secured workers' only: a single node's start does not import cryptography)

        pki = os.path.join(self.root, "pki")
        if not os.path.exists(os.path.join(pki, "ca.pem")):
            certs.make_ca(pki, "Pigeon workers CA")  # (private to this data directory)
        cert, key = os.path.join(pki, f"node-{node_id}.pem"), os.path.join(pki, f"node-{node_id}-key.pem")
        if not (os.path.exists(cert) and os.path.exists(key)):
            certs.issue(pki, f"node-{node_id}", hosts=sorted({self._host(), "127.0.0.1"}), node_id=node_id)
        return {"peer_cert": cert, "peer_key": key, "peer_ca": os.path.join(pki, "ca.pem")}

    def _host(self) -> str:
        return "127.0.0.1" if self.config.host in ("0.0.0.0", "::", "") else self.config.host

    def _advertised_host(self) -> str:
        """The host the workers are reached at: `--advertise`'s (other machines of the cluster dial it), else the
        bound one."""
        return self.config.advertise.rpartition(":")[0] if self.config.advertise else self._host()

    def _start_etcd(self, layout: dict) -> subprocess.Popen:
        client, peer = f"http://127.0.0.1:{layout['etcd_client']}", f"http://127.0.0.1:{layout['etcd_peer']}"
        cmd = [_etcd_binary(), "--name", "workers", "--data-dir", os.path.join(self.root, "etcd"),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"workers={peer}", "--initial-cluster-token", f"pigeon-workers-{peer}"]
        with open(os.path.join(self.root, "etcd.log"), "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_end_with_parent)

    def _stop(self) -> None:
        running = [w for w in self.workers if w is not None and w.poll() is None]
        for w in running:
            w.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + limits.worker_stop_s
        for w in running:
            try:
                w.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not stop in %.0f s: killed", w.pid, limits.worker_stop_s)
                w.kill()
                w.wait()
        etcd = self.etcd.proc if self.etcd else None
        if etcd is not None and etcd.poll() is None:
            etcd.send_signal(signal.SIGTERM)
            try:
                etcd.wait(10)
            except subprocess.TimeoutExpired:
                etcd.kill()
                etcd.wait()
