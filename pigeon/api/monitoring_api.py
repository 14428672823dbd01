"""The pigeon.v1.Monitoring gRPC service (pigeon/api/proto/pigeon_monitoring.proto): translation of
pigeon.node.monitoring's figures. In a cluster the node asked passes the request (marked `local`) to every
other node that owns bundles and merges the pages (see pigeon.node.monitoring for why that is the cluster's
page); a node that does not answer within limits.forward_s_max is left out of the answer, not waited for."""

from __future__ import annotations

import asyncio
import logging

import grpc

from pigeon.api import errors
from pigeon.api.errors import translate
from pigeon.api.proto import pigeon_monitoring_pb2 as m
from pigeon.cluster import metadata as M
from pigeon.core import limits, names
from pigeon.core.errors import InvalidArgument, Unavailable
from pigeon.node import monitoring
from pigeon.node.membership import status_of

log = logging.getLogger("pigeon.monitoring")
SERVICE = "pigeon.v1.Monitoring"


class MonitoringApi:
    def __init__(self, engine, cluster=None, router=None, exports=None):
        self.engine, self.cluster, self.router, self.exports = engine, cluster, router, exports

    @translate
    async def list_projects(self, req, context):
        return m.ListProjectsResponse(projects=monitoring.projects(self.engine)).SerializeToString()

    def _page(self, req) -> tuple[str, str, int]:
        names.project_of(req.project)
        size = req.page_size or limits.stats_page_size_default
        if not 0 < size <= limits.stats_page_size_max:
            raise InvalidArgument(f"page_size must be between 1 and {limits.stats_page_size_max} (got {size}).")
        return req.project, req.page_token, size

    async def _others(self, method: str, req, response_cls) -> list:
        """The answers of the other nodes that own bundles, asked for their own bundles only."""
        if self.cluster is None or req.local:
            return []
        me = self.cluster.info.dial
        addresses = sorted({a for a in self.cluster.routes.values() if a and a != me})
        local = type(req)()
        local.CopyFrom(req)
        local.local = True
        payload = local.SerializeToString()

        async def ask(address: str):
            call = self.router.channel(address).unary_unary(f"/{SERVICE}/{method}", request_serializer=None,
                                                             response_deserializer=response_cls.FromString)
            try:
                return await call(payload, timeout=limits.forward_s_max, metadata=self.router.peer_metadata())
            except grpc.aio.AioRpcError as e:
                log.info("monitoring: %s did not answer %s (%s); its bundles are left out", address, method,
                         e.code().name)
                return None

        return [r for r in await asyncio.gather(*(ask(a) for a in addresses)) if r is not None]

    def _node(self) -> str:
        return self.cluster.info.node_id if self.cluster is not None else ""

    async def _cluster_page(self, method: str, req, rows: list, response_cls, field: str) -> bytes:
        """This node's rows and the other nodes', as one page (the first `size` names of their union); the rows
        of one name (a spread topic's, or its subscription's: each owner speaks for its shards) added up."""
        _, _, size = self._page(req)
        for other in await self._others(method, req, response_cls):
            rows.extend(getattr(other, field))
        by_name: dict[str, object] = {}
        for r in rows:
            if r.name in by_name:
                _add(by_name[r.name], r)
            else:
                by_name[r.name] = r
        rows = sorted(by_name.values(), key=lambda r: r.name)[:size]
        token = rows[-1].name if len(rows) == size else ""
        return response_cls(**{field: rows}, next_page_token=token).SerializeToString()

    @translate
    async def list_topic_stats(self, req, context):
        project, after, size = self._page(req)
        node = self._node()
        rows = [m.TopicStats(name=t.name, publish_requests=t.publish_requests, messages=t.messages, bytes=t.bytes,
                             subscriptions=t.subscriptions, node=node)
                for t in monitoring.topics(self.engine, project, after, size)]
        return await self._cluster_page("ListTopicStats", req, rows, m.ListTopicStatsResponse, "topics")

    @translate
    async def list_subscription_stats(self, req, context):
        project, after, size = self._page(req)
        node = self._node()
        rows = []
        for f in monitoring.subscriptions(self.engine, project, after, size):
            s = f.stats
            rows.append(m.SubscriptionStats(
                name=s.name, topic=f.topic, num_undelivered_messages=s.undelivered,
                num_outstanding_messages=s.outstanding, num_parked_messages=s.parked,
                oldest_unacked_message_age_seconds=s.oldest_unacked_age_s, sent_messages=s.delivered,
                acked_messages=s.acked, expired_ack_deadlines=s.expired, dead_lettered_messages=s.dead_lettered,
                node=node, dead_letter_topic=f.dead_letter_topic))
            if self.exports is not None:  # an export's lag is its backlog and oldest unacked age
                rows[-1].export, rows[-1].export_state = self.exports.describe(self.engine.state.subs[s.name].config)
        return await self._cluster_page("ListSubscriptionStats", req, rows, m.ListSubscriptionStatsResponse,
                                        "subscriptions")

    @translate
    async def get_cluster_status(self, req, context):
        if self.cluster is None:
            return m.ClusterStatus(clustered=False, bundles=self.engine.config.bundles, answered_by="",
                                   ledgers=m.LedgerSummary()).SerializeToString()
        try:
            st = await status_of(self.cluster.meta)
        except M.StoreUnavailable as e:
            raise Unavailable(f"The cluster's status is kept in etcd, which cannot be reached: {e}") from None
        lg = st["ledgers"]
        g = self.cluster.gateways
        return m.ClusterStatus(
            clustered=True, cluster_id=st["cluster"], bundles=st["bundles"], unowned=st["unowned"],
            nodes=[m.ClusterNode(node=r["node"], address=r["address"], zone=r["zone"], state=r["state"],
                                 bundles=r["bundles"]) for r in st["nodes"]],
            owners={int(b): n for b, n in st["owners"].items()},
            ledgers=m.LedgerSummary(total=lg["total"], open=lg["open"], under_replicated=lg["under_replicated"]),
            answered_by=self.cluster.info.node_id, region=g.region.name if g is not None else "",
            regions=[] if g is None else [
                m.RegionView(region=name, slot=slot, gateways=g.known.get(slot, []),
                             round_trip_ms=1000 * g.round_trips.get(slot, 0.0), lost=slot in g.lost)
                for slot, name in sorted(g.names.items())]
        ).SerializeToString()


