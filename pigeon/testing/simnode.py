"""A node of the cluster simulator (testing.simcluster): the real executor and cluster node of one process, on the
simulated disk, journals, network and metadata store, with a skewed wall clock; started, crashed (kill -9: its
tasks end, the disk keeps what was synced) and started again on its disk. Its tasks are registered by the
simulator's task factory under the node's current life (`Incarnation`), so a crash ends exactly them."""

from __future__ import annotations

import asyncio
import contextvars

from pigeon.node import push_tokens
from pigeon.node.cluster_node import ClusterNode
from pigeon.node.engine import Engine
from pigeon.ops.config import Config
from pigeon.testing.simdisk import SimDisk
from pigeon.testing.simjournal import SimJournalWriter
from pigeon.testing.simloop import sleep
from pigeon.testing.simnet import SimMeta, SimStorageClient

BUNDLES = 4
SHARDS = 2  # a topic's shards (spread topics: each in a bundle of its own)
WALL0 = 1_800_000_000.0  # the nodes' wall clocks start here (plus their skew)
SESSION_TTL_S = 3
LOAD_BALANCE_S = 15  # the load planner's period (virtual seconds): it moves bundles a few times a seed
LOG_SNAPSHOT_S = 30  # a quiet log moves to a new ledger this often (the journals drop what it kept)
CHECKPOINT_S = 15  # a node's checkpoints at most this far apart (its journal drops what the older of two covers)

_TASKS_PRUNE_MIN = 64  # a life's task registry drops its ended tasks when it grew by this many (or doubled)

NODE: contextvars.ContextVar = contextvars.ContextVar("pigeon_sim_node", default=None)


class NodeClock:
    """A node's wall clock: virtual time, skewed (made on the loop it reads: the node's code asks it the time at
    every append and delivery)."""

    def __init__(self, skew: float):
        self.skew = skew
        self._loop = asyncio.get_running_loop()

    def now(self) -> float:
        return WALL0 + self._loop.time() + self.skew


class _Lock:
    def close(self) -> None:
        pass


class SimHost:
    """node.host.OsHost's calls on the simulated machine of one node."""

    def __init__(self, sim, node: "SimNode"):  # sim: testing.simcluster.ClusterSim
        self.sim, self.node = sim, node
        self.disk = self.cold_disk = node.disk

    def lock_data_dir(self, data_dir: str):
        return _Lock()

    def journal(self, directory: str, policy, segment_bytes: int, disk=None):
        # segments of 4 KB: a run writes some 100 KB, and the check that journals drop what no log keeps needs several
        w = SimJournalWriter(directory, policy, min(segment_bytes, 1 << 12), disk or self.disk, self.sim.sync_s)
        self.node.writers.append(w)
        return w

    def cpu_time(self) -> float:
        # a core all the time, on virtual time: the loads the planner sees are shares of it by appends, the
        # same on every replay of a seed
        return asyncio.get_running_loop().time()

    def storage_client(self, address: str, config):
        return SimStorageClient(self.sim.net, self.node.id, address)

    async def refuses(self, address: str, timeout: float) -> bool:
        net = self.sim.net
        dst = net.by_address.get(address)
        if dst is None:
            return True
        if not net.reachable(self.node.id, dst):
            await sleep(timeout)
            return False
        await sleep(net.delay())
        return net.refuses(dst)


class Incarnation:
    """One life of a node's process: its tasks (cancelled when it crashes) and its objects."""

    def __init__(self, node: "SimNode"):
        self.node = node
        self.tasks: dict[asyncio.Task, None] = {}  # in the order they were made, the ones done among them too
        self.prune_at = _TASKS_PRUNE_MIN
        self.dead = False
        self.context = contextvars.copy_context()
        self.context.run(NODE.set, self)

    def add(self, task: asyncio.Task) -> None:
        """Register a task of this life. Those that ended are dropped now and then, not by a done callback each:
        that was a callback of the loop for every task, some tenth of a run's."""
        self.tasks[task] = None
        if len(self.tasks) >= self.prune_at:
            self.prune()

    def prune(self) -> None:
        self.tasks = {t: None for t in self.tasks if not t.done()}
        self.prune_at = 2 * len(self.tasks) + _TASKS_PRUNE_MIN


