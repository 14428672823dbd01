"""Calls taken from gRPC several at a time. grpc.aio asks gRPC for a server's next call of a method only once the
event loop has taken the one before: the call's arrival, its request, the new ask each wait for a turn of the loop,
about five turns per call. So the calls a server starts per second are capped by how long its loop's turns are,
however many wait in gRPC's queue and however idle the process otherwise is — a cluster owner replicating 100 KB
publishes started ~1,200 a second with its loop half idle, every request waiting ~20 ms in that queue for its
turn.

Owns the rule: the hot methods (`HOT`) are registered with gRPC, and `limits.grpc_call_takers` asks for each are
kept outstanding beside grpc.aio's own, so that many calls of one method are taken in one turn of the loop; a call
is served by the task that took it (a new one asks in its place), so its handling starts in the turn it arrives
in — a task of its own would start a turn of the loop later: on a busy cluster owner, a millisecond of every
publish. A call taken here is handled by grpc.aio's own code (the same method handler, so the same guard, errors
and limits as any other): only who asks differs. This leans on grpc.aio's internals (`grpc._cython.cygrpc`: `_request_registered_call`,
`_handle_rpc`, `_schedule_rpc_coro`, `_MethodResolver`) of the pinned grpcio; where they are not there, `register`
says so once and the server takes its calls as grpc.aio does."""

from __future__ import annotations

import asyncio
import logging

import grpc

from pigeon.core import limits
from pigeon.node import hops

log = logging.getLogger("pigeon.server")

# (service, method): the unary calls that come by the thousand a second — every publish, a pull client's pulls and
# acks — and the node-to-node forwards of them. (StreamingPull opens are taken as grpc.aio takes them: a stream is
# opened once and then carries its messages, and its flow control was measured and tested that way.)
HOT = (
    ("google.pubsub.v1.Publisher", "Publish"),
    ("google.pubsub.v1.Subscriber", "Pull"),
    ("google.pubsub.v1.Subscriber", "Acknowledge"),
    ("google.pubsub.v1.Subscriber", "ModifyAckDeadline"),
)

try:
    from grpc._cython import cygrpc

    _INTERNALS = all(hasattr(cygrpc, n) for n in ("_handle_rpc", "_schedule_rpc_coro", "_MethodResolver"))
except ImportError:  # pragma: no cover — a grpcio without its Cython core is not a grpcio
    _INTERNALS = False


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str):
        self.method, self.invocation_metadata = method, ()


def _resolve(handlers: list[grpc.GenericRpcHandler], method: str):
    """The method handler the generic handlers give `method` (its name alone decides: a guard checks each call
    inside the handler it returns)."""
    for h in handlers:
        found = h.service(_Details(method))
        if found is not None:
            return found
    return None


class Takers:
    """The extra asks of one server; `register` before the server starts, `start` after it has."""

    def __init__(self, server: grpc.aio.Server, takers: int):
        self.server, self.takers = server, takers
        self.methods: dict[str, object] = {}  # "/service/method" → its handler
        self.tasks: set[asyncio.Task] = set()  # the asks outstanding
        self._calls: set[asyncio.Task] = set()  # the calls taken here, until they end (the loop keeps weak refs)
        self.taken = 0

    def register(self, handlers: list[grpc.GenericRpcHandler]) -> "Takers":
        if self.takers <= 0:
            return self
        if not (_INTERNALS and hasattr(getattr(self.server, "_server", None), "_request_registered_call")):
            log.info("grpcio %s lacks the internals pigeon.api.takers uses: calls are taken one at a time",
                     grpc.__version__)
            return self
        by_service: dict[str, dict[str, object]] = {}
        for service, method in HOT:
            name = f"/{service}/{method}"
            h = _resolve(handlers, name)
            if h is not None:
                by_service.setdefault(service, {})[method] = h
                self.methods[name] = h
        for service, handlers_of in by_service.items():
            self.server.add_registered_method_handlers(service, handlers_of)
        return self

    def start(self) -> None:
        if not self.methods:
            return
        core = self.server._server
        loop = asyncio.get_running_loop()
        resolver = cygrpc._MethodResolver([], dict(self.methods))
        for name in self.methods:
            for _ in range(self.takers):
                self._ask(core, loop, resolver, name)

    def _ask(self, core, loop, resolver, name: str) -> None:
        t = loop.create_task(self._take(core, loop, resolver, name), name="pigeon-taker")
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _take(self, core, loop, resolver, name: str) -> None:
        """Ask for one call; serve it in this task, a new one asking for the next: the call's handling starts in the
        step it arrives in, not a turn of the loop later."""
        if not core.is_running():
            return
        try:
            state = await core._request_registered_call(name.encode())
        except Exception:  # noqa: BLE001 — the server is shutting down: gRPC fails the asks outstanding
            return
        self.taken += 1
        if hops.ON:
            hops.mark("arrived")
        self._ask(core, loop, resolver, name)
        self.tasks.discard(asyncio.current_task())  # (a call taken is not cancelled with the asks)
        self._calls.add(asyncio.current_task())
        try:
            await cygrpc._schedule_rpc_coro(cygrpc._handle_rpc(name, resolver, (), state, loop, False), state, loop,
                                            name)
        finally:
            self._calls.discard(asyncio.current_task())

    async def stop(self) -> None:
        """After the server stopped: the asks are gone with it; ends what is left of ours."""
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