_LATEST = {"subscriptions", "oldest_unacked_message_age_seconds"}  # of several owners' rows: the largest
_SAME = {"name", "topic", "dead_letter_topic", "export", "export_state"}  # the same in every owner's row


def _add(into, row) -> None:
    """Add one owner's figures of a name to another's (a count sums; an age or the subscription count is the
    largest; the owners are listed)."""
    for f in row.DESCRIPTOR.fields:
        name = f.name
        if name == "node":
            into.node = ",".join(sorted(filter(None, {*into.node.split(","), row.node})))
        elif name in _LATEST:
            setattr(into, name, max(getattr(into, name), getattr(row, name)))
        elif name not in _SAME:
            setattr(into, name, getattr(into, name) + getattr(row, name))


def handlers(engine, cluster=None, router=None, exports=None) -> list[grpc.GenericRpcHandler]:
    api = MonitoringApi(engine, cluster, router, exports)
    return [grpc.method_handlers_generic_handler(SERVICE, {
        "ListProjects": errors.unary(api.list_projects, m.ListProjectsRequest),
        "ListTopicStats": errors.unary(api.list_topic_stats, m.ListStatsRequest),
        "ListSubscriptionStats": errors.unary(api.list_subscription_stats, m.ListStatsRequest),
        "GetClusterStatus": errors.unary(api.get_cluster_status, m.GetClusterStatusRequest),
    })]
