"""A node's readiness, and the gRPC services that report it: `grpc.health.v1.Health` (what Kubernetes' gRPC
probes, grpc_health_probe and load balancers call) and server reflection (grpcurl's `list` and `describe`).

Owns the rule: /readyz and the health service say the same thing, from one `Readiness.check()`. A node is ready
while it serves and is not stopping; a cluster node also needs its own readiness (joined under a live session,
etcd answering: ClusterNode.ready) and no drain mark (`pigeon cluster drain`: the operator is taking it out, so
load balancers should send new clients elsewhere, while it still answers the calls it gets). Every service the
port serves, and the overall service "", has the same status: all of them live or die with the node.

Both services answer without credentials on a secured node, as /healthz and /readyz do: a probe carries none,
and what reflection tells (the public Pub/Sub and pigeon.v1 protos) is no secret."""

from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pigeon.cluster import metadata as M
from pigeon.core import limits

log = logging.getLogger("pigeon.health")

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Readiness:
    """Whether this node should be sent new work, and why not. `cluster` is the ClusterNode, None when embedded."""

    def __init__(self, cluster=None, node_id: str = ""):
        self.cluster, self.node_id = cluster, node_id
        self.stopping = False  # set at SIGTERM: load balancers take the node out while it finishes its calls
        self.drained = False  # the node's drain mark, as last read from etcd (`follow`)

    def check(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "the node is stopping"
        if self.cluster is not None:
            ok, why = self.cluster.ready()
            if not ok:
                return ok, why
            if self.drained:
                return False, f"node {self.node_id} is drained (`pigeon cluster undrain {self.node_id}` ends it)"
        return True, ""

    async def read_drain_mark(self) -> None:
        """The drain marks as the node's watch keeps them (etcd is asked only while that watch is broken). While
        etcd cannot be reached the last answer stands (and `cluster.ready()` already says the node is not ready)."""
        if self.cluster is None:
            return
        try:
            drained = await asyncio.wait_for(self.cluster.membership.draining(), limits.placement_check_s)
        except (M.StoreUnavailable, asyncio.TimeoutError):
            return
        self.drained = self.node_id in drained


class _Health(health.aio.HealthServicer):
    """The library's servicer, with List (which it leaves unimplemented): every service's status at once."""

    async def List(self, request, context):
        return health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()})


class Probes:
    """The health and reflection services on one gRPC server, and the task that keeps health's statuses equal to
    `readiness.check()` (re-checked every second: a cluster node's readiness changes without telling anyone)."""

    def __init__(self, server: grpc.aio.Server, readiness: Readiness, handlers: list):
        self.readiness = readiness
        self.services = sorted({h.service_name() for h in handlers if hasattr(h, "service_name")})
        self.servicer = _Health()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        names = [*self.services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server, pool=_LazyPool(names))
        self._last: tuple[bool, str] | None = None
        self._task: asyncio.Task | None = None

    async def update(self) -> None:
        now = self.readiness.check()
        if now == self._last:
            return
        if self._last is not None:
            log.info("%s", "ready" if now[0] else f"not ready: {now[1]}")
        self._last = now
        for name in ("", *self.services):
            await self.servicer.set(name, SERVING if now[0] else NOT_SERVING)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="pigeon-health")

    async def _follow(self) -> None:
        failing = False
        while True:
            try:
                await self.readiness.read_drain_mark()
                failing = False
            except Exception:  # noqa: BLE001 — a frozen status would be worse: the last mark stands, next pass
                if not failing:  # (once a streak: every second would bury the log)
                    log.exception("reading this node's drain mark failed; the last one read stands")
                failing = True
            await self.update()
            await asyncio.sleep(limits.placement_check_s)

    async def stop(self) -> None:
        """NOT_SERVING for good: the node is going away (a Watch sees it before its stream ends)."""
        self.readiness.stopping = True
        if self._task is not None:
            self._task.cancel()
        await self.servicer.enter_graceful_shutdown()


class _LazyPool:
    """The descriptors reflection answers from, built at its first question (a server's start does not wait for
    them). The default pool cannot serve alone: the client library registers Pub/Sub's messages but not its
    services, so those come from the client library's own pubsub.proto compiled with protoc (the REST routes'
    compilation, done once per process); every other service served is in the default pool, with its imports."""

    def __init__(self, services: list[str]):
        self.services = services
        self._pool: descriptor_pool.DescriptorPool | None = None

    def __getattr__(self, name: str):
        if self._pool is None:
            self._pool = reflection_pool(self.services)
        return getattr(self._pool, name)


def reflection_pool(services: list[str]) -> descriptor_pool.DescriptorPool:
    from pigeon.api import rest_routes

    pool, added, default = descriptor_pool.DescriptorPool(), set(), descriptor_pool.Default()
    for f in rest_routes.compiled_protos().file:  # (in dependency order: --include_imports)
        pool.Add(f)
        added.add(f.name)

    def add(fd) -> None:  # a file of the default pool, after what it imports
        if fd.name in added:
            return
        for dep in fd.dependencies:
            add(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        pool.Add(proto)
        added.add(fd.name)

    for name in services:
        try:
            pool.FindServiceByName(name)
        except KeyError:
            try:
                add(default.FindServiceByName(name).file)
            except (KeyError, TypeError) as e:  # listed, not described: grpcurl says so for that service only
                log.warning("reflection cannot describe %s: %s", name, e)
    return pool