class SimNode:
    def __init__(self, sim, node_id: str, skew: float):  # sim: testing.simcluster.ClusterSim
        self.sim, self.id, self.skew = sim, node_id, skew
        self.address = f"{node_id}.sim:1"
        # (its files leave the page cache once synced, as a member's ledgers do: every read of a ledger that must
        # not wait for the disk finds its bytes cold first)
        self.disk = SimDisk(cache_pages=True, evict_synced=True)
        self.writers: list[SimJournalWriter] = []
        self.life: Incarnation | None = None
        self.engine: Engine | None = None
        self.cluster: ClusterNode | None = None
        self.ready = False

    @property
    def store(self):
        return self.cluster.store

    @property
    def up(self) -> bool:
        return self.life is not None and not self.life.dead

    def config(self) -> Config:
        return Config(data_dir=f"/{self.id}", etcd="sim:2379", node_id=self.id, advertise=self.address,
                      append_port=-1, session_ttl_s=SESSION_TTL_S, bundles=BUNDLES, shards_per_topic=SHARDS,
                      topic_layout="spread" if self.sim.spread else "together",
                      log_snapshot_entries=self.sim.snapshot_entries, log_snapshot_s=LOG_SNAPSHOT_S,
                      load_balance_s=LOAD_BALANCE_S, checkpoint_interval_s=CHECKPOINT_S)

    def start(self) -> None:
        net = self.sim.net
        net.generation[self.id] = net.generation.get(self.id, 0) + 1
        net.down.discard(self.id)
        net.by_address[self.address] = self.id
        net.nodes[self.id] = self
        self.writers = []
        self.ready = False
        self.life = Incarnation(self)
        self.spawn(self._start())

    def spawn(self, coro) -> asyncio.Task:
        """A task of this node's process (ends when it crashes)."""
        return asyncio.get_running_loop().create_task(coro, context=self.life.context.copy())

    async def _start(self) -> None:
        config = self.config()
        self.engine = Engine(config, NodeClock(self.skew), SimHost(self.sim, self))
        await self.engine.start()
        self.cluster = ClusterNode(config, self.engine, meta=SimMeta(self.sim.net, self.sim.meta, self.id))
        stop = asyncio.Event()
        if not await self.cluster.join(stop):
            return
        self.engine.publish_through(lambda topic, request: self.sim.publish_at_owner(self, topic, request))
        await self.cluster.listening()
        self.ready = True

    def crash(self) -> None:
        """kill -9: its tasks end, nothing more is written, the disk keeps only what was synced."""
        life = self.life
        life.dead = True
        self.ready = False
        self.sim.net.down.add(self.id)
        for w in self.writers:
            w.crash()
        for t in list(life.tasks):
            t.cancel()
        self.disk.crash(self.sim.rng, torn=self.sim.rng.random() < 0.5)
        self.process_gone()

    def process_gone(self) -> None:
        """What the node's process holds in module state goes with it (the simulator's process is every node's):
        its push signer, in node.push_tokens' process-wide list of published keys. Left there, the list grew by a
        signer at every start of every seed a worker ran — some 100 MB and a linear look-up per start after
        5,000 seeds — and a seed ran on the state of the seeds before it."""
        if self.engine is not None:
            push_tokens.withdraw(self.engine.push.signer)

    async def call(self, fn):
        """Run `fn()` (a coroutine function of this node's API) as this node's work; a crash meanwhile fails it."""
        if not self.up or not self.ready:
            raise _Refused(f"{self.id} is down")
        task = self.spawn(fn())
        try:
            return await task
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
            raise _Refused(f"{self.id} crashed during the call") from None


class _Refused(Exception):
    pass
