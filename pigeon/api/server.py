"""Runs one node: the engine and the gRPC server (and a cluster node's peer server, with --peer-port) on one
event loop, until SIGTERM/SIGINT.

Shutdown order: GOAWAY to every connection and close the listeners, end open streams with UNAVAILABLE (clients
reconnect elsewhere or later) and refuse new work, let in-flight calls finish, write a checkpoint, close the WAL."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

import grpc

from pigeon.api import access, admin_api, health, monitoring_api, pigeon_api, queue_api, security, sli, takers
from pigeon.api.grpc_api import PubSubApi
from pigeon.core import hot, limits
from pigeon.node import recovery
from pigeon.node.engine import Engine
from pigeon.node.exports import ExportSupervisor
from pigeon.node.host import DataDirInUse
from pigeon.storage.formats import NewerFormat
from pigeon.ops import allocator, workers
from pigeon.ops.config import Config

log = logging.getLogger("pigeon.server")


async def serve(config: Config, ready: asyncio.Event | None = None) -> None:
    stop = asyncio.Event()  # SIGTERM/SIGINT from the first moment: during startup it means stop once started
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:  # (read before anything starts: files that cannot be served stop nothing but this)
        served = security.ServedCertificate(config) if config.tls_cert else None
    except (OSError, ValueError) as e:
        raise SystemExit(f"pigeon: cannot serve TLS with --tls-cert/--tls-key/--tls-client-ca: {e}")
    region = None
    if config.region:  # (its slot first: a region's shards are its data — docs/regions.md)
        from pigeon.node import regions
        from pigeon.node.disk import OsDisk

        try:
            region = await regions.resolve(config, OsDisk(), stop)
        except regions.RegionRefused as e:
            raise SystemExit(f"pigeon: {e}")
        if region is None:
            return
    engine = Engine(config, region=region)
    try:
        await engine.start()
    except (DataDirInUse, NewerFormat) as e:
        raise SystemExit(f"pigeon: {e}")
    except recovery.Unappliable as e:
        log.error("recovery stopped: %s", e.describe())
        raise SystemExit(f"pigeon: recovery stopped: {e.describe()}.\nNothing was deleted. `pigeon fsck "
                         f"{config.data_dir}` explains it; {e.repair_plan()}.")
    cluster = router = copier = None
    storage: list = []
    if config.etcd:  # a cluster node serves nothing before it has joined (docs/cluster.md)
        # (the cluster's modules are a cluster node's only: an embedded node starts, and restarts, without them)
        from pigeon.api import storage_api
        from pigeon.api.router import Router
        from pigeon.node.cluster_node import ClusterNode, JoinRefused

        try:
            cluster = ClusterNode(config, engine)
        except ValueError as e:  # the TLS files for etcd cannot be read
            await engine.stop()
            raise SystemExit(f"pigeon: {e}")
        try:
            joined = await cluster.join(stop)
        except JoinRefused as e:
            log.error("cannot join the cluster: %s", e)
            await engine.stop()
            raise SystemExit(f"pigeon: cannot join the cluster: {e}")
        if not joined:
            await engine.stop()
            return
        router = Router(engine, cluster)
        engine.publish_through(router.publish_at_owner)  # dead letters to a topic another node owns
        if cluster.gateways is not None:  # (a region's node: it copies what topics copy to its region)
            from pigeon.api.region_copies import Copier

            copier = Copier(engine, cluster.gateways, config)
        storage = storage_api.handlers(cluster.store, cluster.handovers)  # pigeon.v1.Storage (node to node)
    server = _grpc_server(reuse_port=config.reuse_port)
    api = PubSubApi(engine, router)
    exports = api.exports = ExportSupervisor(config, engine)  # export subscriptions' state, and (once started) runs
    handlers = api.handlers() + admin_api.handlers(engine) + queue_api.handlers(engine, router)
    handlers += pigeon_api.handlers(engine, router)  # pigeon.v1.Ranges (data pipelines), forwarded to owners
    handlers += monitoring_api.handlers(engine, cluster, router, exports)  # the console's figures
    guard = security.guard(config, engine) if config.secured else None
    requests = sli.Requests()  # every call's code and latency (outermost: the guard's refusals count too)
    peers = None
    if config.peer_port:
        taking = [_serve_handlers(server, sli.measured(requests, _guarded(guard, handlers, access.CLIENTS)))]
        peers = _peer_server(config, guard, handlers + storage, taking, requests)
    else:
        taking = [_serve_handlers(server, sli.measured(requests, _guarded(guard, handlers + storage,
                                                                          access.SHARED)))]
    readiness = health.Readiness(cluster, config.node_id)  # /readyz and grpc.health.v1 both answer from it
    probes = health.Probes(server, readiness, handlers + ([] if config.peer_port else storage))
    await probes.update()
    port = _listen(server, f"{config.host}:{config.port}",
                   served.grpc_credentials() if served is not None else None)
    local = security.local_socket(server) if config.secured else None  # the REST front's way in
    # What startup made (modules, protobuf descriptors, the recovered state) lives as long as the process:
    # freezing it keeps the collector's full passes, which pause the event loop, from walking it again.
    # (CPython's thresholds stay: a much larger youngest generation made fewer passes, each pausing the loop
    # longer, and consume and the latency tail worse.)
    gc.collect()
    gc.freeze()
    await server.start()
    if peers is not None:
        await peers.start()
    for t in taking:
        t.start()
    if cluster is not None:
        await cluster.listening()
    if copier is not None:
        copier.start()
    watch = asyncio.get_running_loop().create_task(security.watch(guard, engine, served, cluster), name="pigeon-security") \
        if guard is not None else None
    probes.start()
    exports.start(_export_endpoint(config, port))
    http = await _start_http(config, port, engine, cluster, readiness, guard, local, served, requests, copier)
    log.info("pigeon serving on %s:%d (data %s, fsync=%s%s%s)", config.host, port, config.data_dir, config.fsync,
             f", node {config.node_id} of cluster {cluster.cluster_id}" if cluster else "",
             security.describe(config))
    if not hot.COMPILED:
        log.warning("the compiled hot loops (pigeon.core._compiled) were not built where Pigeon was installed (no C "
                    "compiler?): delivery and acks run in pure Python, about a third slower")
    if peers is not None:
        log.info("node-to-node calls on %s:%d (%s)", config.peer_listen_host, config.peer_port,
                 "mutual TLS with node certificates" if config.secured else "plaintext")
    print(f"pigeon: listening on {config.host}:{port}", flush=True)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("shutting down")
    await probes.stop()  # not ready from now on: /readyz 503, health NOT_SERVING, while calls finish
    await exports.stop()  # (its queries end while the node still answers them)
    # GOAWAY first: stopping the servers closes their listeners and tells every connection to send no new calls.
    # A call that reaches a stopping server is dropped by gRPC as CANCELLED — which the client libraries take as
    # final for a StreamingPull — so open streams are ended (UNAVAILABLE, retried) only once their clients have
    # had the GOAWAY: their reopened streams then go to a new connection, are refused, and retry until a server
    # listens again.
    stopping = asyncio.gather(server.stop(grace=limits.shutdown_grace_s),
                              *([peers.stop(grace=limits.shutdown_grace_s)] if peers is not None else []))
    await asyncio.sleep(limits.shutdown_goaway_s)
    engine.refuse_calls()
    if router is not None:
        router.end_waiting()
    if http is not None:
        runner, rest_api, lag = http
        lag.stop()
        await runner.cleanup()
        await rest_api.close()
    await stopping
    for t in taking:
        await t.stop()
    if watch is not None:
        watch.cancel()
        guard.audit.close()
    if local is not None:
        local.close()
    if copier is not None:
        await copier.stop()
    if cluster is not None:
        await router.close()
        await cluster.leave()
    await engine.stop()
    log.info("stopped")


def _export_endpoint(config: Config, port: int) -> str:
    """Where the export job (and its Spark executors) reach this node: over loopback for a local master, else at
    the address clients use."""
    if not config.export_master.startswith("local") and config.advertise:
        return config.advertise
    host = config.host if config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    return f"{host}:{port}"


def _grpc_server(reuse_port: bool = False) -> grpc.aio.Server:
    """A gRPC server of ours. Its port is its own (a port taken is an error at start) but for a worker's client
    port, which the workers share (SO_REUSEPORT: the kernel spreads connections over them)."""
    return grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limits.grpc_receive_bytes_max),
            ("grpc.max_send_message_length", limits.grpc_receive_bytes_max),
            ("grpc.so_reuseport", int(reuse_port)),
            # a peer that vanished (killed, cut off) is found and its connection closed, freeing its streams
            ("grpc.keepalive_time_ms", int(limits.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(limits.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            # calls waiting for the loop to take them queue (limits.grpc_waiting_calls_soft says why)
            ("grpc.server.max_pending_requests", limits.grpc_waiting_calls_soft),
            ("grpc.server.max_pending_requests_hard_limit", limits.grpc_waiting_calls_max),
        ]
    )


def _serve_handlers(server: grpc.aio.Server, handlers: list) -> takers.Takers:
    """`handlers` on `server`, the hot methods among them taken several calls at a time (pigeon.api.takers)."""
    server.add_generic_rpc_handlers(handlers)
    return takers.Takers(server, limits.grpc_call_takers).register(handlers)


def _guarded(guard, handlers: list, listener: str) -> list:
    # with security off the handlers are served as they are: the embedded default's path is unchanged
    return guard.wrap(handlers, listener) if guard is not None else handlers


def _listen(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        port = server.add_secure_port(address, credentials) if credentials is not None else \
            server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise SystemExit(f"cannot listen on {address}")
    return port


def _peer_server(config: Config, guard, handlers: list, taking: list,
                 requests: sli.Requests) -> grpc.aio.Server:
    """The peer port: a second gRPC server, on the same event loop, for what nodes call on one another — calls
    forwarded to a bundle's owner, the monitoring pages' fan-out, and the storage service (ledger replication),
    which is served here only. Secured, it requires a node certificate the cluster's CA signed of every caller
    (mutual TLS), and the guard believes the principal a forwarded call carries only here; the client port then
    asks clients for no certificate (gRPC's server credentials can require one or not ask, nothing between), so
    a client may bring only a token.

    Why a server of its own rather than a second port on the client port's server, telling them apart by
    `context.auth_context()`: a servicer context says who is calling, not on which port, so on one server every
    service would be on both ports and the rule "a principal is believed only from a node on the peer port"
    could only be "… from a node certificate, on any port" — a client port under mutual TLS would then take node
    certificates and serve the storage service too. Two servers make the split structural: what the client
    port's server has no handler for (pigeon.v1.Storage) it cannot serve, its guard never believes a principal
    sent over TCP, and the peer port can be firewalled to the nodes' network without touching the clients'."""
    server = _grpc_server()
    taking.append(_serve_handlers(server, sli.measured(requests, _guarded(guard, handlers, access.PEERS))))
    _listen(server, f"{config.peer_listen_host}:{config.peer_port}",
            security.peer_server_credentials(config) if config.secured else None)
    return server


async def _start_http(config: Config, grpc_port: int, engine, cluster, readiness: health.Readiness, guard=None,
                      local=None, served=None, requests: sli.Requests | None = None, copier=None):
    """The HTTP port (pigeon.api.rest): REST, health. When it is only the default (the gRPC port + 1) and taken,
    the node serves gRPC without it, saying so. Secured, it speaks HTTPS and reaches the gRPC API through the
    unix socket (`local`), passing on the caller's credential (and its certificate's identity under mutual
    TLS)."""
    if config.http_port == 0:
        return None
    from pigeon.api import cluster_health, metrics, rest, rest_openapi, rest_routes

    # The routes are compiled from the protos (protoc, then every binding: ~0.4 s) once gRPC already serves, on
    # a thread: a restart's first calls do not wait for them, and the loop keeps answering meanwhile.
    await asyncio.to_thread(lambda: (rest_routes.routes(), rest_openapi.openapi()))
    gc.freeze()  # they live as long as the process, as startup's other objects (serve)
    port = config.http_port if config.http_port > 0 else grpc_port + 1
    target = local.target if local is not None else \
        f"{'127.0.0.1' if config.host in ('0.0.0.0', '::', '') else config.host}:{grpc_port}"
    lag = metrics.LoopLag()
    reg = metrics.registry(engine, cluster, lag, config.metrics_top, guard)
    if requests is not None:
        reg.register(requests)
    if cluster is not None:
        reg.register(cluster_health.ClusterHealth(cluster))
    if copier is not None:
        reg.register(copier)  # (the copies' lag: api.region_copies)
    api = rest.RestApi(target, ready=readiness.check,
                       metrics=lambda: metrics.render(reg), mtls=bool(config.tls_client_ca),
                       metrics_gate=security.metrics_gate(config, guard), requests=requests)
    try:
        runner = await rest.start(api, config.host, port, served.http_context() if served is not None else None,
                                  reuse_port=config.reuse_port, also=config.own_http_port)
    except OSError as e:
        await api.close()
        if config.http_port > 0:
            raise SystemExit(f"pigeon: cannot serve HTTP on {config.host}:{port}: {e}")
        log.warning("no HTTP port (REST, /metrics, health): %s:%d is taken (%s); --http-port chooses one",
                    config.host, port, e.strerror)
        return None
    lag.start()
    log.info("REST API, /metrics and health checks on %s://%s:%d/%s", "https" if config.tls_cert else "http",
             config.host, port, f" (this worker's own: port {config.own_http_port})" if config.own_http_port else "")
    return runner, api, lag


def _client_went_away(record: logging.LogRecord) -> bool:
    """gRPC logs a traceback at ERROR when a client disconnects while a response to it is being written (its
    cancellation races the failed write): that is a client leaving, which is normal, so it is kept at DEBUG."""
    if record.levelno >= logging.ERROR and record.getMessage().startswith("ExecuteBatchError raised in core"):
        record.levelno, record.levelname, record.exc_info, record.exc_text = logging.DEBUG, "DEBUG", None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
    return True


class JsonLines(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the exception when there is
    one — what log shippers parse without a pattern; a worker's lines also say which (`worker`)."""

    def __init__(self, worker: str = ""):
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        import datetime
        import json

        out = {"time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
            timespec="milliseconds").replace("+00:00", "Z"), "level": record.levelname, "logger": record.name,
            "message": record.getMessage()}
        if self.worker:
            out["worker"] = self.worker
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _bad_http(record: logging.LogRecord) -> bool:
    """aiohttp logs a request its parser refuses (a NUL in a header, a broken request line) at ERROR with a
    traceback; it answers 400 itself: a client's mistake, kept at DEBUG."""
    if record.levelno >= logging.ERROR and record.exc_info and \
            type(record.exc_info[1]).__name__ in ("BadHttpMessage", "BadStatusLine", "LineTooLong", "InvalidHeader",
                                                  "BadHttpMethod", "InvalidURLError"):
        record.levelno, record.levelname, record.exc_info, record.exc_text = logging.DEBUG, "DEBUG", None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
    return True


def run(config: Config) -> None:
    # a worker's lines share the supervisor's output with the other workers': each says whose it is
    worker = config.node_id if config.reuse_port else ""
    if config.log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonLines(worker))
        logging.basicConfig(level=config.log_level, handlers=[handler])
    else:
        logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s " +
                            (f"[{worker}] " if worker else "") + "%(name)s: %(message)s")
    logging.getLogger("grpc._cython.cygrpc").addFilter(_client_went_away)
    logging.getLogger("aiohttp.server").addFilter(_bad_http)
    if config.workers > 1:  # a supervisor: its workers are this command again, each a process of its own
        raise SystemExit(workers.Supervisor(config).run())
    why = workers.refuse_as_single(config.data_dir)
    if why is not None:
        raise SystemExit(f"pigeon: {why}")
    allocator.tune()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(config))
